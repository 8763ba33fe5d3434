"""CUDA-graph shape buckets (ModelCard.graph_buckets -> fastvideo3/runtime/pool/dit_executor.py), on a CPU.

On a CPU the runtime export records its buckets eagerly instead of capturing CUDA graphs; the
contract is the same, so these tests drive the denoiser's warm phase and its step path through the
runtime's verbs: a batch runs as the replays of the prepared buckets of its shape that cover its rows
at the least cost (one bucket padded with copies of its first row, or several back to back), and
each replay's results are those of its rows run eagerly at the bucket's size (bit-equal; against
the unpadded eager run only close: a CPU BLAS picks its GEMM kernel by M); a batch of a shape with
no bucket runs eagerly; the pool's execute spans say which, with the padding rows.
A card that declares bad buckets is refused naming the field.
"""
from __future__ import annotations

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from fastvideo3.card.registry import card_validation_error, load_card_file
from fastvideo3.card.spec import MAX_GRAPH_BUCKETS, GraphBucketSpec, GraphShape, ModelCard
from fastvideo3.errors import CardError, InvalidRequest
from fastvideo3.loop.params import DiffusionStepParams
from fastvideo3.models.wan.cards import builtin_cards, wan_tiny_seeded
from fastvideo3.models.wan.family import latent_shape
from fastvideo3.models.wan.runtime_export import DitBucket, build_dit_runtime, card_buckets, cover_rows
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.telemetry import names as N
from fastvideo3.telemetry.hooks import PoolTelemetry
from fastvideo3.telemetry.tracing import init_tracing
from fastvideo3.transport import make_transport
from fastvideo3.vocab import Role, Sampler, UnitKind

pytestmark = pytest.mark.timeout(300)

FRAMES, SIZE = 9, 64
ROWS = [2, 4]
NO_CFG = "none"  # one forward row per request


def _card() -> ModelCard:
    return wan_tiny_seeded().model_copy(update={"graph_buckets": GraphBucketSpec(
        rows=ROWS, shapes=[GraphShape(frames=FRAMES, height=SIZE, width=SIZE)])})


def _executor(card: ModelCard, owner: str, capture: bool):
    from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
    ex = DenoiserExecutor(card, make_transport("inproc", owner=owner), "cpu", fast=True)
    if capture:
        ex.capture_graphs()  # the warm phase's capture; eager recordings on a CPU
    return ex


def _units(ex, card: ModelCard, seeds: list[int], batch_bucket: int | None = None,
           frames: int = FRAMES) -> list[WorkUnit]:
    """Step 0 of one request per seed (no CFG), its prompt embedding published on ``ex``'s transport."""
    shape = list(latent_shape(card, frames, SIZE, SIZE))
    text_dim = ex.dit.cfg.text_dim
    units = []
    for seed in seeds:
        rid = f"req-{seed}"
        embeds = torch.randn(1, card.max_text_tokens, text_dim, generator=torch.Generator().manual_seed(100 + seed))
        ref = ex.transport.publish(rid, "prompt_embeds", embeds)
        params = DiffusionStepParams(step=0, timestep=900.0, sigmas=[0.9, 0.5, 0.0], guidance=1.0, cfg_policy=NO_CFG,
                                     sampler=Sampler.EULER, solver_order=1, seed=seed, latent_shape=shape, final=False,
                                     batch_bucket=batch_bucket)
        units.append(WorkUnit(unit_id=f"{rid}-0", request_id=rid, loop_id="diffusion_denoise",
                              kind=UnitKind.DIFFUSION_STEP, role=Role.DENOISER, card_id=card.model_id,
                              shape_sig=f"s|{shape}", params=params, inputs={"prompt_embeds": ref}, step=0))
    return units


def _latents(ex, units) -> list[torch.Tensor]:
    return [ex.regions[u.request_id].latent.clone() for u in units]


@pytest.fixture(scope="module")
def graphs():
    card = _card()
    return card, _executor(card, "graphs", capture=True)


