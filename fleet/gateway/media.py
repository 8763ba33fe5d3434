"""Where finished videos live: one directory per job under a configured root, expired by TTL.

Each job's folder holds ``video.mp4`` (the fleet's artifact, byte for byte), ``thumbnail.webp``
(its first frame) and ``spritesheet.jpg`` (up to 8 frames in a row). Files are written atomically
(a temporary name, then a rename), so a reader never sees half a file; the HTTP layer serves them
with range requests. A sweep deletes folders older than the TTL. The chart mounts a volume here;
object storage would be another implementation of the same four methods (``put``, ``path``,
``delete``, ``sweep``).
"""
from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

log = logging.getLogger("fastvideo3.gateway")

VARIANTS = {"video": ("video.mp4", "video/mp4"), "thumbnail": ("thumbnail.webp", "image/webp"),
            "spritesheet": ("spritesheet.jpg", "image/jpeg")}
SPRITES = 8


class MediaStore:
    def __init__(self, root: str | os.PathLike[str], ttl_s: float) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.ttl_s = ttl_s

    def _dir(self, job_id: str) -> Path:
        if not job_id or "/" in job_id or job_id.startswith("."):
            raise ValueError(f"bad job id {job_id!r}")
        return self.root / job_id

    def _write(self, dest: Path, data: bytes) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def put(self, job_id: str, video: bytes) -> dict[str, int]:
        """Store the video and its derived images; returns bytes per variant."""
        folder = self._dir(job_id)
        self._write(folder / VARIANTS["video"][0], video)
        sizes = {"video": len(video)}
        try:
            thumb, sheet = derived_images(folder / VARIANTS["video"][0])
            self._write(folder / VARIANTS["thumbnail"][0], thumb)
            self._write(folder / VARIANTS["spritesheet"][0], sheet)
            sizes.update(thumbnail=len(thumb), spritesheet=len(sheet))
        except Exception as e:  # noqa: BLE001 - the video itself is still served
            log.warning("no thumbnail/spritesheet for %s: %s", job_id, e)
        return sizes

    def path(self, job_id: str, variant: str) -> Path | None:
        p = self._dir(job_id) / VARIANTS[variant][0]
        return p if p.is_file() else None

    def delete(self, job_id: str) -> None:
        shutil.rmtree(self._dir(job_id), ignore_errors=True)

    def sweep(self, now: float | None = None) -> list[str]:
        """Delete every job folder older than the TTL; returns their ids."""
        now = time.time() if now is None else now
        gone = []
        for folder in self.root.iterdir() if self.root.is_dir() else ():
            try:
                if folder.is_dir() and now - folder.stat().st_mtime > self.ttl_s:
                    shutil.rmtree(folder, ignore_errors=True)
                    gone.append(folder.name)
            except OSError:
                continue
        return gone


def derived_images(video_path: Path) -> tuple[bytes, bytes]:
    """(thumbnail webp of the first frame, spritesheet jpeg of up to 8 evenly spaced frames),
    decoded with the ffmpeg that imageio-ffmpeg ships."""
    import imageio.v2 as imageio
    from PIL import Image

    with imageio.get_reader(str(video_path), format="FFMPEG") as reader:
        frames = [Image.fromarray(f) for f in reader]
    if not frames:
        raise ValueError("the video has no frames")
    pick = [frames[round(i * (len(frames) - 1) / max(1, SPRITES - 1))] for i in range(min(SPRITES, len(frames)))]
    w, h = frames[0].size
    sheet = Image.new("RGB", (w * len(pick), h))
    for i, im in enumerate(pick):
        sheet.paste(im.convert("RGB"), (i * w, 0))
    thumb_buf, sheet_buf = io.BytesIO(), io.BytesIO()
    frames[0].convert("RGB").save(thumb_buf, format="WEBP", quality=85)
    sheet.save(sheet_buf, format="JPEG", quality=85)
    return thumb_buf.getvalue(), sheet_buf.getvalue()
