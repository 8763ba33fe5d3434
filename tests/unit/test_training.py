"""The tiny recipe's pieces: the procedural dataset, the adherence scorer, the patch VAE layout,
and one training step of the serving DiT + text encoder (grads flow, loss drops)."""
import numpy as np
import pytest
import torch

from fastvideo3.card import get_card
from fastvideo3.errors import CardError
from fastvideo3.loop.samplers import make_schedule
from fastvideo3.models.reward.adherence import (
    BACKGROUNDS, COLORS, MOTIONS, AdherenceScorer, PromptFields, parse_prompt,
)
from fastvideo3.models.wan.components import TextEncoder, VideoDecoder, load_dit, load_shipped
from fastvideo3.models.wan.patch_vae import PatchVAE
from fastvideo3.training.data import ShapesDataset, eval_prompts, to_frames
from fastvideo3.training.flow import SigmaSampler, flow_matching_loss
from fastvideo3.training.trainer import DiTTrainConfig, JointTrainer

SEEDED = get_card("wan-tiny-seeded")


@pytest.mark.timeout(20)
def test_dataset_is_deterministic_seeded_and_captioned():
    a = ShapesDataset(seed=3, frames=9, height=32, width=32)
    v1, c1 = a.batch(2, 4)
    v2, c2 = ShapesDataset(seed=3, frames=9, height=32, width=32).batch(2, 4)
    v3, _ = ShapesDataset(seed=4, frames=9, height=32, width=32).batch(2, 4)
    assert torch.equal(v1, v2) and c1 == c2 and not torch.equal(v1, v3)
    assert v1.shape == (4, 3, 9, 32, 32) and v1.min() >= -1 and v1.max() <= 1
    for i, cap in enumerate(c1):
        f = parse_prompt(cap)
        assert f is not None and cap == f.caption() == a.scene(2 * 4 + i).caption
        # the shape's color is at its starting center, the background color in the corner
        sc = a.scene(2 * 4 + i)
        frame0 = to_frames(v1[i])[0]
        cx, cy = int(sc.start[0] * 32), int(sc.start[1] * 32)
        assert torch.allclose(frame0[cy, cx], torch.tensor(COLORS[f.color]), atol=0.02)
        assert torch.allclose(frame0[0, 0], torch.tensor(BACKGROUNDS[f.background]), atol=1e-6)
    with pytest.raises(ValueError):
        ShapesDataset(frames=8)


@pytest.mark.timeout(10)
def test_eval_prompts_cover_every_color_and_direction_once():
    fields = [parse_prompt(p) for p in eval_prompts()]
    assert len(fields) == 20 and all(fields)
    assert {(f.color, f.motion) for f in fields} == {(c, m) for c in COLORS for m in MOTIONS}
    assert "a red circle moving left on a white background" in eval_prompts()
    assert parse_prompt("a red circle") is None and parse_prompt("a pink circle moving left on a white background") is None


@pytest.mark.timeout(30)
def test_scorer_reads_color_and_direction_from_synthetic_clips():
    data = ShapesDataset(seed=5, frames=17, height=64, width=64)
    scorer = AdherenceScorer()
    for i, (color, motion) in enumerate((c, m) for c in COLORS for m in MOTIONS):
        fields = PromptFields(color, ["circle", "square", "triangle"][i % 3], motion, list(BACKGROUNDS)[i % 3])
        clip = to_frames(data.render([data.scene_for(fields, i)])[0])
        got = scorer.score(clip, fields.caption())
        assert (got["color"], got["direction"]) == (color, motion), fields
        assert got["adherent"] == 1.0 and got["shape_ok"] == 1.0
        other = PromptFields(color, fields.shape, {"left": "right", "right": "left", "up": "down", "down": "up"}[motion],
                             fields.background)
        assert scorer.score(clip.numpy(), other.caption())["adherent"] == 0.0  # numpy frames work too
    blank = np.full((9, 32, 32, 3), 0.5)
    assert scorer.analyze(blank)["color"] == "none"
    still = to_frames(data.render([data.scene_for(PromptFields("red", "circle", "left", "white"), 0)])[0])[:1]
    assert scorer.analyze(still.expand(9, -1, -1, -1))["direction"] == "none"
    with pytest.raises(ValueError):
        scorer.score(blank, "a cat")


@pytest.mark.timeout(20)
def test_patch_vae_keeps_the_wan_latent_layout():
    x = torch.randn(2, 3, 9, 32, 64)
    assert torch.equal(PatchVAE.from_patches(PatchVAE.to_patches(x), 2), x)
    vae = PatchVAE()
    post = vae.encode(x).latent_dist
    assert post.mean.shape == (2, 16, 3, 4, 8)  # (F-1)/4+1 latent frames, 8x spatial
    assert vae.decode(post.mean, return_dict=False)[0].shape == x.shape
    dec = VideoDecoder(SEEDED)
    frames = dec.decode(torch.randn(1, 16, 3, 4, 4))
    assert frames.shape == (1, 9, 32, 32, 3) and 0 <= float(frames.min()) and float(frames.max()) <= 1


@pytest.mark.timeout(10)
def test_training_sigmas_come_from_the_serving_schedule():
    grid = set(SigmaSampler(3.0).sigmas.tolist())
    serve = make_schedule("unipc", 50, 3.0).sigmas[:-1]
    assert all(s in grid for s in serve)  # every serve-time sigma is a training sigma
    own = SigmaSampler(3.0, ("euler", 4))
    assert own.sigmas.tolist() == make_schedule("euler", 4, 3.0).sigmas[:-1]
    s, t = own(64, torch.Generator().manual_seed(0))
    assert torch.allclose(t, s * 1000, rtol=1e-5)