# ------------------------------------------------------------------------------------- bucket choice
def test_the_rows_are_covered_by_the_cheapest_replays_of_their_shape():
    sig = (16, 3, 8, 8)
    buckets = [DitBucket(r, sig, 64) for r in (8, 1, 4, 2)] + [DitBucket(16, (16, 5, 8, 8), 64)]

    def cover(rows, shape=sig, text=64, **kw):
        got = cover_rows(buckets, rows, shape, text, **kw)
        return None if got is None else [(b.rows, take) for b, take in got]

    assert cover(4) == [(4, 4)] and cover(1) == [(1, 1)]  # a bucket that fits exactly
    assert cover(3) == [(2, 2), (1, 1)]  # two exact replays beat one with a padding row
    assert cover(7) == [(8, 7)]  # ... until the extra replays cost more than the padding
    assert cover(12) == [(8, 8), (4, 4)]  # more rows than any bucket: several replays
    assert cover(17) == [(8, 8), (8, 8), (1, 1)]
    assert cover(7, may_pad=lambda b: False) == [(4, 4), (2, 2), (1, 1)]  # no padding: exact pieces
    assert cover(2, (16, 5, 8, 8)) == [(16, 2)]  # another shape: its own buckets
    assert cover(2, text=32) is None  # another text length: none
    odd = [DitBucket(r, sig, 64) for r in (4, 2)]
    assert cover_rows(odd, 3, sig, 64, may_pad=lambda b: False) is None  # 3 rows need a padded bucket


def test_card_buckets_are_the_cards_declaration_in_latent_shapes():
    card = _card()
    got = card_buckets(card)
    shape = latent_shape(card, FRAMES, SIZE, SIZE)
    assert [(b.rows, b.latent_shape, b.text_len) for b in got] == [(4, shape, 64), (2, shape, 64)]  # largest first
    for name, c in builtin_cards().items():  # every Wan T2V card declares buckets at its default shape
        if "image_encoder" in c.components:  # image-to-video steps run eagerly: none declared
            assert c.graph_buckets.count == 0, name
            continue
        lim = c.graph_buckets.shapes[0]
        assert (lim.frames, lim.height, lim.width) == (c.limits.default_frames, c.limits.default_height,
                                                       c.limits.default_width), name
        assert 1 in c.graph_buckets.rows and len(card_buckets(c)) == c.graph_buckets.count, name


def test_a_runtime_over_two_shapes_keeps_each_buckets_window():
    def fwd(x, t, text):
        return x * 0.5 + t.view(-1, 1, 1, 1, 1) + text.sum((1, 2)).view(-1, 1, 1, 1, 1)
    small, large = DitBucket(4, (2, 1, 2, 2), 3), DitBucket(2, (2, 3, 4, 4), 3)
    rt = build_dit_runtime(fwd, weights_digest="w", precision="fp32", dtype=torch.float32, text_dim=5,
                           buckets=[small, large])
    for b in (small, large):
        rt.prepare(b.key)
    g = torch.Generator().manual_seed(0)
    for b in (small, large, small):
        x = torch.randn(b.rows, *b.latent_shape, generator=g)
        t, text = torch.randn(b.rows, generator=g), torch.randn(b.rows, 3, 5, generator=g)
        rt.prepare(b.key)
        rt.set_input("latents", x)
        rt.set_input("timestep", t)
        rt.set_input("text", text)
        rt.fire("dit")
        assert torch.equal(rt.get_output("noise_pred"), fwd(x, t, text))
    rt.release()


# ---------------------------------------------------------------------------- padding and tracing
def _traced(ex, units):
    spans = InMemorySpanExporter()
    pool = PoolTelemetry(Role.DENOISER, tracing=init_tracing(Role.DENOISER, exporter=spans, set_global=False))
    results = pool.run_batch(units, ex.execute)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    execs = {s.attributes[N.A_REQUEST_ID]: dict(s.attributes) for s in spans.get_finished_spans()
             if s.name == N.SPAN_POOL_EXECUTE}
    return results, [execs[u.request_id] for u in units]


