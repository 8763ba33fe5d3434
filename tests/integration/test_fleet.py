"""The fleet end to end: real pool and scheduler processes on loopback, started once per module.

Two denoiser replicas; schedulers share the same pools: the default one (step batching on),
one started with ``--no-batching`` and one in batch-invariant mode. Outputs are compared with the
embedded engine (same seeds and options): within 1e-3 with batching, bit-identical without; in
batch-invariant mode a request alone and beside batch-mates is bit-identical.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from fastvideo3.client import FleetClient
from fastvideo3.errors import InvalidRequest
from tests.fleet_fixture import fleet_fixture, generate_concurrently, pool_describe, resident_total, wait_until

fleet = fleet_fixture(scope="module", replicas={"denoiser": 2})

STEPS = 4
SHAPES = [dict(num_frames=17, height=64, width=64), dict(num_frames=9, height=64, width=96)]
PROMPTS = ["a red circle moving left", "a blue square", "waves at sunset"]
REQUESTS = [dict(prompt=PROMPTS[i % 3], seed=100 + i, num_inference_steps=STEPS, **SHAPES[i % 2]) for i in range(8)]


_EMBEDDED = """
import json, sys
import numpy as np
import fastvideo3
out = {}
with fastvideo3.Engine("wan-tiny") as engine:
    for i, r in enumerate(json.loads(sys.argv[1])):
        kw = {k: v for k, v in r.items() if k != "prompt"}
        video = engine.generate(r["prompt"], **kw)
        out[str(i)] = np.clip(video.frames, 0.0, 1.0).astype(np.float32)  # what save_video writes to npy
np.savez(sys.argv[2], **out)
"""


@pytest.fixture(scope="module")
def embedded_frames(tmp_path_factory):
    """The embedded engine's frames for every request in REQUESTS (one at a time), computed in a
    fresh process like the fleet's own, so nothing an earlier test did to this process's state
    (threads, kernel choices, cached cards) can enter the reference."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = tmp_path_factory.mktemp("embedded") / "frames.npz"
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-c", _EMBEDDED, json.dumps(REQUESTS), str(path)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(path) as data:
        return [data[str(i)] for i in range(len(REQUESTS))]


@pytest.fixture(scope="module")
def no_batching_target(fleet):
    return fleet.add_scheduler(["--no-batching"], name="scheduler-nobatch")


@pytest.mark.timeout(240)
def test_every_process_went_not_serving_then_serving(fleet):
    for p in fleet.processes():
        seen = p.statuses()
        assert seen[:2] == ["NOT_SERVING", "SERVING"], (p.name, seen)


@pytest.mark.timeout(300)
def test_concurrent_requests_batch_across_requests_and_match_embedded(fleet, embedded_frames):
    videos = generate_concurrently(fleet.target, REQUESTS)
    with FleetClient(fleet.target) as c:
        counters = c.describe()["counters"]
    assert counters["diffusion_step.multi_request_batches"] >= 1, counters
    assert counters["diffusion_step.max_batch_units"] > 1, counters
    per_replica = [pool_describe(p.target).counters["units"] for p in fleet.pools["denoiser"]]
    assert all(n > 0 for n in per_replica), per_replica  # least-loaded placement used both replicas
    for i, (video, ref) in enumerate(zip(videos, embedded_frames)):
        frames = video.frames
        assert frames.shape == ref.shape, i
        assert float(np.abs(frames - ref).max()) <= 1e-3, i
        assert video.sidecar["request"]["seed"] == REQUESTS[i]["seed"]
        assert video.sidecar["fleet"]["batching"] is True
    wait_until(lambda: resident_total(fleet) == 0, 10, "every pool to release every request")


@pytest.mark.timeout(300)
def test_without_batching_outputs_are_bit_identical_to_embedded(fleet, embedded_frames, no_batching_target):
    videos = generate_concurrently(no_batching_target, REQUESTS)
    with FleetClient(no_batching_target) as c:
        counters = c.describe()["counters"]
    assert counters["diffusion_step.max_batch_units"] == 1, counters
    for i, (video, ref) in enumerate(zip(videos, embedded_frames)):
        assert np.array_equal(video.frames, ref), f"request {i} differs from the embedded output"


