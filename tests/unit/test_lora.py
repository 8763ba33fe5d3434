"""LoRA adapters on a CPU: the key maps and their refusals, versions, the adapter store (slots,
LRU, pins, unload waiting or refused), request validation, cache keys, and the denoiser refusing
an unknown adapter before its first step."""
from __future__ import annotations

import threading

import os

import pytest
import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest, NotFound, ResourceExhausted
from fastvideo3.models.wan.dit import WanDiTConfig
from fastvideo3.models.wan.lora import ADAPTED_LAYERS, layer_shapes, lora_key_map, parse_lora
from fastvideo3.request.schema import resolve_adapters
from fastvideo3.runtime.pool.adapters import AdapterStore
from tests.parity.test_lora import random_lora, to_wan_layout

pytestmark = pytest.mark.timeout(120)
CFG = WanDiTConfig(num_attention_heads=2, attention_head_dim=16, ffn_dim=48, text_dim=24, freq_dim=16,
                   num_layers=2, rope_max_seq_len=32)


def test_key_maps_are_explicit_and_complete():
    diff, wan = lora_key_map(CFG, "diffusers"), lora_key_map(CFG, "wan")
    assert len(diff) == 2 * len(ADAPTED_LAYERS) * CFG.num_layers
    assert len(wan) == 3 * len(ADAPTED_LAYERS) * CFG.num_layers
    assert diff["transformer.blocks.1.attn1.to_q.lora_A.weight"] == ("blocks.1.attn1.to_q", "down")
    assert wan["diffusion_model.blocks.0.self_attn.o.lora_up.weight"] == ("blocks.0.attn1.to_out.0", "up")
    assert wan["diffusion_model.blocks.1.ffn.0.alpha"] == ("blocks.1.ffn.net.0.proj", "alpha")


def test_both_layouts_give_the_same_adapter():
    sd = random_lora(CFG, 8, 0)
    a, b = parse_lora(sd, CFG, "x"), parse_lora(to_wan_layout(sd, alpha=4.0), CFG, "x")
    assert a.layout == "diffusers" and b.layout == "wan" and a.rank == b.rank == 8
    for name in a.layers:
        assert torch.allclose(a.layers[name][1], b.layers[name][1], atol=1e-6)
        assert torch.equal(a.layers[name][0], b.layers[name][0])


def test_version_is_the_content_digest():
    sd = random_lora(CFG, 4, 0)
    v1 = parse_lora(sd, CFG, "x").version
    assert parse_lora({k: v.clone() for k, v in sd.items()}, CFG, "other-id").version == v1
    key = next(iter(sd))
    sd[key] = sd[key].clone()
    sd[key][0, 0] += 1e-3
    assert parse_lora(sd, CFG, "x").version != v1


@pytest.mark.parametrize("edit, match", [
    (lambda sd: sd.update({"transformer.blocks.0.norm2.lora_A.weight": torch.zeros(4, 32)}), "blocks.0.norm2"),
    (lambda sd: sd.update({"transformer.blocks.9.attn1.to_q.lora_A.weight": torch.zeros(4, 32)}), "blocks.9"),
    (lambda sd: sd.update({"transformer.blocks.0.attn1.to_q.lora_A.weight": torch.zeros(4, 31)}),
     "blocks.0.attn1.to_q down weight has shape"),
    (lambda sd: sd.update({"transformer.blocks.1.ffn.net.2.lora_B.weight": torch.zeros(32, 5)}),
     "blocks.1.ffn.net.2 up weight has shape"),
    (lambda sd: sd.pop("transformer.blocks.0.attn2.to_v.lora_B.weight"), "blocks.0.attn2.to_v has no up"),
    (lambda sd: sd.update({"diffusion_model.blocks.0.self_attn.q.alpha": torch.tensor(1.0)}), "mixes"),
    (lambda sd: sd.update({"transformer.blocks.0.attn1.to_k.lora_A.weight": torch.full((4, 32), float("nan"))}),
     "non-finite"),
])
def test_unknown_or_misshaped_keys_are_refused_by_name(edit, match):
    sd = random_lora(CFG, 4, 0)
    edit(sd)
    with pytest.raises(InvalidRequest, match=match) as err:
        parse_lora(sd, CFG, "x")
    assert err.value.field == "adapter"


def _store(slots=2):
    return AdapterStore(layer_shapes(CFG), "cpu", torch.float32, slots=slots, max_rank=16)


