"""The typed request context: its JSON round trip (the form request checkpoints and store records
hold), the flat form earlier checkpoints hold, refusals naming the key, and a whole run's
checkpoint record round trip with the context's refs coming back as TensorRef objects."""
from __future__ import annotations

import json

import pytest

from fastvideo3.card import get_card
from fastvideo3.errors import DataLoss, FailedPrecondition, InvalidRequest
from fastvideo3.loop import LoopDriver, RequestContext, TextEncodeLoop
from fastvideo3.loop.protocol import LoopResult
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.runtime.durability import resume
from fastvideo3.runtime.durability.resume import RunRecord, rebuild_run, record_of, request_meta
from fastvideo3.runtime.scheduling.scheduler import RequestRun
from fastvideo3.transport.ref import TensorRef, expected_nbytes

pytestmark = pytest.mark.timeout(60)
CARD = get_card("wan-tiny")


def _ref(name: str, shape=(1, 8, 4), backend: str = "shm") -> TensorRef:
    return TensorRef("encoder-0", f"r1/{name}#1", "float32", tuple(shape), expected_nbytes("float32", tuple(shape)),
                     "xxh64:00ff", backend, {"segment": "fv3-x-1", "generation": 7})


def _full() -> RequestContext:
    return RequestContext(
        refs={"prompt_embeds": _ref("prompt_embeds"), "negative_embeds": _ref("negative_embeds")},
        payloads={"text_encode": {}, "diffusion_denoise": {"latent_norms": [1.5, 0.25]}},
        encode="npy", fps=12, rewards=["image_quality"], metadata={"user": "u1"}, detached=True, batch_bucket=4,
        extensions={"my_policy": {"k": [1, 2.5]}})


def test_round_trips_through_json_exactly():
    ctx = _full()
    text = json.dumps(ctx.to_dict(), allow_nan=False)
    back = RequestContext.from_dict(json.loads(text))
    assert back == ctx
    assert all(type(r) is TensorRef for r in back.refs.values())
    assert isinstance(back.refs["prompt_embeds"].descriptor["generation"], int)
    assert back.latents is None and back.frames is None
    assert RequestContext.from_dict(RequestContext().to_dict()) == RequestContext()


def test_extensions_keep_only_what_survives_json():
    ctx = RequestContext(extensions={"ok": {"a": 1}, "not_json": object()})
    assert RequestContext.from_dict(ctx.to_dict()).extensions == {"ok": {"a": 1}}


def test_reads_the_flat_form_of_earlier_checkpoints():
    flat = {"prompt_embeds": _ref("prompt_embeds").to_dict(), "latents": _ref("latents", (1, 16, 3, 4, 4)).to_dict(),
            "payloads": {"text_encode": {}}, "encode": "mp4", "fps": 16, "rewards": [], "metadata": {},
            "detached": True, "batch_bucket": 2}
    ctx = RequestContext.from_dict(flat)
    assert set(ctx.refs) == {"prompt_embeds", "latents"} and type(ctx.latents) is TensorRef
    assert (ctx.encode, ctx.fps, ctx.detached, ctx.batch_bucket) == ("mp4", 16, True, 2)
    assert RequestContext.from_dict({"encode": "npy"}).encode == "npy"  # submit-time options, as callers pass them


@pytest.mark.parametrize("data,field", [
    ({"refs": {}, "nope": 1}, "ctx.nope"),
    ({"refs": {"latents": {"buffer_id": "z"}}}, "ctx.refs.latents.owner"),
    ({"k": [1, 2.5]}, "ctx.refs.k.ref"),
    ({"fps": 0}, "ctx.fps"),
    ({"batch_bucket": 0}, "ctx.batch_bucket"),
    ({"metadata": {"a": 1}}, "ctx.metadata"),
    ({"payloads": [1]}, "ctx.payloads"),
])
def test_a_bad_key_is_refused_naming_it(data, field):
    with pytest.raises(InvalidRequest) as e:
        RequestContext.from_dict(data)
    assert e.value.field == field


def test_of_copies_and_merge_keeps_refs():
    ctx = _full()
    mine = RequestContext.of(ctx)
    mine.rewards.append("x")
    mine.refs.clear()
    assert ctx.rewards == ["image_quality"] and len(ctx.refs) == 2
    ctx.merge_options(RequestContext(encode="mp4", fps=8))
    assert (ctx.encode, ctx.fps, ctx.detached, ctx.batch_bucket, len(ctx.refs)) == ("mp4", 8, False, 4, 2)
    with pytest.raises(InvalidRequest) as e:
        RequestContext().ref("latents")
    assert e.value.field == "ctx.refs.latents"


def _run_mid_program() -> RequestRun:
    req = resolve(GenerateRequest(prompt="a red circle", seed=7, num_inference_steps=3, request_id="r1"), CARD)
    run = RequestRun(request=req, card=CARD, ctx=RequestContext(encode="npy", fps=12, metadata={"u": "v"}))
    run.ctx.add_loop_result("text_encode", LoopResult("r1", "text_encode", outputs={
        "prompt_embeds": _ref("prompt_embeds"), "negative_embeds": _ref("negative_embeds")}, payload={"n": 1}))
    loop = TextEncodeLoop()  # any loop state: the record keeps its JSON
    run.driver = LoopDriver(loop, loop.init(req, CARD, run.ctx))
    return run


def test_a_run_record_round_trips_with_refs_as_objects():
    run = _run_mid_program()
    rec = RunRecord.from_bytes(record_of(run).to_bytes())
    assert rec.ctx == json.loads(json.dumps(run.ctx.to_dict()))
    back = rebuild_run(rec, CARD)
    assert back.ctx == run.ctx and all(type(r) is TensorRef for r in back.ctx.refs.values())
    assert back.driver.state == run.driver.state
    assert RequestContext.from_dict(request_meta(run)["ctx"]) == run.ctx


def test_a_version_1_record_with_the_flat_context_is_still_read():
    run = _run_mid_program()
    rec = record_of(run)
    flat = {**{n: r.to_dict() for n, r in run.ctx.refs.items()}, "payloads": dict(run.ctx.payloads),
            "encode": "npy", "fps": 12, "rewards": [], "metadata": {"u": "v"}}
    rec.ctx = flat
    blob = rec.to_bytes().replace(b'"version":2', b'"version":1')
    assert b'"version":1' in blob
    back = rebuild_run(RunRecord.from_bytes(blob), CARD)
    assert back.ctx == run.ctx
    with pytest.raises(FailedPrecondition):
        RunRecord.from_bytes(rec.to_bytes().replace(b'"version":2', b'"version":9'))
    rec.ctx = {"refs": {"prompt_embeds": {"owner": ""}}}
    with pytest.raises(DataLoss) as e:
        rebuild_run(RunRecord.from_bytes(rec.to_bytes()), CARD)
    assert e.value.field.startswith("checkpoint.ctx.refs.prompt_embeds")
    assert resume.VERSION == 2 and 1 in resume.READABLE_VERSIONS