@pytest.fixture(scope="module")
def invariant_target(fleet):
    """A scheduler in batch-invariant mode (bucket: a max batch of 4) routing every denoise step to
    one replica, so concurrent requests share its batches."""
    d0 = fleet.pools["denoiser"][0].target
    return fleet.add_scheduler(["--batch-invariant", "on", "--max-batch", "4", "--pools", f"denoiser={d0}"],
                               name="scheduler-invariant")


@pytest.mark.timeout(300)
def test_batch_invariant_alone_and_with_three_batch_mates_bit_identical(fleet, invariant_target):
    me = dict(prompt="a red circle moving left", seed=21, num_inference_steps=6, num_frames=9, height=32, width=32)
    mates = [dict(me, prompt="a blue square", seed=22, num_inference_steps=2),
             dict(me, prompt="waves at sunset", seed=23, num_inference_steps=4, guidance_scale=3.0),
             dict(me, prompt="a green ball", seed=24)]
    alone = generate_concurrently(invariant_target, [me])[0]
    with FleetClient(invariant_target) as c:
        before = c.describe()["counters"].get("diffusion_step.multi_request_batches", 0)
    together = generate_concurrently(invariant_target, [me, *mates])[0]
    with FleetClient(invariant_target) as c:
        desc = c.describe()
    assert desc["counters"]["diffusion_step.multi_request_batches"] > before  # it shared batches
    info = desc["description"]
    assert info["batch_invariant_bucket"] == 4 and info["config"]["batch_invariant"] == "on"
    assert desc["card"]["labels"]["batch_invariant"] == "on"
    assert pool_describe(fleet.pools["denoiser"][0].target).counters["padding_rows"] > 0
    assert np.array_equal(alone.frames, together.frames)
    assert alone.sidecar["runtime"]["batch_invariant_bucket"] == 4
    wait_until(lambda: resident_total(fleet) == 0, 10, "every pool to release every request")


@pytest.mark.timeout(240)
def test_cancel_mid_denoise_ends_within_one_step(fleet):
    long = dict(num_frames=9, height=64, width=64, num_inference_steps=60, seed=7)
    short = dict(num_frames=9, height=64, width=64, num_inference_steps=3)
    events: list = []
    others: list = []
    with FleetClient(fleet.target, timeout_s=200) as c:
        threads = [threading.Thread(target=lambda s=s: others.append(
            c.generate(f"other {s}", seed=s, output_format="npy", **short))) for s in (1, 2)]
        stream = c.stream("a long request", request_id="cancel-me", output_format="npy", **long)
        for ev in stream:
            events.append(ev)
            if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] == 3:
                for t in threads:
                    t.start()
                assert c.cancel("cancel-me", reason="test")
                at_cancel = c.get("cancel-me")["step"]  # server-side step just after the cancel
        for t in threads:
            t.join(timeout=120)
        status = c.get("cancel-me")
    steps = [e.data["step"] for e in events if e.kind == "progress" and e.data["phase"] == "denoise"]
    assert events[-1].kind == "finished" and events[-1].data["state"] == "CANCELLED"
    assert any(e.kind == "error" and e.data["code"] == "CANCELLED" for e in events)
    assert steps[-1] <= at_cancel + 1 < 60, (steps[-1], at_cancel)
    assert status["state"] == "CANCELLED" and status["step"] == steps[-1]
    assert len(others) == 2 and all(v.frames.shape == (9, 64, 64, 3) for v in others)
    # the finished event is sent only after every pool released the request
    assert resident_total(fleet, "denoiser") == 0
    wait_until(lambda: resident_total(fleet) == 0, 10, "every pool to release every request")


@pytest.mark.timeout(240)
def test_client_disconnect_cancels_server_side(fleet):
    def denoiser_units() -> float:
        return sum(pool_describe(p.target).counters["units"] for p in fleet.pools["denoiser"])

    with FleetClient(fleet.target, timeout_s=200) as c:
        stream = c.stream("a request whose client leaves", request_id="leaver", output_format="npy",
                          num_frames=9, height=64, width=64, num_inference_steps=80, seed=3)
        for ev in stream:
            if ev.kind == "progress" and ev.data["phase"] == "denoise" and ev.data["step"] >= 2:
                seen = ev.data["step"]
                break
        stream.close()  # the client goes away mid-denoise
        status = wait_until(lambda: (s := c.get("leaver"))["state"] in ("CANCELLED", "FAILED", "SUCCEEDED") and s,
                            20, "the server to cancel the abandoned request")
        assert status["state"] == "CANCELLED", status
        assert seen <= status["step"] < 80
        wait_until(lambda: resident_total(fleet, "denoiser") == 0, 10, "the denoisers to free the request")
        units = denoiser_units()
        # no further WorkUnits: a later request's units are all the denoisers see
        c.generate("after the leaver", output_format="npy", num_frames=9, height=64, width=64, num_inference_steps=2)
        assert denoiser_units() == units + 2
        assert c.get("leaver")["step"] == status["step"]


