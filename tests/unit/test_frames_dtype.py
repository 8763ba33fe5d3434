"""Frames cross pools as uint8 unless a consumer asks for float; over inproc they stay float."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.card.registry import resolve_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.pool.executors import DecoderExecutor, frames_as_float, frames_for_transport
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport import make_transport


class _Recording:
    """A transport wrapper that says which backend publishes and keeps what was published."""

    def __init__(self, backend: str):
        self.inner = make_transport("inproc", owner="decoder")
        self.backend = backend
        self.published: dict[str, torch.Tensor] = {}

    def publish(self, request_id, name, tensor):
        self.published[name] = tensor
        return self.inner.publish(request_id, name, tensor)

    def fetch(self, ref, *, deadline_s, copy=False):
        return self.inner.fetch(ref, deadline_s=deadline_s, copy=copy)

    def release(self, request_id):
        return self.inner.release(request_id)

    def stats(self):
        return self.inner.stats()


def _decode(backend: str, **params):
    card = resolve_card("wan-tiny")
    transport = _Recording(backend)
    decoder = DecoderExecutor(card, transport, "cpu")
    latents = transport.inner.publish("r", "latents", torch.randn(1, decoder.vae.z_dim, 3, 4, 4))
    unit = WorkUnit("u1", "r", "l1", "vae_tile", "decoder", card.model_id, "s",
                    params=params, inputs={"latents": latents})
    [res] = decoder.execute([unit])
    return res, transport.published.get("frames")


def test_frames_wire_format_round_trip():
    x = torch.rand(2, 4, 4, 3)
    wire = frames_for_transport(x, "uint8")
    assert wire.dtype == torch.uint8 and wire.numel() * wire.element_size() == x.numel()  # 4x fewer bytes
    assert float((frames_as_float(wire) - x).abs().max()) <= 0.5 / 255 + 1e-6
    assert torch.equal(frames_for_transport(x, "float32"), x)
    assert frames_for_transport(torch.tensor([-0.5, 1.5]), "uint8").tolist() == [0, 255]


@pytest.mark.timeout(120)
def test_decoder_publishes_uint8_across_pools_and_float_on_request_or_inproc():
    res, frames = _decode("shm")
    assert res.ok, res.error
    assert frames.dtype == torch.uint8 and res.outputs["frames"].dtype == "uint8"
    res, frames = _decode("shm", frames_dtype="float32")
    assert res.ok and frames.dtype == torch.float32
    res, frames = _decode("inproc")  # nothing is copied in one process: keep the exact floats
    assert res.ok and frames.dtype == torch.float32
    res, _ = _decode("shm", frames_dtype="float16")
    assert not res.ok and res.error.field == "frames_dtype"
    with pytest.raises(InvalidRequest):
        DecoderExecutor(resolve_card("wan-tiny"), _Recording("shm"), "cpu", frames_dtype="bf16")
