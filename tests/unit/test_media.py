"""save_video writes playable, complete outputs or nothing; probe_video reads them back."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fastvideo3 import media
from fastvideo3.errors import Internal, InvalidRequest
from fastvideo3.media import probe_video, save_video

pytestmark = pytest.mark.timeout(60)


def _frames(num: int = 9, height: int = 32, width: int = 48, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus a moving square: compresses like video, differs frame to frame."""
    rng = np.random.default_rng(seed)
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    out = np.empty((num, height, width, 3), np.float32)
    for f in range(num):
        out[f, ..., 0] = ys / height
        out[f, ..., 1] = xs / width
        out[f, ..., 2] = 0.5
        out[f, 4:12, 2 * f : 2 * f + 8, :] = 1.0
    return np.clip(out + rng.normal(0, 0.01, out.shape).astype(np.float32), 0, 1)


def _leftovers(directory):
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_mp4_round_trip_is_h264_with_right_frames_and_size(tmp_path):
    frames = _frames(num=9, height=32, width=48)
    written = save_video(frames, tmp_path / "clip.mp4", fps=16)
    assert written == [tmp_path / "clip.mp4"]
    info = probe_video(tmp_path / "clip.mp4")
    assert info == {
        "codec": "h264", "frames": 9, "width": 48, "height": 32, "fps": 16.0, "pix_fmt": "yuv420p",
    }
    # Decoded pixels are close to the input (lossy, but not garbage).
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(tmp_path / "clip.mp4"))
    meta = next(reader)
    assert meta["size"] == (48, 32)
    decoded = np.stack([np.frombuffer(b, np.uint8).reshape(32, 48, 3) for b in reader])
    assert decoded.shape == (9, 32, 48, 3)
    assert np.abs(decoded / 255.0 - frames).mean() < 0.05
    assert _leftovers(tmp_path) == []


def test_mp4_fps_is_recorded(tmp_path):
    save_video(_frames(num=5), tmp_path / "a.mp4", fps=24)
    assert probe_video(tmp_path / "a.mp4")["fps"] == 24.0


def test_npy_is_lossless(tmp_path):
    frames = _frames()
    assert save_video(frames, tmp_path / "x.npy") == [tmp_path / "x.npy"]
    back = np.load(tmp_path / "x.npy")
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back, frames)


def test_npy_clips_out_of_range_and_upcasts(tmp_path):
    frames = np.full((2, 16, 16, 3), 0.25, np.float16)
    frames[0, 0, 0] = [-1.0, 2.0, 0.5]
    save_video(frames, tmp_path / "x.npy")
    back = np.load(tmp_path / "x.npy")
    assert back.dtype == np.float32
    np.testing.assert_array_equal(back[0, 0, 0], [0.0, 1.0, 0.5])
    assert back[1].min() == back[1].max() == 0.25


@pytest.mark.parametrize("form", ["slash", "existing", "no_suffix"])
def test_png_directory(tmp_path, form):
    from PIL import Image

    frames = _frames(num=4, height=16, width=32)
    if form == "slash":
        target, arg = tmp_path / "frames", str(tmp_path / "frames") + "/"
    elif form == "existing":
        target = arg = tmp_path / "frames.d"
        target.mkdir()
    else:
        target = arg = tmp_path / "frames"
    written = save_video(frames, arg, sidecar={"prompt": "a cat"})
    assert written == [target, target / "video.json"]
    assert sorted(p.name for p in target.iterdir()) == [
        "frame_00000.png", "frame_00001.png", "frame_00002.png", "frame_00003.png", "video.json",
    ]
    for i in range(4):
        img = np.asarray(Image.open(target / f"frame_{i:05d}.png"))
        assert img.shape == (16, 32, 3) and img.dtype == np.uint8
        np.testing.assert_array_equal(img, np.rint(frames[i] * 255).astype(np.uint8))
    assert json.loads((target / "video.json").read_text()) == {"prompt": "a cat"}
    assert _leftovers(tmp_path) == []


def test_png_directory_refuses_non_empty(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(InvalidRequest) as info:
        save_video(_frames(num=2), tmp_path / "out")
    assert info.value.field == "output"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["keep.txt"]


def test_sidecar_content(tmp_path):
    sidecar = {"request_id": "r1", "seed": 7, "steps": 2, "timings_s": {"denoise": 0.5}, "ok": True}
    written = save_video(_frames(num=5), tmp_path / "v.mp4", sidecar=sidecar)
    assert written == [tmp_path / "v.mp4", tmp_path / "v.mp4.json"]
    assert json.loads((tmp_path / "v.mp4.json").read_text()) == sidecar
    # numpy scalars / small arrays and paths are converted; the result is plain JSON.
    save_video(_frames(num=2), tmp_path / "v.npy",
               sidecar={"a": np.arange(2), "b": np.float32(0.5), "c": tmp_path / "x"})
    assert json.loads((tmp_path / "v.npy.json").read_text()) == {"a": [0, 1], "b": 0.5, "c": str(tmp_path / "x")}


@pytest.mark.parametrize("name", ["v.gif", "v.webm", "v.MOV", "v.tar.gz"])
def test_unsupported_suffix_names_output(tmp_path, name):
    with pytest.raises(InvalidRequest) as info:
        save_video(_frames(num=2), tmp_path / name)
    assert info.value.field == "output"
    assert ".mp4" in info.value.limit
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "bad",
    [
        np.zeros((4, 16, 16), np.float32),  # no channel axis
        np.zeros((1, 4, 16, 16, 3), np.float32),  # batched
        np.zeros((4, 16, 16, 4), np.float32),  # RGBA
        np.zeros((0, 16, 16, 3), np.float32),  # no frames
        np.zeros((4, 16, 16, 3), np.uint8),  # not float
        np.full((4, 16, 16, 3), np.nan, np.float32),  # failed generation
        [[[[0.0, 0.0, 0.0]]]],  # not an array
    ],
)
@pytest.mark.parametrize("suffix", [".mp4", ".npy", ""])
def test_invalid_frames_leave_nothing(tmp_path, bad, suffix):
    with pytest.raises(InvalidRequest) as info:
        save_video(bad, tmp_path / f"out{suffix}", sidecar={"x": 1})
    assert info.value.field == "frames"
    assert list(tmp_path.iterdir()) == []