def test_a_batch_is_padded_to_its_bucket_and_traced(graphs):
    card, ex = graphs
    d = ex.describe()
    shape = latent_shape(card, FRAMES, SIZE, SIZE)
    sig = "x".join(map(str, shape)) + f".t{card.max_text_tokens}"
    assert [(g["batch"], g["signature"]) for g in d["graph_buckets"]] == [(4, sig), (2, sig)]
    assert all(set(g) == {"batch", "signature", "capture_s", "memory_bytes"} and g["capture_s"] > 0
               for g in d["graph_buckets"]) and d["graph_capture"] == "card"
    before = dict(ex.counters)
    units = _units(ex, card, [1, 2, 3])  # 3 rows: the r4 bucket, one padding row
    _, attrs = _traced(ex, units)
    for a in attrs:
        assert a[N.A_GRAPH_BUCKET] == f"r4.{sig}" and a[N.A_GRAPH_PADDING_ROWS] == 1
        assert N.A_GRAPH_EAGER_REASON not in a
    got = _latents(ex, units)
    assert ex.counters["graph_forwards"] == before["graph_forwards"] + 1
    assert ex.counters["padding_rows"] == before["padding_rows"] + 1
    assert ex.counters["rows"] == before["rows"] + 3  # real rows only
    one = _units(ex, card, [4])  # 1 row: the smallest bucket holding it is r2
    _, (a,) = _traced(ex, one)
    assert (a[N.A_GRAPH_BUCKET], a[N.A_GRAPH_PADDING_ROWS]) == (f"r2.{sig}", 1)
    for u in units + one:
        ex.release(u.request_id)

    # the same rows run eagerly, padded the same way (batch-invariant mode pads with row 0's copies
    # too): bit-equal. Unpadded: equal up to the BLAS's choice of GEMM kernel by M.
    eager = _executor(card, "eager", capture=False)
    padded = _units(eager, card, [1, 2, 3], batch_bucket=4)
    _, attrs = _traced(eager, padded)
    assert all(a[N.A_GRAPH_BUCKET] == N.GRAPH_EAGER and a[N.A_GRAPH_EAGER_REASON] == "no_graphs" for a in attrs)
    for g, want in zip(got, _latents(eager, padded)):
        assert torch.equal(g, want)
    for u in padded:
        eager.release(u.request_id)
    plain = _units(eager, card, [1, 2, 3])
    eager.execute(plain)
    for g, want in zip(got, _latents(eager, plain)):
        torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)


def test_a_batch_larger_than_any_bucket_runs_as_several_replays_and_says_so(graphs):
    card, ex = graphs
    sig = "x".join(map(str, latent_shape(card, FRAMES, SIZE, SIZE))) + f".t{card.max_text_tokens}"
    before = dict(ex.counters)
    units = _units(ex, card, [11, 12, 13, 14, 15])  # 5 rows: buckets of 4 and 2 rows, one padding row
    _, attrs = _traced(ex, units)
    for a in attrs:
        assert a[N.A_GRAPH_BUCKET] == f"r4.{sig}+r2.{sig}" and a[N.A_GRAPH_PADDING_ROWS] == 1
        assert N.A_GRAPH_EAGER_REASON not in a
    got = _latents(ex, units)
    assert ex.counters["graph_forwards"] == before["graph_forwards"] + 1
    assert ex.counters["cover_forwards"] == before["cover_forwards"] + 2
    assert ex.counters["padding_rows"] == before["padding_rows"] + 1
    assert ex.counters["rows"] == before["rows"] + 5
    for u in units:
        ex.release(u.request_id)
    # each replay's rows are those rows run eagerly at the replay's size: the first four bit-equal
    # to an eager 4-row batch, the fifth (padded to 2 rows) to an eager 2-row batch of it
    eager = _executor(card, "eager-cover", capture=False)
    first, last = _units(eager, card, [11, 12, 13, 14], batch_bucket=4), _units(eager, card, [15], batch_bucket=2)
    eager.execute(first)
    eager.execute(last)
    for g, want in zip(got, _latents(eager, first) + _latents(eager, last)):
        assert torch.equal(g, want)


