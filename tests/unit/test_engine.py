"""The embedded engine: determinism, events, cancellation releasing state, the Python API."""
import numpy as np
import pytest
import torch

from fastvideo3.errors import InvalidRequest
from fastvideo3.engine import Engine

pytestmark = pytest.mark.timeout(300)
SMALL = dict(num_frames=9, height=32, width=32, num_inference_steps=3)


@pytest.fixture(scope="module")
def engine():
    e = Engine("wan-tiny", keep_latents=True)
    yield e
    e.close()


def test_generate_returns_frames_and_provenance(engine):
    video = engine.generate("a red circle moving left", seed=1, **SMALL)
    assert video.frames.shape == (9, 32, 32, 3) and video.frames.dtype == np.float32
    assert 0.0 <= video.frames.min() and video.frames.max() <= 1.0
    md = video.metadata
    assert md["card"] == "wan-tiny" and md["request"]["seed"] == 1 and md["request"]["num_inference_steps"] == 3
    assert md["weights"]["transformer"].startswith("shipped:")  # wan-tiny ships trained weights
    assert set(md["timings_s"]) == {"text_encode", "diffusion_denoise", "vae_decode"}
    assert len(md["latent_norms"]) == 3


def test_same_seed_same_latents_bit_identical(engine):
    a = engine.generate("a blue square", seed=5, **SMALL)
    b = engine.generate("a blue square", seed=5, **SMALL)
    c = engine.generate("a blue square", seed=6, **SMALL)
    assert torch.equal(a.latents, b.latents) and np.array_equal(a.frames, b.frames)
    assert not torch.equal(a.latents, c.latents)


def test_two_engines_agree_bit_for_bit():
    with Engine("wan-tiny", keep_latents=True) as e2:
        x = e2.generate("a yellow star", seed=9, **SMALL).latents
    with Engine("wan-tiny", keep_latents=True) as e3:
        y = e3.generate("a yellow star", seed=9, **SMALL).latents
    assert torch.equal(x, y)


def test_event_stream(engine):
    events = []
    engine.generate("x", seed=0, on_event=events.append, **SMALL)
    kinds = [e.kind for e in events]
    assert kinds[0] == "accepted" and kinds[-1] == "finished" and "artifact" in kinds
    steps = [(e.data["step"], e.data["total"]) for e in events if e.kind == "progress" and e.data["phase"] == "denoise"]
    assert steps == [(1, 3), (2, 3), (3, 3)]
    assert [e.seq for e in events] == sorted(e.seq for e in events)


def test_cancel_takes_effect_at_next_step_and_releases_everything(engine):
    run = engine.submit("cancel me", seed=0, **{**SMALL, "num_inference_steps": 20})
    other = engine.submit("keep me", seed=0, **SMALL)
    seen = []

    def on_event(ev):
        if ev.request_id == run.request_id and ev.kind == "progress" and ev.data["phase"] == "denoise":
            seen.append(ev.data["step"])
            if ev.data["step"] == 4:
                engine.cancel(run.request_id)

    engine.run(on_event=on_event)
    assert run.status == "CANCELLED" and run.error.code == "CANCELLED"
    assert max(seen) <= 5  # cancel acknowledged at the very next step boundary
    assert other.status == "SUCCEEDED"
    engine.result(other)
    assert engine.denoiser.describe()["resident_regions"] == 0
    stats = engine.transport.stats()
    assert stats["resident_buffers"] == 0 and stats["buffers_created"] == stats["buffers_released"]
    # the id can be reused
    reuse = engine.submit("reuse", request_id=run.request_id, seed=0, **SMALL)
    engine.run()
    assert reuse.status == "SUCCEEDED"
    engine.result(reuse)


def test_bad_request_allocates_nothing(engine):
    before = engine.transport.stats()["buffers_created"]
    with pytest.raises(InvalidRequest):
        engine.generate("x", num_frames=8)
    assert engine.transport.stats()["buffers_created"] == before
    assert not engine.scheduler.runs


def test_video_save_mp4_npy_png(engine, tmp_path):
    from fastvideo3.media import probe_video
    video = engine.generate("a red circle", seed=2, **SMALL)
    written = video.save(tmp_path / "v.mp4")
    info = probe_video(written[0])
    assert info["codec"] == "h264" and info["frames"] == 9 and (info["width"], info["height"]) == (32, 32)
    import json
    side = json.loads((tmp_path / "v.mp4.json").read_text())
    assert side["card"] == "wan-tiny" and side["request"]["seed"] == 2
    video.save(tmp_path / "v.npy")
    assert np.array_equal(np.load(tmp_path / "v.npy"), video.frames)
    video.save(tmp_path / "frames")
    assert len(list((tmp_path / "frames").glob("*.png"))) == 9