def _adapter(seed, aid="a", rank=4):
    return parse_lora(random_lora(CFG, rank, seed), CFG, aid)


def test_store_lru_eviction_and_pins():
    store = _store(slots=2)
    a, b, c = _adapter(1, "a"), _adapter(2, "b"), _adapter(3, "c")
    for ad in (a, b, c):
        store.load(ad)
    ref = lambda ad: [(ad.adapter_id, ad.version, 1.0)]  # noqa: E731
    store.acquire("r1", ref(a))
    store.acquire("r2", ref(b))
    with pytest.raises(ResourceExhausted, match="slot"):  # both slots pinned by running requests
        store.acquire("r3", ref(c))
    store.release("r1")
    store.acquire("r3", ref(c))  # evicts a (least recently used, unpinned); its host copy stays
    assert store.counters["evictions"] == 1
    entries = {k[0]: e for k, e in store.entries.items()}
    assert entries["a"].slot is None and entries["c"].slot is not None
    store.release("r2")
    store.acquire("r4", ref(a))  # comes back on demand, into b's slot (b is the LRU unpinned one)
    assert entries["a"].slot is not None and entries["b"].slot is None
    # the slot holds exactly a's weights, zero-padded to the store's rank
    layer = next(iter(a.layers))
    down = store.down[layer][entries["a"].slot]
    assert torch.equal(down[:4], a.layers[layer][0]) and down[4:].abs().max() == 0


def test_unknown_adapter_is_not_found_by_name():
    store = _store()
    store.load(_adapter(1, "a"))
    with pytest.raises(NotFound, match=r"adapter ghost@sha256:00 is not loaded"):
        store.acquire("r", [("ghost", "sha256:00", 1.0)])


def test_new_version_keeps_the_old_one_for_its_requests():
    store = _store()
    v1, v2 = _adapter(1, "a"), _adapter(2, "a")
    store.load(v1)
    store.acquire("old", [("a", v1.version, 1.0)])
    store.load(v2)
    assert store.current["a"] == v2.version
    store.check([("a", v1.version, 1.0)])  # still served to requests admitted with it
    store.acquire("new", [("a", v2.version, 1.0)])
    assert {k[1] for k in store.entries} == {v1.version, v2.version}


def test_unload_in_use_is_refused_or_waits():
    store = _store()
    ad = _adapter(1, "a")
    store.load(ad)
    store.acquire("r1", [("a", ad.version, 1.0)])
    with pytest.raises(FailedPrecondition, match="in use by 1 request"):
        store.unload("a", wait_s=0.0)
    assert ("a", ad.version) in store.entries  # nothing was removed
    waiting = threading.Event()
    done: list = []

    def unload():
        waiting.set()
        done.append(store.unload("a", wait_s=60.0))

    t = threading.Thread(target=unload)
    t.start()
    assert waiting.wait(10)
    assert not done  # it waits for the request
    store.release("r1")
    t.join(30)
    assert done == [[ad.version]] and not store.entries and "a" not in store.current


def test_request_adapters_are_validated_and_pinned_to_versions():
    loaded = {"a": "sha256:1"}
    assert resolve_adapters([{"id": "a", "scale": 0.7}], loaded) == ({"id": "a", "version": "sha256:1", "scale": 0.7},)
    with pytest.raises(NotFound, match="'b' is not loaded") as err:
        resolve_adapters([{"id": "a"}, {"id": "b", "scale": 1}], loaded)
    assert err.value.field == "adapters[1].id"
    for bad, field in (([{"id": "a", "scale": 9.0}], "adapters[0].scale"),
                       ([{"id": "a"}, {"id": "a"}], "adapters[1].id"), ([{"id": "a b"}], "adapters[0].id"),
                       ([{"id": "a", "weight": 1}], "adapters[0]"), ([{"id": "a"}] * 5, "adapters")):
        with pytest.raises(InvalidRequest) as err:
            resolve_adapters(bad, loaded)
        assert err.value.field == field


def test_prompt_cache_key_carries_adapter_versions():
    from types import SimpleNamespace

    from fastvideo3.cache.text import TextFeatureCache
    cache = TextFeatureCache()
    ex = SimpleNamespace(card=SimpleNamespace(model_id="m", components={}, checkpoint=SimpleNamespace(root="")),
                         encoder=SimpleNamespace(digest="w", max_len=8, tokenizer=object()), precision="fp32",
                         device="cpu")
    k0 = cache.key(ex, ["p"])
    k1 = cache.key(ex, ["p"], ("a@sha256:1*0.7",))
    k2 = cache.key(ex, ["p"], ("a@sha256:2*0.7",))
    assert len({k0.digest(), k1.digest(), k2.digest()}) == 3
    assert k2.adapter_versions == ("a@sha256:2*0.7",)