def test_a_batch_of_a_shape_without_buckets_runs_eagerly_and_says_so(graphs):
    card, ex = graphs
    before = dict(ex.counters)
    units = _units(ex, card, [16, 17], frames=FRAMES + 4)  # a shape the card declares no bucket for
    _, attrs = _traced(ex, units)
    for a in attrs:
        assert a[N.A_GRAPH_BUCKET] == N.GRAPH_EAGER and a[N.A_GRAPH_EAGER_REASON] == "no_bucket"
        assert a[N.A_GRAPH_PADDING_ROWS] == 0
    assert ex.counters["eager_forwards"] == before["eager_forwards"] + 1
    assert ex.counters["graph_forwards"] == before["graph_forwards"]
    assert ex.counters["padding_rows"] == before["padding_rows"]
    for u in units:
        ex.release(u.request_id)


def test_the_warm_phase_captures_on_cuda_only_and_can_be_off(graphs):
    from services.common.pool import parse_args
    from services.denoiser.__main__ import warm
    card = _card()
    ex = _executor(card, "warm", capture=False)
    # the runtime declares the card's buckets whether or not they are captured: one fingerprint
    assert ex.identity.fingerprint == graphs[1].identity.fingerprint
    assert parse_args(Role.DENOISER, ["--port", "0"]).graph_buckets == "card"  # the default
    warm(parse_args(Role.DENOISER, ["--port", "0"]), ex)
    assert ex.describe()["graph_buckets"] == [] and "CUDA only" in ex.graph_capture  # a CPU pool: eager
    warm(parse_args(Role.DENOISER, ["--port", "0", "--graph-buckets", "off"]), ex)
    assert ex.graph_capture == "off" and ex.describe()["graph_buckets"] == []
    with pytest.raises(InvalidRequest) as e:
        ex.warm_graphs("always")
    assert e.value.field == "graph_buckets"
    with pytest.raises(SystemExit):
        parse_args(Role.DENOISER, ["--port", "0", "--graph-buckets", "on"])


# ---------------------------------------------------------------------------------- card validation
def _refused(graph_buckets: dict) -> CardError:
    data = _card().model_dump(mode="json")
    data["graph_buckets"] = graph_buckets
    with pytest.raises(ValidationError) as e:
        ModelCard.model_validate(data)
    return card_validation_error(e.value)


SHAPE = {"frames": FRAMES, "height": SIZE, "width": SIZE}


@pytest.mark.parametrize("buckets,field,words", [
    ({"rows": [0, 2], "shapes": [SHAPE]}, "graph_buckets.rows", "rows[0] is 0"),
    ({"rows": [2, 2], "shapes": [SHAPE]}, "graph_buckets.rows", "repeat"),
    ({"rows": [1, 999], "shapes": [SHAPE]}, "graph_buckets.rows", "[1, 256]"),
    ({"rows": [1], "shapes": []}, "graph_buckets", "both"),
    ({"rows": list(range(1, MAX_GRAPH_BUCKETS + 2)), "shapes": [SHAPE]}, "graph_buckets", f"at most {MAX_GRAPH_BUCKETS}"),
    ({"rows": [1], "shapes": [{**SHAPE, "frames": 10}]}, "graph_buckets", "shapes[0]"),
    ({"rows": [1], "shapes": [SHAPE, {**SHAPE, "height": 100}]}, "graph_buckets", "shapes[1]"),
    ({"rows": [1], "shapes": [{**SHAPE, "width": 4096}]}, "graph_buckets", "width"),
    ({"rows": [1], "shapes": [SHAPE, SHAPE]}, "graph_buckets", "repeat"),
    ({"rows": [1], "shapes": [SHAPE], "batch": [4]}, "graph_buckets.batch", "Extra"),
])
def test_a_card_with_bad_buckets_is_refused_naming_the_field(buckets, field, words):
    err = _refused(buckets)
    assert err.field == field and words in str(err), str(err)


