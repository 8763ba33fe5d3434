"""Fleets shared by the reliability suite.

``real_fleet`` (session): the tiny seeded Wan model in real pool processes — encoder, two
denoisers, decoder — and two schedulers:

* the main one (``fleet.target``): checkpoints every step to a real redis-server, step batching
  off (so outputs are bit-identical across interleavings), encoder->denoiser over the gRPC
  transport (so a transfer can stall), health checked every 0.5 s;
* ``fleet.one``: step batching on, routing to denoiser-0 only (so concurrent requests share
  batches), state in memory.

The pools carry test-only faults, each armed for one request id (services/common/faults.py):
denoisers ``nan:nan-victim@2``, ``oom:oom-victim@1``, ``raise:raise-victim@2``, and
``stall:decode-victim@3`` / ``stall:latents-lost@3`` (the decoder's fetch of its final latents, over the gRPC edge
denoiser->decoder, takes 3 s: a decode certainly in flight); encoder
``corrupt:xfer-corrupt``, ``drop:xfer-drop``, ``stall:xfer-stall@8``. Denoisers pull inputs
with a 3 s deadline.
"""
from __future__ import annotations

import pytest

from tests.fleet_fixture import started
from tests.redis_server import redis_process_fixture
from tests.reliability.helpers import BUDGETS

REAL_CARD = "wan-tiny-seeded"
REAL_NAMESPACE = "rel-real"
FETCH_TIMEOUT_S = 3.0
STALL_S = 8
DECODE_STALL_S = 3
DENOISER_FAULTS = ["nan:nan-victim@2", "oom:oom-victim@1", "raise:raise-victim@2",
                   f"stall:decode-victim@{DECODE_STALL_S}", f"stall:latents-lost@{DECODE_STALL_S}"]
ENCODER_FAULTS = ["corrupt:xfer-corrupt", "drop:xfer-drop", f"stall:xfer-stall@{STALL_S}"]


real_redis = redis_process_fixture("session")


@pytest.fixture(scope="session")
def real_fleet(real_redis, tmp_path_factory):
    from fleet.launcher import LocalFleet
    denoiser_args = ["--fetch-timeout", str(FETCH_TIMEOUT_S)]
    for f in DENOISER_FAULTS:
        denoiser_args += ["--inject-fault", f]
    encoder_args = [a for f in ENCODER_FAULTS for a in ("--inject-fault", f)]
    sched_args = ["--state-store", real_redis.url, "--state-namespace", REAL_NAMESPACE, "--state-ttl", "120",
                  "--checkpoint-every", "1", "--no-batching", "--edge-transport", "encoder->denoiser=grpc",
                  "--edge-transport", "denoiser->decoder=grpc",
                  "--health-interval", "0.5",
                  "--health-timeout", "0.5", *BUDGETS]
    fleet = LocalFleet(REAL_CARD, roles=("encoder", "denoiser", "decoder"), replicas={"denoiser": 2},
                       scheduler_args=sched_args, pool_args={"denoiser": denoiser_args, "encoder": encoder_args},
                       log_dir=tmp_path_factory.mktemp("real-fleet-logs"))
    with started(fleet):
        d0 = fleet.pools["denoiser"][0].target
        fleet.one = fleet.add_scheduler(["--pools", f"denoiser={d0}", "--health-interval", "0.5",
                                         "--health-timeout", "0.5", *BUDGETS], name="scheduler-one")
        fleet.redis = real_redis
        fleet.namespace = REAL_NAMESPACE
        yield fleet


def pool_targets(fleet) -> list[str]:
    return [p.target for procs in fleet.pools.values() for p in procs]


@pytest.fixture
def balanced(real_fleet):
    """After the test: every pool released everything, and no state-store key is orphaned."""
    yield real_fleet
    from tests.reliability.helpers import assert_pools_balanced, store_leftovers
    from tests.fleet_fixture import wait_until
    assert_pools_balanced(pool_targets(real_fleet), timeout_s=STALL_S + 15)
    wait_until(lambda: not store_leftovers(real_fleet.redis.url, REAL_NAMESPACE), 10,
               "no orphaned state-store keys")