def test_denoiser_refuses_unknown_adapter_before_its_first_step():
    from fastvideo3.card import resolve_card
    from fastvideo3.engine import Engine
    with Engine(resolve_card("wan-tiny")) as engine:
        with pytest.raises(NotFound, match="'nope' is not loaded"):
            engine.submit("x", adapters=[{"id": "nope", "scale": 1.0}], num_inference_steps=1)
        # a unit that names a version the pool does not hold fails with NOT_FOUND and leaves nothing
        run = engine.submit("x", num_frames=5, height=32, width=32, num_inference_steps=1)
        run.request = run.request.__class__.from_dict(
            {**run.request.to_dict(), "adapters": ({"id": "gone", "version": "sha256:0", "scale": 1.0},)})
        engine.run()
        assert run.status == "FAILED" and run.error.code == "NOT_FOUND" and "gone@sha256:0" in run.error.message
        assert not engine.denoiser.regions
        # an admitted request names its adapter from admission on: unloading it then is refused
        engine.load_adapter("a", tensors=random_lora(engine.denoiser.dit.cfg, 4, 0))
        run = engine.submit("x", adapters=[{"id": "a", "scale": 1.0}], num_frames=5, height=32, width=32,
                            num_inference_steps=1)
        with pytest.raises(FailedPrecondition, match="in use by 1 request"):
            engine.unload_adapter("a")
        engine.run()
        assert run.status == "SUCCEEDED"
        engine.result(run)
        assert engine.unload_adapter("a") and not engine.denoiser.adapters.entries


def test_denoiser_pool_lora_flags():
    from services.common.pool import parse_args
    cfg = parse_args("denoiser", ["--port", "0", "--lora-slots", "4", "--lora-max-rank", "32",
                                  "--merge-adapter", "style=/models/style.safetensors", "--merge-scale", "0.7"])
    assert (cfg.lora_slots, cfg.lora_max_rank, cfg.merge_adapter, cfg.merge_scale) == (
        4, 32, "style=/models/style.safetensors", 0.7)
    assert parse_args("denoiser", ["--port", "0", "--lora-merge-cache-gib", "0"]).lora_merge_cache_gib == 0
    for bad in (["--lora-max-rank", "48"], ["--lora-slots", "0"], ["--merge-adapter", "no-path"],
                ["--lora-merge-cache-gib", "-1"]):
        with pytest.raises(SystemExit):
            parse_args("denoiser", ["--port", "0", *bad])


# the Triton case runs under the interpreter, in test_lora_kernel.py's child process on a CPU
@pytest.mark.parametrize("kernel", ["torch"] + (["triton"] if os.environ.get("TRITON_INTERPRET") == "1" else []))
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("segments", [False, True])
def test_fast_path_applies_the_same_deltas_as_the_reference(kernel, grouped, stacked, segments):
    """The fast path's calls (fused QKV slices, every block's cross K/V, the FFN with its GELU in
    the LoRA pass) against forward hooks on the reference model, rows mixing two adapters and none.
    ``segments``: the batch as merged segments (each row's adapters folded into a weight copy)."""
    from fastvideo3.models.wan.dit import WanDiT
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.lora import adapted_linears
    torch.manual_seed(0)
    model = WanDiT(CFG).eval().requires_grad_(False)
    from fastvideo3.models.wan.lora import lora_groups
    # grouped: QKV and all cross K/V in stacked slots, two-pass kernels; else one tensor and one
    # one-pass launch per layer (a store built without groups)
    store = AdapterStore(layer_shapes(CFG), "cpu", torch.float32, slots=4, max_rank=16, impl=kernel,
                         groups=lora_groups(CFG) if grouped else None)
    store.grouped = grouped
    store.merge_segments, store.min_segment_tokens = segments, 0
    a, b = _adapter(1, "a", rank=8), _adapter(2, "b", rank=4)
    for ad in (a, b):
        store.load(ad)
    # stacked: a row with two adapters (one delta launch per adapter); else A, none, B, A: one
    # adapter per row, where the Triton path widens the GEMMs it pays to widen
    last = [("a", a.version, 0.7), ("b", b.version, -0.5)] if stacked else [("a", a.version, 0.7)]
    rows = [[("a", a.version, 0.7)], [], [("b", b.version, 1.3)], last]
    store.acquire("r", [("a", a.version, 0.7), ("b", b.version, 1.0)])
    x, t = torch.randn(4, 16, 2, 8, 8), torch.rand(4) * 1000
    text = torch.randn(4, 7, CFG.text_dim)
    with torch.no_grad():
        plain = model(x, t, text)
        handles = store.hook(model, adapted_linears(model, CFG))
        with store.batch(rows):
            ref = model(x, t, text)
        for h in handles:
            h.remove()
        fast = FastWanDiT(model, share_weights=False)
        fast.lora = store
        with store.batch(rows):
            got = fast(x, t, text)
        counters = store.merged_sets.counters
        assert counters["segment_forwards"] == int(segments) and counters["builds"] == ((3 if stacked else 2) if segments else 0)
        assert torch.allclose(fast(x, t, text), plain, atol=1e-4)  # outside a batch: no delta
    assert (ref[0] - plain[0]).abs().max() > 1e-3 and torch.allclose(ref[1], plain[1], atol=1e-5)
    assert torch.allclose(got, ref, atol=2e-4, rtol=1e-3), (got - ref).abs().max()