def test_odd_size_mp4_is_refused(tmp_path):
    with pytest.raises(InvalidRequest, match="even"):
        save_video(_frames(num=2, height=15, width=16), tmp_path / "o.mp4")
    assert list(tmp_path.iterdir()) == []


def test_unserializable_sidecar_leaves_nothing(tmp_path):
    with pytest.raises(InvalidRequest) as info:
        save_video(_frames(num=2), tmp_path / "o.mp4", sidecar={"bad": object()})
    assert info.value.field == "sidecar"
    assert list(tmp_path.iterdir()) == []


def test_encoder_failure_leaves_nothing_and_keeps_old_file(tmp_path):
    target = tmp_path / "o.mp4"
    target.write_bytes(b"previous")
    with pytest.raises(Internal, match="ffmpeg"):
        save_video(_frames(num=2), target, crf=-5, sidecar={"x": 1})  # libx264 rejects crf -5
    assert target.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o.mp4"]


def test_failure_mid_write_leaves_nothing(tmp_path, monkeypatch):
    def explode(frames, dest):
        dest.write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(media, "_write_npy", explode)
    with pytest.raises(OSError, match="disk full"):
        save_video(_frames(num=2), tmp_path / "o.npy")
    assert list(tmp_path.iterdir()) == []

    def explode_png(frames, dest_dir, sidecar):
        (dest_dir / "frame_00000.png").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(media, "_write_png_dir", explode_png)
    with pytest.raises(OSError, match="disk full"):
        save_video(_frames(num=2), tmp_path / "frames")
    assert list(tmp_path.iterdir()) == []


def test_existing_file_is_replaced(tmp_path):
    target = tmp_path / "o.npy"
    target.write_bytes(b"old")
    save_video(_frames(num=2), target)
    assert np.load(target).shape == (2, 32, 48, 3)


def test_probe_rejects_missing_and_non_video(tmp_path):
    with pytest.raises(InvalidRequest):
        probe_video(tmp_path / "nope.mp4")
    (tmp_path / "junk.mp4").write_bytes(b"not a video at all")
    with pytest.raises(InvalidRequest):
        probe_video(tmp_path / "junk.mp4")


def test_bad_fps_is_refused(tmp_path):
    with pytest.raises(InvalidRequest) as info:
        save_video(_frames(num=2), tmp_path / "o.mp4", fps=0)
    assert info.value.field == "fps"


def _hung_ffmpeg(tmp_path):
    """An "ffmpeg" that never reads its input nor exits (a hung or starved encoder)."""
    exe = tmp_path / "hung-ffmpeg"
    exe.write_text("#!/bin/sh\nexec sleep 600\n")
    exe.chmod(0o755)
    return str(exe)


def test_hung_encoder_is_killed_at_its_deadline_and_leaves_nothing(tmp_path, monkeypatch):
    import time

    from fastvideo3.errors import DeadlineExceeded
    monkeypatch.setattr(media, "ffmpeg_exe", lambda: _hung_ffmpeg(tmp_path))
    monkeypatch.setattr(media, "ENCODE_BASE_S", 1.0)
    monkeypatch.setattr(media, "ENCODE_S_PER_MPIXEL", 0.1)
    out = tmp_path / "out"
    out.mkdir()
    t0 = time.monotonic()
    # 33 frames of 256x256 are 6.5 MB of RGB: more than a pipe holds, so the feeding blocks too
    with pytest.raises(DeadlineExceeded, match="killed") as info:
        save_video(_frames(num=33, height=256, width=256), out / "o.mp4")
    assert time.monotonic() - t0 < 15  # the deadline: 1 s + 0.1 s per million frame pixels (2.2 M)
    assert info.value.field == "encode" and info.value.limit == f"{media.encode_deadline_s((33, 256, 256)):.0f} s"
    assert list(out.iterdir()) == []


def test_encode_deadline_grows_with_the_clip():
    assert media.encode_deadline_s((81, 480, 832, 3)) == pytest.approx(
        media.ENCODE_BASE_S + media.ENCODE_S_PER_MPIXEL * 81 * 480 * 832 / 1e6)
    assert media.encode_deadline_s((1, 16, 16, 3)) < media.encode_deadline_s((81, 480, 832, 3))
