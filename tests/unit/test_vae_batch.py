"""The decoder pool batches VAE decodes across requests: one call per latent shape, each request's
frames equal to decoding it alone (bit-equal in fp32, within the card's tolerance in bf16), the
card's decode precision, memory-bounded calls, and the time-chunked Wan decode equal to diffusers'."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.card.registry import get_card, resolve_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.pool.vae_executor import DecoderExecutor
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport import make_transport

#: a small AutoencoderKLWan (the real architecture: causal 3-D convs, time upsamplers, attention)
SMALL_WAN_VAE = dict(base_dim=4, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                     temperal_downsample=[False, True, True])


def _wan_vae_card(**precision):
    card = get_card("wan-tiny-seeded")
    data = card.model_dump(mode="json")
    data["components"]["vae"]["config"] = dict(SMALL_WAN_VAE)
    data["precision"].update(precision)
    return type(card).model_validate(data)


def _units(transport, latents: list[torch.Tensor], **params):
    units = []
    for i, lat in enumerate(latents):
        ref = transport.publish(f"r{i}", "latents", lat)
        units.append(WorkUnit(f"u{i}", f"r{i}", "l", "vae_tile", "decoder", "m", "s", params=dict(params),
                              inputs={"latents": ref}))
    return units


def _frames(transport, res) -> torch.Tensor:
    assert res.ok, res.error
    return transport.fetch(res.outputs["frames"], deadline_s=5)


def _alone_and_batched(card, latents, **kw):
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(card, transport, "cpu", **kw)
    alone = [_frames(transport, dec.execute(_units(transport, [lat], frames_dtype="float32"))[0]).clone()
             for lat in latents]
    calls = dec.counters["decode_calls"]
    batched = dec.execute(_units(transport, latents, frames_dtype="float32"))
    return dec, alone, [_frames(transport, r) for r in batched], dec.counters["decode_calls"] - calls


def test_patch_vae_batch_is_one_call_per_shape_and_bit_equal_to_alone():
    g = torch.Generator().manual_seed(0)
    card = resolve_card("wan-tiny")
    lat = [torch.randn(1, 16, 3, 4, 4, generator=g) for _ in range(3)] + [torch.randn(1, 16, 2, 4, 6, generator=g)]
    dec, alone, batched, calls = _alone_and_batched(card, lat)
    assert dec.precision == "fp32"
    assert calls == 2  # three latents of one shape in one call, the other shape in another
    assert dec.counters["max_decode_batch_seen"] == 3
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)


def test_wan_vae_batch_bit_equal_in_fp32():
    g = torch.Generator().manual_seed(1)
    lat = [torch.randn(1, 16, 2, 2, 3, generator=g) for _ in range(3)]
    dec, alone, batched, calls = _alone_and_batched(_wan_vae_card(), lat)
    assert calls == 1 and dec.precision == "fp32" and not dec.vae.fast  # CPU: diffusers' decode as is
    for a, b in zip(alone, batched):
        assert a.shape == (5, 16, 24, 3)
        assert torch.equal(a, b)


def test_wan_vae_bf16_card_decodes_in_bf16_within_its_tolerance():
    g = torch.Generator().manual_seed(2)
    lat = [torch.randn(1, 16, 2, 2, 2, generator=g) for _ in range(2)]
    card = _wan_vae_card(vae_cpu="bf16")
    dec, alone, batched, _ = _alone_and_batched(card, lat)
    assert dec.precision == "bf16" and dec.vae.dtype == torch.bfloat16
    fp32 = DecoderExecutor(_wan_vae_card(), make_transport("inproc", owner="f"), "cpu").vae
    ref = [fp32.decode(lat)[0] for lat in lat]  # the same latents in fp32
    tol = card.parity.vae_bf16_frames_abs
    for a, b, r in zip(alone, batched, ref):
        assert float((b - a).abs().max()) <= tol  # batched vs alone, both bf16
        assert 0 < float((b - r).abs().max()) <= tol  # bf16 vs fp32: different, within the card's bounds
        assert float((b - r).abs().mean()) <= card.parity.vae_bf16_frames_mean_abs


def test_card_decode_precision_defaults():
    assert get_card("wan-tiny").precision.vae_for("cuda") == "fp32"  # no declaration: fp32
    real = get_card("wan2.1-t2v-1.3b").precision
    assert real.vae_for("cuda") == "bf16" and real.vae_for("cpu") == "fp32"
    from fastvideo3.card.registry import fp8_variant
    assert fp8_variant(get_card("wan2.1-t2v-1.3b"), "x-fp8").precision.vae_cuda == "bf16"
    with pytest.raises(Exception, match="vae_cuda"):
        _wan_vae_card(vae_cuda="fp8_e4m3")


@pytest.mark.parametrize("time_chunk", [1, 3])
def test_time_chunked_decode_matches_diffusers_per_frame_decode(time_chunk):
    from fastvideo3.models.wan.components import VideoDecoder
    from fastvideo3.models.wan.vae_decode import chunked_decode, chunks
    assert chunks(6, 2) == [(0, 1), (1, 3), (3, 5), (5, 6)]
    vae = VideoDecoder(_wan_vae_card(), "cpu").model
    z = torch.randn(1, 16, 5, 2, 2, generator=torch.Generator().manual_seed(3))
    ref = vae.decode(z, return_dict=False)[0]
    out = chunked_decode(vae, z, time_chunk)
    assert out.shape == ref.shape == (1, 3, 17, 16, 16)
    if time_chunk == 1:
        assert torch.equal(out, ref)  # diffusers' own schedule
    else:  # the same causal computation, other conv shapes: equal to fp32 rounding
        assert float((out - ref).abs().max()) <= 1e-5


def test_decode_batch_bound_and_oom_split():
    card = resolve_card("wan-tiny")
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(card, transport, "cpu", max_decode_batch=2)
    real = dec.vae.decode
    sizes = []

    def decode(z):
        sizes.append(z.shape[0])
        if z.shape[0] > 1 and len(sizes) == 1:
            raise torch.OutOfMemoryError("simulated")
        return real(z)

    dec.vae.decode = decode
    lat = [torch.randn(1, 16, 2, 4, 4) for _ in range(3)]
    res = dec.execute(_units(transport, lat))
    assert all(r.ok for r in res)
    assert sizes == [2, 1, 1, 1]  # [2 -> OOM -> 1 + 1], then the third in its own call (bound 2)
    assert dec.counters["oom_splits"] == 1
    with pytest.raises(InvalidRequest, match="max_decode_batch"):
        DecoderExecutor(card, transport, "cpu", max_decode_batch=0)


def test_one_bad_unit_fails_alone():
    card = resolve_card("wan-tiny")
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(card, transport, "cpu")
    units = _units(transport, [torch.randn(1, 16, 2, 4, 4) for _ in range(2)])
    units[1].params["frames_dtype"] = "bf16"
    ok, bad = dec.execute(units)
    assert ok.ok and not bad.ok and bad.error.field == "frames_dtype"


def _card_with_shapes(name: str, shapes: list[tuple[int, int, int]]):
    card = get_card(name)
    data = card.model_dump(mode="json")
    data["graph_buckets"] = {"rows": [1, 2], "shapes": [{"frames": f, "height": h, "width": w} for f, h, w in shapes]}
    return type(card).model_validate(data)


def test_warm_plan_covers_bucket_shapes_at_batch_sizes_within_the_pixel_budget():
    from fastvideo3.runtime.pool.vae_executor import WARM_PIXEL_BUDGET, warm_plan
    card = _card_with_shapes("wan2.1-t2v-1.3b", [(17, 256, 256), (81, 480, 832), (81, 720, 1280)])
    small, default, large = warm_plan(card, 4)
    assert small == ((17, 256, 256), (16, 5, 32, 32), [1, 2, 3, 4])
    assert default == ((81, 480, 832), (16, 21, 60, 104), [1])  # the budget is one such clip
    assert large[2] == [1]  # larger than the budget: still batch 1 (what every request needs)
    wide = warm_plan(card, 64)[0][2]
    assert wide == list(range(1, WARM_PIXEL_BUDGET // (17 * 256 * 256) + 1)) and len(wide) == 29


def test_warm_decode_decodes_each_planned_batch_and_stops_a_shape_at_oom(monkeypatch):
    card = resolve_card("wan-tiny")
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(card, transport, "cpu", max_decode_batch=3)
    assert dec.warm_decode() == [] and dec.describe()["decode_warm"] == []  # a CPU tunes nothing
    with pytest.raises(InvalidRequest, match="decode_warm"):
        dec.warm_decode("always")
    dec.card = _card_with_shapes("wan-tiny", [(9, 64, 64), (17, 64, 64)])
    seen = []

    def decode(z):
        seen.append(tuple(z.shape))
        if z.shape[2] == 5 and z.shape[0] == 2:  # the 17-frame shape's batch of 2 runs out of memory
            raise torch.OutOfMemoryError("no room")
        return torch.empty(z.shape[0], 1, 8, 8, 3)

    monkeypatch.setattr(dec, "device", "cuda")
    monkeypatch.setattr(dec.vae, "fast", True)
    monkeypatch.setattr(dec.vae, "decode", decode)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    zeros = torch.zeros
    monkeypatch.setattr(torch, "zeros", lambda *a, device=None, **kw: zeros(*a, **kw))  # the "cuda" zeros on the CPU
    warmed = dec.warm_decode()
    assert [w["batches"] for w in warmed] == [[1, 2, 3], [1]]
    assert [s[0] for s in seen] == [1, 2, 3, 1, 2]
    assert dec.describe()["decode_warm"] == warmed
    assert dec.warm_decode("off") == []


def test_every_vae_call_runs_on_the_executors_one_thread():
    """cuDNN's tuned plans are per thread in PyTorch: a decode on each caller's own thread (a gRPC
    worker) would tune again. Whichever thread executes, the VAE runs on the executor's thread."""
    import threading
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(resolve_card("wan-tiny"), transport, "cpu")
    seen, real = [], dec.vae.decode

    def recording(z):
        seen.append(threading.get_ident())
        return real(z)

    dec.vae.decode = recording
    latents = [torch.randn(1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    callers, results = [], []
    alive = threading.Barrier(3)  # no caller ends (and frees its thread id) before all have run

    def run(i: int) -> None:
        callers.append(threading.get_ident())
        results.append(dec.execute(_units(transport, [latents[i]]))[0])
        alive.wait(timeout=60)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert all(r.ok for r in results) and len(results) == 3
    assert len(seen) == 3 and len(set(callers)) == 3
    assert len(set(seen)) == 1 and seen[0] not in callers and seen[0] != threading.get_ident()


def test_batch_files_are_encoded_side_by_side_and_a_failed_encode_fails_its_unit_alone(monkeypatch):
    """A decode batch's files go to the encode threads together (each unit gets its own file, the
    same bytes as encoding it alone); an encode that raises fails that unit and no other."""
    import threading

    import numpy as np

    from fastvideo3.runtime.pool import vae_executor as ve
    g = torch.Generator().manual_seed(4)
    transport = make_transport("inproc", owner="t")
    dec = DecoderExecutor(resolve_card("wan-tiny"), transport, "cpu")
    lat = [torch.randn(1, 16, 2, 4, 4, generator=g) for _ in range(3)]
    alone = [dec.execute(_units(transport, [x], encode="npy"))[0].inline for x in lat]
    real, threads, calls, lock = ve.encode_media, set(), [], threading.Lock()

    def spy(frames, fmt, fps):
        with lock:
            threads.add(threading.current_thread().name)
            calls.append(frames)
            second = len(calls) == 2
        if second:
            raise RuntimeError("encoder crashed")
        return real(frames, fmt, fps)

    monkeypatch.setattr(ve, "encode_media", spy)
    res = dec.execute(_units(transport, lat, encode="npy"))
    assert dec.counters["max_decode_batch_seen"] == 3 and len(calls) == 3
    assert all(name.startswith("decoder-encode") for name in threads)
    failed = [r for r in res if not r.ok]
    assert len(failed) == 1 and "encoder crashed" in str(failed[0].error)
    for i, r in enumerate(res):
        if r.ok:
            assert r.inline == alone[i] and r.payload["media_bytes"] == len(alone[i])
            assert np.load(__import__("io").BytesIO(r.inline)).shape == (5, 32, 32, 3)