@pytest.mark.timeout(40)
def test_one_training_step_reduces_loss_and_grads_reach_dit_and_text_encoder():
    torch.manual_seed(0)
    dit, _ = load_dit(SEEDED)
    text = TextEncoder(SEEDED)
    # the train profile is the serve profile with grad on: same forward (grad mode may pick
    # other attention kernels, so the numbers agree to float rounding, not bit for bit)
    prompts = ["a red circle moving left on a white background", ""]
    with torch.no_grad():
        served = text.encode(prompts)
    trainer = JointTrainer(dit, text, DiTTrainConfig(lr=2e-3, text_lr=2e-3, warmup=1, cond_dropout=0.0))
    assert torch.allclose(text.forward(prompts).detach(), served, atol=1e-5, rtol=0)
    data = ShapesDataset(seed=1, frames=5, height=32, width=32)
    video, captions = data.batch(0, 4)
    x0 = torch.randn(4, 16, 2, 4, 4)  # a fixed latent batch (VAE-free: this tests the DiT step)
    gen = torch.Generator().manual_seed(7)
    sigma, t = trainer.sigmas(4, gen)
    eps = torch.randn(x0.shape, generator=gen)

    def fixed_loss() -> float:
        with torch.no_grad():
            return float(flow_matching_loss(dit, x0, text.forward(captions), sigma, t, eps))

    before = fixed_loss()
    loss = flow_matching_loss(dit, x0, text.forward(captions), sigma, t, eps)
    trainer.opt.zero_grad()
    loss.backward()
    for name, p in [*dit.named_parameters(), *text.model.named_parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert float(dit.blocks[0].attn2.to_k.weight.grad.abs().sum()) > 0  # cross-attention learns
    assert float(text.model.shared.weight.grad.abs().sum()) > 0  # the text encoder learns
    trainer.opt.step()
    for _ in range(4):
        trainer.opt.zero_grad()
        flow_matching_loss(dit, x0, text.forward(captions), sigma, t, eps).backward()
        trainer.opt.step()
    assert fixed_loss() < before


@pytest.mark.timeout(20)
def test_shipped_weights_load_strictly(tmp_path):
    from fastvideo3.training.checkpoint import save_shipped
    dit, _ = load_dit(SEEDED)
    path = save_shipped(dit, tmp_path / "dit.safetensors", torch.float16)
    again, _ = load_dit(SEEDED)
    load_shipped(again, path)
    assert torch.equal(again.proj_out.weight, dit.proj_out.weight.half().float())
    text = TextEncoder(SEEDED)
    with pytest.raises(CardError):
        load_shipped(text.model, path)  # a file of another architecture is refused


def test_direction_groups_differ_only_in_direction_and_stay_in_frame():
    from fastvideo3.models.reward.adherence import MOTIONS, parse_prompt
    data = ShapesDataset(seed=3, frames=9, height=64, width=64)
    video, captions = data.group_batch(0, 3)
    assert video.shape == (12, 3, 9, 64, 64) and len(captions) == 12
    scorer = AdherenceScorer()
    for g in range(3):
        fields = [parse_prompt(c) for c in captions[4 * g : 4 * g + 4]]
        assert [f.motion for f in fields] == list(MOTIONS)  # every direction once, in order
        assert len({(f.color, f.shape, f.background) for f in fields}) == 1
    for v, c in zip(video, captions):  # each clip moves the way its caption says, inside the frame
        assert scorer.score(to_frames(v), c)["adherent"] == 1.0
    again, _ = data.group_batch(0, 3)
    assert torch.equal(video, again)


@pytest.mark.timeout(60)
def test_grouped_step_with_text_aux_and_resume_state_round_trip():
    torch.manual_seed(0)
    cfg = DiTTrainConfig(lr=1e-3, text_lr=1e-3, warmup=1, groups=True, text_aux=0.1, cond_dropout=0.0)
    dit, _ = load_dit(SEEDED)
    text = TextEncoder(SEEDED)
    trainer = JointTrainer(dit, text, cfg)
    _, captions = ShapesDataset(seed=1, frames=5, height=32, width=32).group_batch(0, 2)
    x0 = torch.randn(8, 16, 2, 4, 4)
    loss = trainer.step(x0, captions)
    assert np.isfinite(loss) and trainer.last_aux is not None
    assert float(trainer.aux_head.weight.abs().sum()) > 0
    st = trainer.state()
    dit2, _ = load_dit(SEEDED)
    other = JointTrainer(dit2, TextEncoder(SEEDED), cfg)
    other.load_state(st)
    assert torch.equal(other.dit.proj_out.weight, dit.proj_out.weight.half().float())
    assert torch.equal(other.aux_head.weight, trainer.aux_head.weight)
    assert other.ema_dit.updates == trainer.ema_dit.updates


@pytest.mark.timeout(60)
def test_probes_run_on_a_tiny_model():
    from fastvideo3.training.probe import caption_probe, direction_probe
    from fastvideo3.training.vae import LatentCodec
    vae = PatchVAE(z_dim=16, enc_dim=8, dec_dim=8)
    vae.register_to_config(latents_mean=[0.0] * 16, latents_std=[1.0] * 16)
    codec = LatentCodec(vae)
    dit, _ = load_dit(SEEDED)
    text = TextEncoder(SEEDED)
    res = direction_probe(dit, text, codec, eval_prompts()[:2], [0], frames=5, size=32, steps=2)
    assert res["clips"] == 2 and 0.0 <= res["direction"] <= 1.0 and "median_travel" in res
    cp = caption_probe(dit, text, codec, ShapesDataset(seed=9, frames=5, height=32, width=32), clips=2, sigmas=(0.9,))
    assert 0.0 <= cp["direction_acc"] <= 1.0 and 0.0 <= cp["color_acc"] <= 1.0
