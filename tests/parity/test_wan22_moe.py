"""Wan2.2 two-expert (A14B layout) parity: C0 of each expert, C1 of whole generations against
diffusers' WanPipeline(transformer_2=..., boundary_ratio=...) with both placements (one pool holding
both experts, one pool per expert with the latent handed over at the switch), the loop's expert
semantics, the interleave gate, and no reload at the switch."""
import numpy as np
import pytest
import torch

from fastvideo3.card import get_card, resolve_card
from fastvideo3.errors import InvalidRequest
from fastvideo3.loop.context import RequestContext
from fastvideo3.loop.denoise import DenoiseLoop
from fastvideo3.models.wan.components import load_dit
from fastvideo3.parity import rel_error
from fastvideo3.request.schema import GenerateRequest, resolve
from fastvideo3.engine import Engine
from tests.helpers_moe import OPTS, PROMPT, moe_dir  # noqa: F401 - moe_dir: the module fixture

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def moe_euler_dir(tmp_path_factory):
    from fastvideo3.testing.synthetic_layouts import build_wan22_moe_dir
    return build_wan22_moe_dir(tmp_path_factory.mktemp("moe-euler") / "wan22", seed=4, boundary_ratio=0.6,
                               scheduler="euler", flow_shift=5.0)


def _reference(path, seed, guidance, guidance_2=None, first_only=False):
    from diffusers import WanPipeline
    pipe = WanPipeline.from_pretrained(str(path))
    if first_only:  # what a loader that ignored transformer_2 would reproduce
        pipe.transformer_2 = None
        pipe.register_to_config(boundary_ratio=None)
    kw = dict(prompt=PROMPT, negative_prompt="blurry", guidance_scale=guidance, **OPTS)
    if guidance_2 is not None:
        kw["guidance_scale_2"] = guidance_2
    lat = pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="latent").frames
    if first_only:
        return lat, None
    return lat, pipe(**kw, generator=torch.Generator().manual_seed(seed), output_type="np").frames[0]


@pytest.mark.parametrize("expert", ["transformer", "transformer_2"])
def test_c0_each_expert_matches_reference(moe_dir, expert):
    from diffusers import WanTransformer3DModel
    card = resolve_card(str(moe_dir))
    ours, digest = load_dit(card, "cpu", torch.float32, component=expert)
    ref = WanTransformer3DModel.from_pretrained(str(moe_dir / expert)).eval()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(2, 16, 3, 6, 8, generator=g)
    t = torch.tensor([990.0, 250.0])
    txt = torch.randn(2, 7, ref.config.text_dim, generator=g)
    with torch.no_grad():
        want = ref(x, t, txt, return_dict=False)[0]
        got = ours(x, t, txt)
    assert rel_error(got, want) <= card.parity.c0_dit_rel
    assert digest.startswith("sha256:")


def test_experts_differ(moe_dir):
    card = resolve_card(str(moe_dir))
    a, _ = load_dit(card, "cpu", torch.float32, component="transformer")
    b, _ = load_dit(card, "cpu", torch.float32, component="transformer_2")
    assert not torch.equal(a.proj_out.weight, b.proj_out.weight)


@pytest.mark.parametrize("expert_pools", [False, True], ids=["one-pool", "pool-per-expert"])
@pytest.mark.parametrize("seed, guidance, guidance_2", [(0, 5.0, 2.0), (3, 4.0, None)])
def test_c1_generation_matches_two_expert_wanpipeline(moe_dir, expert_pools, seed, guidance, guidance_2):
    card = resolve_card(str(moe_dir))
    want_lat, want_frames = _reference(moe_dir, seed, guidance, guidance_2)
    with Engine(card, keep_latents=True, expert_pools=expert_pools) as engine:
        video = engine.generate(PROMPT, negative_prompt="blurry", seed=seed, guidance_scale=guidance,
                                guidance_scale_2=guidance_2, **OPTS)
        forwards = {k: d.counters["forwards"] for k, d in engine.denoisers.items()}
    assert rel_error(video.latents, want_lat) <= card.parity.c1_latents_rel
    assert float(np.abs(video.frames - want_frames).max()) <= card.parity.c1_frames_abs
    # timesteps 999, 937 run the high-noise expert (>= 875); the other four the low-noise one
    if expert_pools:
        assert forwards == {"denoiser:transformer": 2, "denoiser:transformer_2": 4}
    else:
        assert forwards == {"denoiser": 6}
    if not expert_pools:  # the gate can fail: the first expert alone (transformer_2 ignored) is far off
        first_only, _ = _reference(moe_dir, seed, guidance, first_only=True)
        assert rel_error(video.latents, first_only) > 100 * card.parity.c1_latents_rel


def test_c1_euler_two_experts(moe_euler_dir):
    card = resolve_card(str(moe_euler_dir))
    assert card.denoise.sampler.name == "euler" and card.denoise.experts.boundary_ratio == 0.6
    want_lat, _ = _reference(moe_euler_dir, 7, 3.5, 1.5)
    with Engine(card, keep_latents=True, expert_pools=True) as engine:
        video = engine.generate(PROMPT, negative_prompt="blurry", seed=7, guidance_scale=3.5, guidance_scale_2=1.5,
                                **OPTS)
    assert rel_error(video.latents, want_lat) <= card.parity.c1_latents_rel


