"""The core scheduler as the fleet drives it, with no-op executors (no processes, no math):
sticky least-loaded placement over replicas, cross-request batching, inline artifacts,
programs with a reward loop, and no units after a cancel."""
from __future__ import annotations

import pytest

from fastvideo3.card import get_card
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.scheduling.scheduler import CoreScheduler
from services.common.fake import FakeExecutor

pytestmark = pytest.mark.timeout(60)
CARD = get_card("wan-tiny")
REWARD_PROGRAM = ("text_encode", "diffusion_denoise", "vae_decode", "reward_score")


class _Recording(FakeExecutor):
    def __init__(self, role, name):
        super().__init__(role, CARD, transport=None)
        self.name = name
        self.seen: list[tuple[str, int | None]] = []

    def execute(self, batch):
        self.seen += [(u.request_id, u.step) for u in batch]
        return super().execute(batch)


def _fleet(denoisers=2, **kw):
    ex = {"encoder": [_Recording("encoder", "e0")],
          "denoiser": [_Recording("denoiser", f"d{i}") for i in range(denoisers)],
          "decoder": [_Recording("decoder", "v0")], "reward": [_Recording("reward", "w0")]}
    return ex, CoreScheduler(ex, **kw)


def _req(i, steps=4, **kw):
    return resolve(GenerateRequest(prompt=f"p{i}", request_id=f"r{i}", num_inference_steps=steps, num_frames=9,
                                   height=64, width=64, **kw), CARD)


def _drain(sched, limit=200):
    for _ in range(limit):
        if not sched.active():
            return
        sched.tick()
    raise AssertionError("requests did not finish")


def test_requests_stick_to_one_denoiser_replica_and_spread_over_replicas():
    ex, sched = _fleet()
    runs = [sched.submit(_req(i), CARD, ctx={"encode": "npy"}) for i in range(4)]
    _drain(sched)
    assert all(r.status == "SUCCEEDED" for r in runs)
    owner = {}
    for d in ex["denoiser"]:
        for rid, _ in d.seen:
            assert owner.setdefault(rid, d.name) == d.name, f"{rid} moved between replicas"
    per = {d.name: len({rid for rid, _ in d.seen}) for d in ex["denoiser"]}
    assert per == {"d0": 2, "d1": 2}
    assert sched.counters["diffusion_step.multi_request_batches"] > 0
    assert all(r.artifacts["vae_decode"].startswith(b"\x93NUMPY") for r in runs)
    assert all(r.placement == {"encoder": 0, "denoiser": r.placement["denoiser"], "decoder": 0} for r in runs)


def test_max_batch_one_sends_single_units():
    ex, sched = _fleet(denoisers=1, max_batch=1)
    for i in range(3):
        sched.submit(_req(i), CARD)
    _drain(sched)
    assert sched.counters["diffusion_step.max_batch_units"] == 1
    assert sched.counters["diffusion_step.batches"] == 12


def test_a_program_with_rewards_runs_the_reward_loop():
    ex, sched = _fleet(denoisers=1)
    run = sched.submit(_req(0, steps=2), CARD, program=REWARD_PROGRAM,
                       ctx={"rewards": ["image_quality"]})
    _drain(sched)
    assert run.status == "SUCCEEDED"
    assert run.ctx.payloads["reward_score"]["scores"] == {"image_quality": 0.0}
    assert ex["reward"][0].seen == [("r0", None)]


def test_no_unit_is_issued_after_a_cancel_is_acknowledged():
    ex, sched = _fleet(denoisers=1)
    run = sched.submit(_req(0, steps=50), CARD)
    for _ in range(4):
        sched.tick()
    sched.cancel("r0")
    before = len(ex["denoiser"][0].seen)
    _drain(sched)
    assert run.status == "CANCELLED" and len(ex["denoiser"][0].seen) == before
    assert ex["denoiser"][0].regions == {}  # released on cancel


def test_a_role_without_a_pool_fails_the_request_not_the_scheduler():
    ex, sched = _fleet(denoisers=1)
    ex.pop("reward")
    run = sched.submit(_req(0, steps=1), CARD, program=REWARD_PROGRAM,
                       ctx={"rewards": ["image_quality"]})
    _drain(sched)
    assert run.status == "FAILED" and run.error.code == "UNAVAILABLE" and run.error.field == "role"


# -- the scheduler service's config and per-edge transport choice (pure, no processes) ---------
def _caps(host, backends=("shm", "grpc"), pid="p"):
    from fastvideo3.transport.base import TransportCaps
    return TransportCaps(tuple(backends), host, f"{host}-{pid}")


