"""The request's image (image-to-video): read, decoded and validated before anything is queued.

An image arrives as raw bytes, as base64 text (optionally a ``data:image/...;base64,`` URL), or as
an ``http(s)://`` URL that the scheduler fetches only when its :class:`ImagePolicy` allows it (off
by default), with a timeout and a size cap. It is then decoded with PIL and checked: a PNG, JPEG or
WebP file; each side within ``[min_side, max_side]`` and at most ``max_pixels`` pixels (checked
from the header, before the pixels are decoded); its aspect ratio within ``max_aspect_stretch``
of the requested ``width / height``, since the image is resized to the requested size as
diffusers' ``WanImageToVideoPipeline`` does it (a plain resize that stretches a differing aspect).
Every refusal is INVALID_ARGUMENT naming the field ``image`` and the limit.

The validated image travels as the base64 of its original bytes (what each pool decodes again)
with its digest, which enters the request's cache keys and provenance.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import io
from dataclasses import dataclass

from fastvideo3.errors import InvalidRequest

FIELD = "image"
FORMATS = ("PNG", "JPEG", "WEBP")


@dataclass(frozen=True)
class ImagePolicy:
    """Bounds on request images, and whether the scheduler may fetch an image URL."""

    max_bytes: int = 16 << 20
    min_side: int = 16
    max_side: int = 4096
    max_pixels: int = 4096 * 4096
    #: the most the resize to the requested size may stretch one side against the other
    max_aspect_stretch: float = 1.25
    allow_urls: bool = False
    url_timeout_s: float = 10.0


DEFAULT_POLICY = ImagePolicy()


@dataclass(frozen=True)
class RequestImage:
    """A validated image: the base64 of its bytes, its digest, format and size."""

    data_b64: str
    digest: str
    format: str
    width: int
    height: int

    def data(self) -> bytes:
        return base64.b64decode(self.data_b64)


def image_bytes(value, policy: ImagePolicy = DEFAULT_POLICY) -> bytes:
    """The bytes of ``value`` (bytes, base64 text, a data URL, or an http(s) URL when allowed)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
    elif isinstance(value, str):
        text = value.strip()
        if text.startswith(("http://", "https://")):
            data = fetch_url(text, policy)
        else:
            if text.startswith("data:"):
                head, _, text = text.partition(",")
                if ";base64" not in head:
                    raise InvalidRequest("a data URL must be base64-encoded", field=FIELD, limit="data:image/*;base64,")
            if len(text) > policy.max_bytes * 4 // 3 + 4:
                raise InvalidRequest(f"base64 text of {len(text)} characters exceeds the image size cap", field=FIELD,
                                     limit=f"<= {policy.max_bytes} bytes")
            try:
                data = base64.b64decode(text, validate=True)
            except (binascii.Error, ValueError):
                raise InvalidRequest("must be image bytes, base64 text, or an http(s) URL", field=FIELD) from None
    else:
        raise InvalidRequest(f"must be bytes or a string, got {type(value).__name__}", field=FIELD)
    if not data:
        raise InvalidRequest("is empty", field=FIELD, limit=f"1..{policy.max_bytes} bytes")
    if len(data) > policy.max_bytes:
        raise InvalidRequest(f"has {len(data)} bytes", field=FIELD, limit=f"<= {policy.max_bytes} bytes")
    return data


def fetch_url(url: str, policy: ImagePolicy) -> bytes:
    """GET ``url`` when the policy allows it: at most ``max_bytes``, within ``url_timeout_s``."""
    import urllib.error
    import urllib.request
    if not policy.allow_urls:
        raise InvalidRequest("image URLs are not fetched by this deployment; send the image's bytes or base64",
                             field=FIELD, limit="bytes or base64 (URL fetching is off)")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers={"User-Agent": "fastvideo3"}),
                                    timeout=policy.url_timeout_s) as resp:
            data = resp.read(policy.max_bytes + 1)
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise InvalidRequest(f"could not fetch the image URL: {getattr(e, 'reason', e)}", field=FIELD,
                             limit=f"reachable within {policy.url_timeout_s:g}s") from None
    if len(data) > policy.max_bytes:
        raise InvalidRequest(f"the image URL returned more than {policy.max_bytes} bytes", field=FIELD,
                             limit=f"<= {policy.max_bytes} bytes")
    return data


def validate_image(value, height: int, width: int, policy: ImagePolicy = DEFAULT_POLICY) -> RequestImage:
    """Read and check ``value`` against the policy and the requested ``height`` x ``width``."""
    from PIL import Image, UnidentifiedImageError
    data = image_bytes(value, policy)
    try:
        img = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError):
        raise InvalidRequest("is not a decodable image", field=FIELD, limit="PNG, JPEG or WebP") from None
    fmt = (img.format or "").upper()
    if fmt not in FORMATS:
        raise InvalidRequest(f"is a {fmt or 'unknown'} image", field=FIELD, limit="PNG, JPEG or WebP")
    w, h = img.size
    if min(w, h) < policy.min_side or max(w, h) > policy.max_side or w * h > policy.max_pixels:
        raise InvalidRequest(f"is {w}x{h} pixels", field=FIELD,
                             limit=f"each side in [{policy.min_side}, {policy.max_side}], <= {policy.max_pixels} pixels")
    try:
        with Image.open(io.BytesIO(data)) as full:  # the header was fine: now the pixels
            full.load()
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise InvalidRequest(f"could not be decoded: {e}", field=FIELD, limit="PNG, JPEG or WebP") from None
    stretch = (w / h) / (width / height)
    stretch = max(stretch, 1.0 / stretch)
    if stretch > policy.max_aspect_stretch + 1e-9:
        raise InvalidRequest(f"aspect ratio {w}x{h} differs from the requested {width}x{height} by {stretch:.2f}x; "
                             "the image is resized to the requested size", field=FIELD,
                             limit=f"aspect within {policy.max_aspect_stretch:g}x of width/height")
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return RequestImage(base64.b64encode(data).decode("ascii"), digest, fmt, w, h)