@pytest.mark.timeout(180)
def test_describe_shows_cache_hit_on_repeated_prompt(fleet):
    encoder = fleet.pools["encoder"][0].target
    before = dict(pool_describe(encoder).cache_stats)
    with FleetClient(fleet.target) as c:
        kw = dict(output_format="npy", num_frames=9, height=64, width=64, num_inference_steps=1, seed=5)
        first = c.generate("a prompt seen twice", **kw)
        second = c.generate("a prompt seen twice", **kw)
        d = c.describe()
    after = dict(pool_describe(encoder).cache_stats)
    assert after["feature_cache.misses"] == before["feature_cache.misses"] + 1
    assert after["feature_cache.hits"] == before["feature_cache.hits"] + 1
    assert np.array_equal(first.frames, second.frames)
    live = [p for p in d["description"]["pools"].values() if p.get("role") == "encoder"][0]
    assert live["cache_stats"]["feature_cache.hits"] >= 1
    wait_until(lambda: pool_describe(encoder).cache_stats["feature_cache.referenced_entries"] == 0, 10,
               "released requests to drop their cache references")


@pytest.mark.timeout(180)
def test_rewards_are_scored_in_the_reward_pool(fleet):
    with FleetClient(fleet.target) as c:
        video = c.generate("a scored clip", output_format="mp4", num_frames=9, height=64, width=64,
                           num_inference_steps=2, rewards=["temporal_consistency", "image_quality"])
    assert set(video.rewards) == {"temporal_consistency", "image_quality"}
    assert all(0.0 <= v <= 1.0 for v in video.rewards.values())
    assert video.sidecar["rewards"] == pytest.approx(video.rewards)
    assert video.data[4:8] == b"ftyp"  # an mp4 encoded by the decoder pool


@pytest.mark.timeout(120)
def test_describe_shows_deployment_card_pools_and_edges(fleet):
    with FleetClient(fleet.target) as c:
        d = c.describe()
    card = d["card"]
    assert card["engine_id"] and card["default_model"] == "wan-tiny"
    assert [m["card_id"] for m in card["models"]] == ["wan-tiny"]
    roles = {p["role"]: p for p in card["role_pools"]}
    assert set(roles) == {"encoder", "denoiser", "decoder", "reward"}
    eps = {e["role"]: e["endpoints"] for e in card["transfer_endpoints"]}
    assert any(ep["backend"] == "grpc" and ep["address"] == fleet.pools["denoiser"][0].target for ep in eps["denoiser"])
    assert d["description"]["transport_edges"] == {"encoder->denoiser": "shm", "denoiser->decoder": "shm",
                                                   "decoder->reward": "shm"}
    assert card["labels"]["transport.encoder->denoiser"] == "shm"
    assert {p["replica_id"] for p in d["pools"]} == {"encoder-0", "denoiser-0", "denoiser-1", "decoder-0", "reward-0"}
    assert roles["denoiser"]["replicas"] == 2
    assert all(p["healthy"] for p in d["pools"])


@pytest.mark.timeout(120)
def test_bad_requests_name_the_field_and_allocate_nothing(fleet):
    with FleetClient(fleet.target) as c:
        with pytest.raises(InvalidRequest) as e:
            c.generate("x", num_frames=10)
        assert e.value.field == "num_frames" and "4k+1" in (e.value.limit or "")
        with pytest.raises(InvalidRequest) as e:
            c.generate("x", rewards=["aesthetics"])
        assert e.value.field == "reward_scorers"
        with pytest.raises(InvalidRequest) as e:
            c.generate("x", output_format="gif")
        assert e.value.field == "output_format"
    assert resident_total(fleet) == 0
