"""A reusable fixture that starts a real local fleet (separate processes on loopback ports).

    from tests.fleet_fixture import fleet_fixture
    fleet = fleet_fixture(scope="module", replicas={"denoiser": 2})   # a pytest fixture

    def test_x(fleet):                      # fleet: a started fleet.launcher.LocalFleet
        with FleetClient(fleet.target) as c: ...
        pool_describe(fleet.pools["denoiser"][0].target).resident_buffers

Start the fleet once per module (every pool imports torch; a fleet takes ~10-20 s on 2 cores).
Helpers wait on conditions with deadlines — never fixed sleeps. When a test fails, the tail of
every process log is printed (pytest shows it with the failure).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import grpc
import pytest

from fastvideo3.v1 import pool_pb2, pool_pb2_grpc
from fleet.launcher import LocalFleet

START_TIMEOUT_S = 240.0


def start_fleet(log_dir, **kw: Any) -> LocalFleet:
    """Start a fleet (see LocalFleet's arguments) and wait until every process is SERVING."""
    timeout_s = kw.pop("timeout_s", START_TIMEOUT_S)
    return LocalFleet(log_dir=log_dir, **kw).start(timeout_s=timeout_s)


def fleet_fixture(scope: str = "module", **kw: Any):
    """A pytest fixture yielding a started :class:`LocalFleet`; it is stopped afterwards."""

    @pytest.fixture(scope=scope)
    def _fleet(tmp_path_factory):
        with running(LocalFleet(log_dir=tmp_path_factory.mktemp("fleet-logs"), **kw)) as fleet:
            yield fleet

    return _fleet


def traced_fleet_fixtures(traced_pools: tuple[str, ...], trace_scheduler: bool, **kw: Any):
    """Module fixtures ``(trace_file, fleet)``: a started fleet whose ``traced_pools`` (and, with
    ``trace_scheduler``, its scheduler) write spans to ``trace_file``. Bind both names as returned."""

    @pytest.fixture(scope="module")
    def trace_file(tmp_path_factory):
        return tmp_path_factory.mktemp("traces") / "spans.jsonl"

    @pytest.fixture(scope="module")
    def fleet(trace_file, tmp_path_factory):
        args = ["--trace-file", str(trace_file)]
        f = LocalFleet(scheduler_args=list(args) if trace_scheduler else [],
                       pool_args={r: list(args) for r in traced_pools},
                       log_dir=tmp_path_factory.mktemp("logs"), **kw)
        f.start(timeout_s=START_TIMEOUT_S)
        yield f
        f.stop()

    return trace_file, fleet


@contextlib.contextmanager
def started(fleet: LocalFleet, timeout_s: float = START_TIMEOUT_S, report_exits: bool = False):
    """Start ``fleet`` and stop it after the block; logs are printed when anything fails (and,
    with ``report_exits``, when a process exits with an error)."""
    try:
        fleet.start(timeout_s=timeout_s)
        yield fleet
    except BaseException:
        dump_logs(fleet)
        raise
    finally:
        codes = fleet.stop()
        bad = {k: v for k, v in codes.items() if v not in (0, None)} if report_exits else {}
        if bad:
            dump_logs(fleet)
            print(f"fleet processes exited with {bad}")


def running(fleet: LocalFleet, timeout_s: float = START_TIMEOUT_S):
    """Start ``fleet`` and stop it after the block; logs are printed when anything fails or a
    process exits with an error."""
    return started(fleet, timeout_s, report_exits=True)


def dump_logs(fleet: LocalFleet, lines: int = 30) -> None:
    for p in fleet.processes():
        print(f"----- {p.name} ({p.target}) health={p.statuses()} -----\n{p.log_tail(lines)}")


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str, interval_s: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned), or fail after the deadline."""
    end = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what} (last: {value!r})")
        time.sleep(interval_s)


_stubs: dict[str, pool_pb2_grpc.RolePoolStub] = {}


def pool_stub(target: str) -> pool_pb2_grpc.RolePoolStub:
    if target not in _stubs:
        _stubs[target] = pool_pb2_grpc.RolePoolStub(grpc.insecure_channel(target))
    return _stubs[target]


def health(target: str, timeout_s: float = 2.0, channel: Any = None) -> str:
    """One grpc.health.v1 Check of ``target``: "SERVING", "NOT_SERVING", ... or "ERROR:<code>"."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    ch = channel or grpc.insecure_channel(target)
    try:
        r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    except grpc.RpcError as err:
        return f"ERROR:{err.code().name}"
    finally:
        if channel is None:
            ch.close()


def went_not_serving(fp) -> bool:
    """``fp`` reported NOT_SERVING after having served: seen by the launcher's watch stream, or
    answered to a direct Check (the watch stream may lag on a loaded machine)."""
    seen = fp.statuses()
    after = seen[seen.index("SERVING") + 1:] if "SERVING" in seen else []
    return "NOT_SERVING" in after or health(fp.target) == "NOT_SERVING"


def pool_describe(target: str, timeout_s: float = 10.0) -> pool_pb2.PoolDescription:
    """A pool replica's Describe reply (resident_buffers, cache_stats, counters, ...)."""
    return pool_stub(target).Describe(pool_pb2.DescribePoolRequest(), timeout=timeout_s)


def resident_total(fleet: LocalFleet, role: str | None = None) -> int:
    """Resident buffers + regions over every replica (of one role, or all)."""
    roles = [role] if role else list(fleet.pools)
    return sum(pool_describe(p.target).resident_buffers for r in roles for p in fleet.pools[r])


def generate_concurrently(target: str, requests: list[dict], timeout_s: float = 300.0) -> list:
    """Run ``requests`` (FleetClient.generate keyword arguments, ``prompt`` among them, npy
    output) at once, one client and thread each; their results in order. Fails on any error."""
    from fastvideo3.client import FleetClient
    results: list = [None] * len(requests)
    errors: list = []

    def one(i: int) -> None:
        try:
            with FleetClient(target, timeout_s=timeout_s) as c:
                r = dict(requests[i])
                results[i] = c.generate(r.pop("prompt"), output_format="npy", **r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    assert not errors, errors
    assert all(r is not None for r in results)
    return results