def test_merged_segments_runs_budget_and_fallbacks():
    """Runs of rows with the same adapters; a set per combination, kept under the byte budget
    (least recently used out, never one the batch uses); short segments, an over-budget batch and
    static mode take the low-rank path and say why; unloading an adapter drops its sets."""
    from types import SimpleNamespace

    from fastvideo3.runtime.pool.adapter_segments import runs
    a_ref, b_ref = ("a", "v1", 0.7), ("b", "v2", 1.0)
    assert runs([[a_ref], [a_ref], [], [b_ref], [a_ref]]) == [
        (0, 2, (a_ref,)), (2, 3, ()), (3, 4, (b_ref,)), (4, 5, (a_ref,))]
    assert runs([[a_ref, b_ref], [a_ref]])[0][2] == (a_ref, b_ref)

    store = _store(slots=3)
    ads = [_adapter(i + 1, name) for i, name in enumerate("abc")]
    for ad in ads:
        store.load(ad)
    store.merge_segments, store.min_segment_tokens = True, 8
    d, f = CFG.inner_dim, CFG.ffn_dim
    units = {"blocks.0.ffn.net.0.proj": (torch.randn(f, d), [("blocks.0.ffn.net.0.proj", 0)]),
             "blocks.0.attn1.qkv": (torch.randn(3 * d, d), [(f"blocks.0.attn1.to_{p}", j * d)
                                                           for j, p in enumerate("qkv")])}
    model = SimpleNamespace(lora_units=lambda: units)
    set_bytes = sum(w.numel() * 4 for w, _ in units.values())
    store.merged_sets.budget = 2 * set_bytes
    refs = {ad.adapter_id: (ad.adapter_id, ad.version, 0.5) for ad in ads}
    store.acquire("r", list(refs.values()))
    with store.batch([[refs["a"]], [refs["a"]], [], [refs["b"]]]):
        plan = store.segments(model, tokens=8)
    assert [(s, e, w is None) for s, e, w in plan.segments] == [(0, 2, False), (2, 3, True), (3, 4, False)]
    merged = plan.segments[0][2]
    a = store.entries[("a", ads[0].version)]
    layer = "blocks.0.attn1.to_k"
    want = units["blocks.0.attn1.qkv"][0][d:2 * d] + 0.5 * store.up[layer][a.slot] @ store.down[layer][a.slot]
    assert torch.allclose(merged["blocks.0.attn1.qkv"][d:2 * d], want, atol=1e-5)
    assert store.merged_sets.nbytes == 2 * set_bytes
    with store.batch([[refs["c"]], [refs["c"]]]):  # evicts the least recently used set
        assert store.segments(model, tokens=8) is not None
    assert store.merged_sets.counters["evictions"] == 1 and len(store.merged_sets.sets) == 2
    with store.batch([[refs["a"]], [refs["b"]], [refs["c"]]]):  # three sets cannot fit two's budget
        assert store.segments(model, tokens=8) is None
    assert "merge_cache_bytes" in store.merged_sets.last_fallback and len(store.merged_sets.sets) == 2
    with store.batch([[refs["c"]], [refs["a"]]]):
        assert store.segments(model, tokens=4) is None  # 4-token segments: under the minimum
        assert "8 tokens" in store.merged_sets.last_fallback
        store.static = True
        assert store.segments(model, tokens=8) is None and "static" in store.merged_sets.last_fallback
        store.static = False
    store.release("r")
    store.unload("c")
    assert all(k[0][0] != "c" for k in store.merged_sets.sets)
    assert store.describe()["merged_segments"]["counters"]["fallbacks"] == 3


