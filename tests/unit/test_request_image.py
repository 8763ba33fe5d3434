"""An image-to-video request's image: read, decoded and validated at resolve time. A bad image is
INVALID_ARGUMENT naming the field ``image`` (and the limit), never an internal error."""
import base64
import io
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from fastvideo3.card import get_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.request.image import ImagePolicy, validate_image
from fastvideo3.request.schema import GenerateRequest, resolve

pytestmark = pytest.mark.timeout(60)
I2V = "wan2.1-i2v-tiny"  # defaults 9 x 32 x 48


def encoded(fmt: str = "PNG", size=(48, 32), mode="RGB") -> bytes:
    from PIL import Image
    arr = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    img = Image.fromarray(arr).convert(mode)
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def refused(req: GenerateRequest, card=I2V, *words, policy=None) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as e:
        resolve(req, get_card(card), image_policy=policy)
    assert e.value.field == "image", (e.value.field, e.value.message)
    for w in words:
        assert w in (e.value.message + " " + (e.value.limit or ""))
    return e.value


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_accepts_png_jpeg_webp_as_bytes_base64_or_data_url(fmt):
    data = encoded(fmt)
    for value in (data, base64.b64encode(data).decode(), f"data:image/{fmt.lower()};base64,"
                  + base64.b64encode(data).decode()):
        r = resolve(GenerateRequest("x", image=value), get_card(I2V))
        assert base64.b64decode(r.image) == data
        assert r.image_digest.startswith("sha256:") and len(r.image_digest) == 71


def test_the_digest_follows_the_bytes():
    a = resolve(GenerateRequest("x", image=encoded("PNG")), get_card(I2V))
    b = resolve(GenerateRequest("x", image=encoded("JPEG")), get_card(I2V))
    assert a.image_digest != b.image_digest


def test_bad_bytes_and_bad_base64():
    refused(GenerateRequest("x", image=b"not an image at all"), I2V, "decodable")
    refused(GenerateRequest("x", image="%%% not base64 %%%"), I2V, "base64")
    refused(GenerateRequest("x", image=12345), I2V, "bytes or a string")
    truncated = encoded("PNG", size=(64, 48))[:200]  # a valid header, pixels cut off
    refused(GenerateRequest("x", image=truncated), I2V, "decoded")


def test_unsupported_format():
    refused(GenerateRequest("x", image=encoded("GIF", mode="P")), I2V, "GIF", "PNG, JPEG or WebP")
    refused(GenerateRequest("x", image=encoded("BMP")), I2V, "BMP")


def test_too_large_in_bytes_and_in_pixels():
    data = encoded("PNG")
    refused(GenerateRequest("x", image=data), I2V, "bytes", policy=ImagePolicy(max_bytes=len(data) - 1))
    refused(GenerateRequest("x", image=encoded("PNG", size=(240, 160))), I2V, "240x160",
            policy=ImagePolicy(max_side=200))
    refused(GenerateRequest("x", image=encoded("PNG", size=(12, 8))), I2V, "12x8")  # min side 16


def test_wrong_aspect_is_refused_past_the_limit_and_resized_within_it():
    # the request is 48 x 32 (1.5); a square image would be stretched 1.5x
    e = refused(GenerateRequest("x", image=encoded("PNG", size=(64, 64))), I2V, "aspect", "1.25x")
    assert "48x32" in e.message
    ok = resolve(GenerateRequest("x", image=encoded("PNG", size=(66, 48))), get_card(I2V))  # 1.375: 9% off
    assert ok.image
    refused(GenerateRequest("x", image=encoded("PNG", size=(66, 48)), width=32, height=48), I2V, "aspect")


def test_image_is_required_by_i2v_and_refused_by_t2v():
    refused(GenerateRequest("x"), I2V, "needs an image")
    refused(GenerateRequest("x", image=encoded()), "wan-tiny-seeded", "text-to-video")
    assert resolve(GenerateRequest("x"), get_card("wan-tiny-seeded")).image is None


class _Serve(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 - the http.server hook name
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


@pytest.fixture
def http_image():
    _Serve.body = encoded("PNG")
    srv = HTTPServer(("127.0.0.1", 0), _Serve)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/first.png"
    srv.shutdown()
    srv.server_close()


def test_urls_are_fetched_only_when_the_policy_allows(http_image):
    refused(GenerateRequest("x", image=http_image), I2V, "not fetched")
    r = resolve(GenerateRequest("x", image=http_image), get_card(I2V), image_policy=ImagePolicy(allow_urls=True))
    assert base64.b64decode(r.image) == _Serve.body
    refused(GenerateRequest("x", image=http_image), I2V, "bytes",
            policy=ImagePolicy(allow_urls=True, max_bytes=len(_Serve.body) - 1))
    refused(GenerateRequest("x", image="http://127.0.0.1:9/none.png"), I2V, "could not fetch",
            policy=ImagePolicy(allow_urls=True, url_timeout_s=2.0))


def test_validate_image_direct_limits():
    img = validate_image(encoded("JPEG", size=(48, 32)), 32, 48)
    assert (img.format, img.width, img.height) == ("JPEG", 48, 32)
    assert img.data() == encoded("JPEG", size=(48, 32))


def test_scheduler_image_flags():
    from services.scheduler.config import parse_args
    base = ["--port", "0", "--pools", "encoder=h:1", "--pools", "denoiser=h:2", "--pools", "decoder=h:3"]
    cfg = parse_args(base)
    assert (cfg.allow_image_urls, cfg.image_url_timeout_s, cfg.max_image_bytes) == (False, 10.0, 16 << 20)
    cfg = parse_args(base + ["--allow-image-urls", "--image-url-timeout", "5", "--max-image-bytes", "4096"])
    assert (cfg.allow_image_urls, cfg.image_url_timeout_s, cfg.max_image_bytes) == (True, 5.0, 4096)
    with pytest.raises(InvalidRequest) as e:
        parse_args(base + ["--image-url-timeout", "0"])
    assert "image_url_timeout_s" in e.value.field
