"""Writing generated videos to disk, and checking what was written.

:func:`save_video` takes decoded frames, ``(F, H, W, 3)`` floats in ``[0, 1]``, and picks the
format from the output path:

=====================  ======================================================================
``*.mp4``              H.264 (libx264, yuv420p, ``+faststart``) through the ffmpeg binary that
                       ``imageio-ffmpeg`` ships; frames go to ffmpeg as raw RGB over a pipe.
``*.npy``              the float32 frames, lossless.
a directory            ``frame_00000.png``, ``frame_00001.png``, … (8-bit RGB). A path is a
                       directory when it ends with ``/``, already is a directory, or has no
                       suffix.
=====================  ======================================================================

Writes are atomic: everything goes to a hidden temporary name in the destination's directory
and is renamed into place only once complete, so a failure leaves no partial output behind.
An optional JSON sidecar (request, seed, timings, …) goes to ``<path>.json``, or to
``<dir>/video.json`` for a frame directory.

:func:`probe_video` decodes a file with the same ffmpeg and reports codec, frame count, size and
frame rate; tests and the CLI use it to prove an mp4 is playable.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from fastvideo3.errors import DeadlineExceeded, Internal, InvalidRequest
from fastvideo3.vocab import OutputFormat

SUPPORTED_OUTPUTS = ".mp4, .npy, or a directory (PNG frames)"
SIDECAR_IN_DIR = "video.json"
FRAME_PATTERN = "frame_{:05d}.png"
DEFAULT_CRF = 18  # visually lossless for generated content; files stay small at these sizes
#: the deadline of one ffmpeg run: this many seconds, plus ENCODE_S_PER_MPIXEL per million frame
#: pixels (an 81x480x832 clip: 32 M, ~7 s of libx264 `medium` on one core of a server CPU). A hung
#: or starved ffmpeg is killed then, and the encode fails with DEADLINE_EXCEEDED.
ENCODE_BASE_S = 30.0
ENCODE_S_PER_MPIXEL = 2.0


def ffmpeg_exe() -> str:
    """Path of the ffmpeg binary bundled with imageio-ffmpeg (it includes libx264)."""
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


# ---------------------------------------------------------------------------------------------
# Validation


def _validate_frames(frames: Any) -> np.ndarray:
    """Check shape / dtype / finiteness; return float32 frames clipped to [0, 1].

    Values outside [0, 1] are clipped (as diffusers' own post-processing does), in every format,
    so ``.npy`` output equals the input exactly whenever the input is in range. Non-finite values
    are refused: they mean the generation failed, and clipping would hide that.
    """
    if not isinstance(frames, np.ndarray):
        raise InvalidRequest(
            f"frames must be a numpy array, got {type(frames).__name__}", field="frames",
            limit="np.ndarray (F, H, W, 3)",
        )
    if frames.ndim != 4 or frames.shape[-1] != 3 or min(frames.shape[:3]) < 1:
        raise InvalidRequest(
            f"frames must have shape (F, H, W, 3), got {tuple(frames.shape)}", field="frames",
            limit="(F>=1, H>=1, W>=1, 3)",
        )
    if not np.issubdtype(frames.dtype, np.floating):
        raise InvalidRequest(
            f"frames must be floating point in [0, 1], got dtype {frames.dtype}", field="frames",
            limit="float16 / float32 / float64 in [0, 1]",
        )
    out = frames.astype(np.float32, copy=False)
    if not np.isfinite(out).all():
        raise InvalidRequest("frames contain NaN or infinite values", field="frames", limit="finite")
    return np.clip(out, 0.0, 1.0)


def _to_uint8(frames: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.rint(frames * 255.0).astype(np.uint8))


def _output_kind(path: str | os.PathLike[str]) -> tuple[str, Path]:
    raw = os.fspath(path)
    p = Path(raw)
    if raw.endswith(("/", os.sep)) or p.is_dir() or p.suffix == "":
        return "png", p
    suffix = p.suffix.lower()
    if suffix in (".mp4", ".npy"):
        return suffix[1:], p
    raise InvalidRequest(
        f"unsupported output format {p.suffix!r} for {p.name!r}", field="output", limit=SUPPORTED_OUTPUTS
    )


def _json_default(value: Any) -> Any:
    # Metadata often carries numpy scalars / small arrays and paths; anything else is refused.
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.size <= 4096:
        return value.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{type(value).__name__} is not JSON-serializable")


def _sidecar_text(sidecar: dict[str, Any] | None) -> str | None:
    if sidecar is None:
        return None
    if not isinstance(sidecar, dict):
        raise InvalidRequest("sidecar must be a dict", field="sidecar", limit="JSON object")
    try:
        return json.dumps(sidecar, indent=2, sort_keys=True, allow_nan=False, default=_json_default) + "\n"
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"sidecar is not JSON-serializable: {exc}", field="sidecar") from exc


# ---------------------------------------------------------------------------------------------
# Writers (each writes one complete file at a temporary path)


def _write_mp4(frames: np.ndarray, dest: Path, fps: float, crf: int) -> None:
    num_frames, height, width, _ = frames.shape
    if height % 2 or width % 2:
        raise InvalidRequest(
            f"H.264 (yuv420p) needs an even width and height, got {width}x{height}",
            field="frames", limit="even width and height",
        )
    cmd = [
        ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-framerate", f"{fps:g}",
        "-i", "pipe:0",
        "-an", "-c:v", "libx264", "-pix_fmt", "yuv420p", "-crf", str(crf), "-preset", "medium",
        "-movflags", "+faststart", "-f", OutputFormat.MP4, str(dest),
    ]
    deadline_s = encode_deadline_s(frames.shape)
    # stderr goes to a file, not a pipe: a chatty ffmpeg can never block on a full pipe while
    # we are still feeding it frames.
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log)
        assert proc.stdin is not None
        # the watchdog kills an ffmpeg past its deadline; a write blocked on its full pipe then
        # fails with a broken pipe, so neither the feeding nor the wait can outlive the deadline
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            proc.kill()

        watchdog = threading.Timer(deadline_s, kill)
        watchdog.daemon = True
        watchdog.start()
        try:
            for index in range(num_frames):  # one frame at a time: no second full-size copy
                proc.stdin.write(_to_uint8(frames[index]).tobytes())
            proc.stdin.close()
        except BrokenPipeError:
            pass  # ffmpeg died (or was killed); its exit status and log say why
        finally:
            returncode = proc.wait()
            watchdog.cancel()
        if killed.is_set():
            raise DeadlineExceeded(f"ffmpeg did not finish encoding {num_frames} frames of {width}x{height} "
                                   f"within {deadline_s:.0f} s and was killed", field="encode",
                                   limit=f"{deadline_s:.0f} s")
        if returncode != 0:
            log.seek(0)
            tail = log.read().decode(errors="replace").strip()[-2000:]
            raise Internal(f"ffmpeg exited with status {returncode}: {tail}", details={"cmd": cmd})


def encode_deadline_s(shape: tuple[int, ...]) -> float:
    """How long one ffmpeg run may take for frames of ``shape`` (``(F, H, W, 3)``)."""
    num_frames, height, width = shape[0], shape[1], shape[2]
    return ENCODE_BASE_S + ENCODE_S_PER_MPIXEL * num_frames * height * width / 1e6


def npy_bytes(frames: np.ndarray) -> bytes:
    """The ``.npy`` file :func:`save_video` writes for ``frames``, made in memory (no file)."""
    import io
    buf = io.BytesIO()
    np.save(buf, _validate_frames(frames), allow_pickle=False)
    return buf.getvalue()


def _write_npy(frames: np.ndarray, dest: Path) -> None:
    with open(dest, "wb") as fh:
        np.save(fh, frames, allow_pickle=False)


def _write_png_dir(frames: np.ndarray, dest_dir: Path, sidecar: str | None) -> None:
    from PIL import Image

    for index in range(frames.shape[0]):
        Image.fromarray(_to_uint8(frames[index]), mode="RGB").save(
            dest_dir / FRAME_PATTERN.format(index), format="PNG"
        )
    if sidecar is not None:
        (dest_dir / SIDECAR_IN_DIR).write_text(sidecar)


# ---------------------------------------------------------------------------------------------
# Public API


def save_video(
    frames: np.ndarray,
    path: str | os.PathLike[str],
    *,
    fps: float = 16,
    sidecar: dict[str, Any] | None = None,
    crf: int = DEFAULT_CRF,
) -> list[Path]:
    """Write ``frames`` (``(F, H, W, 3)`` floats in [0, 1]) to ``path``; see the module docstring.

    Returns the paths written: the output (file or directory) first, then the sidecar if any.
    An existing output file is replaced atomically; an existing output directory must be empty.
    Raises :class:`~fastvideo3.errors.InvalidRequest` for bad frames (``field="frames"``), an
    unsupported or unusable path (``field="output"``), a bad ``fps`` or an unserializable
    ``sidecar``; :class:`~fastvideo3.errors.Internal` if ffmpeg fails, and
    :class:`~fastvideo3.errors.DeadlineExceeded` if it runs past :func:`encode_deadline_s` (it is
    killed). On any error nothing new is left at or beside ``path``.
    """
    kind, dest = _output_kind(path)  # first: a bad suffix is reported whatever the frames
    clean = _validate_frames(frames)
    if not (isinstance(fps, (int, float)) and 0 < fps <= 240):
        raise InvalidRequest(f"fps must be in (0, 240], got {fps!r}", field="fps", limit="(0, 240]")
    text = _sidecar_text(sidecar)
    parent = dest.parent
    parent.mkdir(parents=True, exist_ok=True)

    if kind == "png":
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise InvalidRequest(
                f"output directory {dest.name!r} exists and is not empty", field="output",
                limit="a new or empty directory",
            )
        tmp_dir = Path(tempfile.mkdtemp(dir=parent, prefix=f".{dest.name}.", suffix=".partial"))
        try:
            _write_png_dir(clean, tmp_dir, text)
            tmp_dir.chmod(0o755)
            os.replace(tmp_dir, dest)  # rename(2) may replace an empty directory
        except BaseException:
            shutil.rmtree(tmp_dir, ignore_errors=True)
            raise
        return [dest] + ([dest / SIDECAR_IN_DIR] if text is not None else [])

    written: list[tuple[Path, Path]] = []  # (temporary, final), renamed only when all are done
    try:
        tmp = _temp_file(parent, dest.name)
        written.append((tmp, dest))
        if kind == OutputFormat.MP4:
            _write_mp4(clean, tmp, float(fps), crf)
        else:
            _write_npy(clean, tmp)
        if text is not None:
            side = dest.with_name(dest.name + ".json")
            side_tmp = _temp_file(parent, side.name)
            written.append((side_tmp, side))
            side_tmp.write_text(text)
        for tmp_path, final in written:
            tmp_path.chmod(0o644)
            os.replace(tmp_path, final)
    except BaseException:
        for tmp_path, _ in written:
            tmp_path.unlink(missing_ok=True)
        raise
    return [final for _, final in written]


def _temp_file(parent: Path, name: str) -> Path:
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{name}.", suffix=".partial")
    os.close(fd)
    return Path(tmp)


_STREAM_RE = re.compile(r"Stream #\d+:\d+[^:]*: Video: (?P<codec>\w+)(?P<rest>.*)")
_SIZE_RE = re.compile(r",\s*(\d{2,5})x(\d{2,5})")
_FPS_RE = re.compile(r"([\d.]+) fps")
_PIXFMT_RE = re.compile(r"\),\s*(\w+)\(|,\s*(yuv\w+|rgb\w+|gray\w*)")
_FRAMES_RE = re.compile(r"frame=\s*(\d+)")


def probe_video(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Decode ``path`` fully with ffmpeg and describe its first video stream.

    Returns ``{"codec", "frames", "width", "height", "fps", "pix_fmt"}``; ``frames`` counts
    decoded frames, so a file that probes is a file that plays. Meant for short generated
    clips (it decodes everything). Raises :class:`~fastvideo3.errors.InvalidRequest`
    (``field="path"``) if the file is missing or has no decodable video stream, and
    :class:`~fastvideo3.errors.DeadlineExceeded` if ffmpeg does not finish in time.
    """
    p = Path(path)
    if not p.is_file():
        raise InvalidRequest(f"no such file: {p.name!r}", field="path")
    cmd = [ffmpeg_exe(), "-hide_banner", "-nostdin", "-i", str(p), "-map", "0:v:0", "-f", "null", "-"]
    limit = ENCODE_BASE_S + p.stat().st_size / 1e6  # and a second per MB of file: decoding is cheap
    try:
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False, timeout=limit)
    except subprocess.TimeoutExpired:
        raise DeadlineExceeded(f"ffmpeg did not decode {p.name!r} within {limit:.0f} s", field="path",
                               limit=f"{limit:.0f} s") from None
    log = proc.stderr.decode(errors="replace")
    stream = _STREAM_RE.search(log)
    if proc.returncode != 0 or stream is None:
        raise InvalidRequest(
            f"{p.name!r} has no decodable video stream: {log.strip()[-500:]}", field="path"
        )
    rest = stream.group("rest")
    size = _SIZE_RE.search(rest)
    fps = _FPS_RE.search(rest)
    pix = _PIXFMT_RE.search(rest)
    frames = _FRAMES_RE.findall(log)
    return {
        "codec": stream.group("codec"),
        "frames": int(frames[-1]) if frames else 0,
        "width": int(size.group(1)) if size else 0,
        "height": int(size.group(2)) if size else 0,
        "fps": float(fps.group(1)) if fps else 0.0,
        "pix_fmt": (pix.group(1) or pix.group(2)) if pix else None,
    }