@pytest.mark.parametrize("segments", [False, True])
def test_staged_forward_over_some_rows_keeps_their_adapters(segments):
    """A staged forward (a step cache's interceptors) running the blocks of some rows alone gives
    them the adapters they have in the batch: the store's subset of its plan, not the whole batch's."""
    from fastvideo3.models.wan.dit import WanDiT
    from fastvideo3.models.wan.fast import FastWanDiT
    from fastvideo3.models.wan.lora import lora_groups
    torch.manual_seed(0)
    model = WanDiT(CFG).eval().requires_grad_(False)
    store = AdapterStore(layer_shapes(CFG), "cpu", torch.float32, slots=4, max_rank=16, groups=lora_groups(CFG))
    store.merge_segments, store.min_segment_tokens = segments, 0
    a, b = _adapter(1, "a", rank=8), _adapter(2, "b", rank=4)
    for ad in (a, b):
        store.load(ad)
    ra, rb = ("a", a.version, 0.7), ("b", b.version, 1.3)
    rows = [[ra], [], [rb], [rb]]
    store.acquire("r", [ra, rb])
    x, t = torch.randn(4, 16, 2, 8, 8), torch.rand(4) * 1000
    text = torch.randn(4, 7, CFG.text_dim)
    fast = FastWanDiT(model, share_weights=False)
    fast.lora = store
    with torch.no_grad(), store.batch(rows):
        full = fast(x, t, text)
        stage = fast.embed(x, t, text)
        for sub in ([2, 3], [0], [1]):
            idx = torch.tensor(sub)
            with store.subset(sub):
                h = fast.run_blocks(stage.select(idx), stage.x[idx].contiguous(), 0, fast.num_blocks)
            got = fast.head(stage.select(idx), h)
            assert torch.allclose(got, full[idx], atol=2e-4, rtol=1e-3), (sub, (got - full[idx]).abs().max())
        assert store.active and store._row_refs == rows  # the batch's plan is back
        plain = fast.base(x, t, text)
    assert (full[2] - plain[2]).abs().max() > 1e-3 and torch.allclose(full[1], plain[1], atol=1e-4)


def test_parallel_replica_refuses_adapters():
    from types import SimpleNamespace

    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    ex = DenoiserExecutor.__new__(DenoiserExecutor)  # only the refusal is under test
    ex._forward, ex.mesh = object(), SimpleNamespace(world=2)
    with pytest.raises(FailedPrecondition, match="multi-rank"):
        ex._read_adapter("a", None, random_lora(CFG, 4, 0))


def test_widened_weights_are_kept_until_a_slot_changes():
    """The widened weight [W | up blocks] of a layer is built once per slot layout: a placement
    (or a cleared slot) drops it; past the byte budget it is built per call and not kept."""
    store = _store(slots=3)
    a, b = _adapter(1, "a"), _adapter(2, "b")
    store.load(a)
    store.acquire("r1", [("a", a.version, 1.0)])
    layer = "blocks.0.ffn.net.0.proj"
    w = torch.randn(CFG.ffn_dim, CFG.inner_dim)
    first = store._widened_weight(layer, w, 2)
    assert store._widened_weight(layer, w, 2) is first and store.describe()["widened_weight_bytes"] > 0
    assert torch.equal(first[:, :CFG.inner_dim], w) and torch.equal(first[:, CFG.inner_dim:CFG.inner_dim + 16],
                                                                   store.up[layer][0])
    store.load(b)
    store.acquire("r2", [("b", b.version, 1.0)])  # places b in slot 1: the kept weight is stale
    second = store._widened_weight(layer, w, 2)
    assert second is not first and torch.equal(second[:, CFG.inner_dim + 16:], store.up[layer][1])
    assert store.up[layer][1].abs().max() > 0
    store.widen_cache_bytes = 0
    store._drop_widened()
    assert store._widened_weight(layer, w, 2) is not store._widened_weight(layer, w, 2)