def test_loop_names_the_expert_of_each_step(moe_dir):
    card = resolve_card(str(moe_dir))
    req = resolve(GenerateRequest(PROMPT, guidance_scale=5.0, guidance_scale_2=2.0, **OPTS), card)
    loop = DenoiseLoop()
    state = loop.init(req, card, RequestContext())
    assert state.boundary_timestep == 875.0
    plans = []
    while state.step < state.num_steps:
        plan = loop.next(state)
        plans.append(plan)
        state = state.model_copy(update={"step": state.step + 1})
    experts = [p.params["expert"] for p in plans]
    assert experts == ["transformer"] * 2 + ["transformer_2"] * 4
    assert [p.params["guidance"] for p in plans] == [5.0] * 2 + [2.0] * 4
    assert [p.params["handoff"] for p in plans] == [False, True, False, False, False, False]
    assert plans[0].shape_sig != plans[-1].shape_sig  # a batch never mixes experts
    assert all(p.params["timestep"] >= 875 for p in plans[:2]) and all(p.params["timestep"] < 875 for p in plans[2:])


def test_request_guidance_scale_2(moe_dir, tiny_wan_dir):
    card = resolve_card(str(moe_dir))
    assert resolve(GenerateRequest("x", guidance_scale=6.0), card).guidance_scale_2 == 6.0  # diffusers' default
    assert resolve(GenerateRequest("x"), card).guidance_scale_2 == card.denoise.experts.default_guidance_2
    with pytest.raises(InvalidRequest) as e:
        resolve(GenerateRequest("x", guidance_scale_2=-1.0), card)
    assert e.value.field == "guidance_scale_2"
    with pytest.raises(InvalidRequest) as e:
        resolve(GenerateRequest("x", guidance_scale_2=2.0), resolve_card(str(tiny_wan_dir)))
    assert e.value.field == "guidance_scale_2" and "two-expert" in e.value.message


def test_builtin_a14b_card():
    card = get_card("wan2.2-t2v-a14b")
    assert card.dit_components() == ["transformer", "transformer_2"]
    assert card.denoise.experts.boundary_ratio == 0.875 and card.denoise.sampler.flow_shift == 12.0
    assert "transformer_2" in card.checkpoint.required_for["text_to_video"]
    assert card.components["transformer_2"].config == card.components["transformer"].config


REQS = [("a red circle moving left", 1), ("a blue square moving up", 22), ("green triangle spinning", 333)]


def test_interleave_gate_and_no_reload_at_the_switch(moe_dir, monkeypatch):
    card = resolve_card(str(moe_dir))
    with Engine(card, keep_latents=True, batching=False) as engine:
        serial = [engine.generate(p, seed=s, **OPTS).latents for p, s in REQS]
    with Engine(card, keep_latents=True, batching=True, expert_pools=True) as engine:
        models = {k: dict(d.dits) for k, d in engine.denoisers.items()}

        def no_load(*a, **k):
            raise AssertionError("a weight load after start")
        monkeypatch.setattr("fastvideo3.runtime.pool.dit_executor.load_dit", no_load)  # where the denoiser binds it
        monkeypatch.setattr("fastvideo3.models.wan.components.load_dit", no_load)
        for _ in range(2):  # twice: every request crosses the switch without a reload
            runs = [engine.submit(p, seed=s, **OPTS) for p, s in REQS]
            engine.run()
            batched = [engine.result(r).latents for r in runs]
            for a, b in zip(batched, serial):
                assert rel_error(a, b) <= card.parity.c1_latents_rel
        rows = {k: d.counters["max_batch_rows"] for k, d in engine.denoisers.items()}
        assert {k: dict(d.dits) for k, d in engine.denoisers.items()} == models
        assert all(not d.regions for d in engine.denoisers.values())
    assert rows == {"denoiser:transformer": 2 * len(REQS), "denoiser:transformer_2": 2 * len(REQS)}
    assert not torch.equal(serial[0], serial[1])


def test_cost_model_prices_one_expert_per_step():
    from fastvideo3.models.wan.flops import StepShape, dit_forward_cost
    from fastvideo3.runtime.economy.pricing import dit_config
    shape = StepShape.from_video(81, 480, 832, cfg_branches=2)
    moe = dit_forward_cost(dit_config(get_card("wan2.2-t2v-a14b")), shape).flops
    assert moe == dit_forward_cost(dit_config(get_card("wan2.1-t2v-14b")), shape).flops > 0


@pytest.mark.timeout(300)
def test_crash_and_resume_with_one_pool_per_expert_is_exact(moe_dir):
    """Checkpoints snapshot the pool of the expert that ran the step; a new scheduler resumes there."""
    from fastvideo3.state import MemoryData
    from tests.helpers_resume import checkpointed_schedulers, tick_until_done, tick_until_step
    card = resolve_card(str(moe_dir))
    kw = dict(OPTS, seed=3)
    with Engine(card, keep_latents=True, expert_pools=True) as engine:
        ref = engine.generate(PROMPT, **kw).latents
        pools = {"encoder": [engine.encoder], **{k: [v] for k, v in engine.denoisers.items()},
                 "decoder": [engine.decoder]}
        data = MemoryData()
        scheduler = checkpointed_schedulers(pools, data, every=2)

        first, _ = scheduler()
        run = first.submit(engine.resolve(PROMPT, request_id="crashy", **kw), engine.card)
        tick_until_step(first, run, 5)  # the "crash" after step 5: the last checkpoint is the one before the last step
            # (every=2 writes step 4; the step before the last, 5 of 6, is always written), on the low-noise pool
        del first
        second, cp = scheduler()
        assert cp.resume(engine.card) == ["crashy"]
        resumed = second.get("crashy")
        assert resumed.resumed and resumed.driver.state.step == OPTS["num_inference_steps"] - 1
        assert cp.latest["crashy"].snapshot_role == "denoiser:transformer_2"
        tick_until_done(second, resumed)
        engine.scheduler = second
        assert torch.equal(engine.result(resumed).latents, ref)