def test_fleet_yaml_and_flags_build_one_config(tmp_path):
    from services.scheduler.config import parse_args
    f = tmp_path / "fleet.yaml"
    f.write_text("card: wan-tiny\nport: 6000\npools: {encoder: [h:1], denoiser: [h:2, h:3], decoder: h:4}\n"
                 "transport: {default: grpc, edges: {'denoiser->decoder': shm}}\nscheduler: {max_running: 3}\n")
    cfg = parse_args(["--config", str(f), "--pools", "reward=h:5", "--no-batching", "--port", "7000"])
    assert cfg.port == 7000 and cfg.pools["denoiser"] == ("h:2", "h:3") and cfg.pools["reward"] == ("h:5",)
    assert cfg.max_running == 3 and not cfg.batching
    assert cfg.edge_backend("denoiser", "decoder") == "shm" and cfg.edge_backend("encoder", "denoiser") == "grpc"


@pytest.mark.parametrize("argv,field", [
    (["--pools", "encoder=h:1", "--pools", "denoiser=h:2"], "pools"),
    (["--pools", "painter=h:1"], "pools"),
    (["--pools", "encoder=h", "--pools", "denoiser=h:2", "--pools", "decoder=h:3"], "pools.encoder"),
    (["--pools", "encoder=h:1", "--pools", "denoiser=h:2", "--pools", "decoder=h:3", "--edge-transport", "a->b=shm"],
     "edge_transport"),
])
def test_bad_scheduler_config_names_the_field(argv, field):
    from fastvideo3.errors import InvalidRequest
    from services.scheduler.config import parse_args
    with pytest.raises(InvalidRequest) as e:
        parse_args(argv)
    assert e.value.field == field


def test_auto_picks_shm_on_one_host_grpc_across_hosts_and_inline_without_a_consumer():
    from services.scheduler.config import parse_args
    from services.scheduler.topology import choose_edges, output_transport
    cfg = parse_args(["--pools", "encoder=a:1", "--pools", "denoiser=a:2,b:3", "--pools", "decoder=a:4"])
    caps = {"encoder": [_caps("a")], "denoiser": [_caps("a"), _caps("b")], "decoder": [_caps("a")]}
    edges = choose_edges(cfg, caps)
    assert edges == {"encoder->denoiser": "grpc", "denoiser->decoder": "grpc", "decoder->reward": "inline"}
    one_host = {r: [_caps("a")] for r in caps}
    assert choose_edges(cfg, one_host)["encoder->denoiser"] == "shm"
    assert output_transport(edges, "decoder") == "" and output_transport(edges, "encoder") == "grpc"


def test_a_configured_backend_that_cannot_connect_fails_naming_the_edge():
    from fastvideo3.errors import FailedPrecondition
    from services.scheduler.config import parse_args
    from services.scheduler.topology import choose_edges
    cfg = parse_args(["--pools", "encoder=a:1", "--pools", "denoiser=b:2", "--pools", "decoder=b:3",
                      "--edge-transport", "encoder->denoiser=shm"])
    caps = {"encoder": [_caps("a")], "denoiser": [_caps("b")], "decoder": [_caps("b")]}
    with pytest.raises(FailedPrecondition) as e:
        choose_edges(cfg, caps)
    assert e.value.field == "transport.encoder->denoiser"
    nixl = parse_args(["--pools", "encoder=a:1", "--pools", "denoiser=a:2", "--pools", "decoder=a:3",
                       "--transport", "nixl"])
    with pytest.raises(FailedPrecondition):
        choose_edges(nixl, {r: [_caps("a")] for r in ("encoder", "denoiser", "decoder")})


def test_auto_picks_cuda_ipc_between_gpu_pools_on_one_host_and_nixl_across_hosts():
    from services.scheduler.config import parse_args
    from services.scheduler.topology import choose_edges
    gpu = ("cuda_ipc", "nixl", "shm", "grpc")
    cfg = parse_args(["--pools", "encoder=a:1", "--pools", "denoiser=a:2", "--pools", "decoder=b:3"])
    caps = {"encoder": [_caps("a", gpu)], "denoiser": [_caps("a", gpu)], "decoder": [_caps("b", gpu)]}
    edges = choose_edges(cfg, caps)
    assert edges["encoder->denoiser"] == "cuda_ipc" and edges["denoiser->decoder"] == "nixl"
    caps["decoder"] = [_caps("a")]  # a host decoder on the GPU pools' host: shared memory
    assert choose_edges(cfg, caps)["denoiser->decoder"] == "shm"
    caps["decoder"] = [_caps("b")]  # a host decoder elsewhere without NIXL: gRPC bytes
    assert choose_edges(cfg, caps)["denoiser->decoder"] == "grpc"


def test_pool_auto_backends_follow_the_device():
    from fastvideo3.transport import available_backends
    from services.common.transport_set import parse_backends
    assert parse_backends("auto", "cpu") == ("shm", "grpc")
    gpu = parse_backends("auto", "cuda:0")
    assert gpu[-2:] == ("shm", "grpc")
    assert ("cuda_ipc" in gpu) == ("cuda_ipc" in available_backends())
    assert ("nixl" in gpu) == ("nixl" in available_backends())
    assert parse_backends("shm,nixl", "cpu") == ("shm", "nixl")