def test_a_card_file_with_bad_buckets_is_refused(tmp_path):
    import json
    data = _card().model_dump(mode="json")
    data["graph_buckets"] = {"rows": [-1], "shapes": [SHAPE]}
    path = tmp_path / "card.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CardError) as e:
        load_card_file(path)
    assert e.value.field == "graph_buckets.rows"
    data["graph_buckets"] = {"rows": [1, 2], "shapes": [SHAPE]}
    path.write_text(json.dumps(data))
    assert load_card_file(path).graph_buckets.count == 2



def test_a_card_file_narrowing_the_limits_drops_only_buckets_it_cannot_serve(tmp_path):
    import json
    from fastvideo3.card.registry import get_card
    base = get_card("wan-tiny")
    assert base.graph_buckets.count and max(s.frames for s in base.graph_buckets.shapes) > 17
    path = tmp_path / "card.json"
    path.write_text(json.dumps({"extends": "wan-tiny", "model_id": "wan-tiny-17f",
                                "limits": {"max_frames": 17, "default_frames": 17}}))
    assert load_card_file(path).graph_buckets.count == 0  # inherited at 33 frames: none kept
    path.write_text(json.dumps({"extends": "wan-tiny", "model_id": "wan-tiny-wide",
                                "limits": {"max_guidance": 15.0}}))
    assert load_card_file(path).graph_buckets == base.graph_buckets  # still served: kept
    path.write_text(json.dumps({"extends": "wan-tiny", "model_id": "wan-tiny-17f",
                                "limits": {"max_frames": 17, "default_frames": 17},
                                "graph_buckets": base.graph_buckets.model_dump(mode="json")}))
    with pytest.raises(CardError) as e:  # declared by the file itself: refused, naming the field
        load_card_file(path)
    assert e.value.field.startswith("graph_buckets")


# ------------------------------------------------------------------------------------------- bench
def test_the_bench_card_is_seeded_with_the_buckets_asked_for(monkeypatch):
    """bench/graph_buckets.py needs CUDA to run; its card (seeded real-size DiT, bucket override) does not."""
    import argparse
    from pathlib import Path
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "bench"))
    import graph_buckets
    args = argparse.Namespace(card="wan2.1-t2v-1.3b", checkpoint_root=None, shapes="17x256x256", rows="1,4")
    card = graph_buckets.bench_card(args)
    assert card.components["transformer"].source == "seeded"
    assert [b.key for b in card_buckets(card)] == ["r4.16x5x32x32.t512", "r1.16x5x32x32.t512"]
    args.shapes = args.rows = None
    assert card_buckets(graph_buckets.bench_card(args)) == card_buckets(builtin_cards()["wan2.1-t2v-1.3b"])
    if not torch.cuda.is_available():
        assert graph_buckets.main(["--out", "unused.json"]) == 2  # refuses to run without CUDA


def test_padding_stops_where_the_padded_forward_outgrows_the_token_limit(graphs, monkeypatch):
    from fastvideo3.runtime.pool import dit_graphs
    card, ex = graphs
    shape = latent_shape(card, FRAMES, SIZE, SIZE)
    tokens = dit_graphs._tokens_per_row(shape[1:], ex.dit.cfg.patch_size)
    sig = "x".join(map(str, shape)) + f".t{card.max_text_tokens}"
    # a limit below 2 padded rows: 3 rows pad into neither r4 nor r2 (and no exact cover of 3 rows
    # exists), 2 rows fill r2 exactly
    monkeypatch.setattr(dit_graphs, "PAD_TOKEN_LIMIT", tokens)
    before = dict(ex.counters)
    three = _units(ex, card, [21, 22, 23])
    _, attrs = _traced(ex, three)
    assert all(a[N.A_GRAPH_BUCKET] == N.GRAPH_EAGER and a[N.A_GRAPH_EAGER_REASON] == "padding_cost" for a in attrs)
    two = _units(ex, card, [24, 25])
    _, attrs = _traced(ex, two)
    assert all(a[N.A_GRAPH_BUCKET] == f"r2.{sig}" and a[N.A_GRAPH_PADDING_ROWS] == 0 for a in attrs)
    assert ex.counters["padding_rows"] == before["padding_rows"]
    for u in three + two:
        ex.release(u.request_id)
