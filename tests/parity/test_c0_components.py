"""C0 component parity: our DiT, VAE decode and text encode vs the diffusers / transformers
reference on the same weights, read from directories written by diffusers itself."""
import pytest
import torch

from fastvideo3.card import resolve_card
from fastvideo3.models.wan.components import TextEncoder, VideoDecoder, load_dit
from fastvideo3.parity import ParityAligner, hook_reference_blocks, rel_error

pytestmark = pytest.mark.timeout(300)

CONFIGS = {
    "base": {},
    "wide-3layer": dict(num_attention_heads=3, attention_head_dim=16, ffn_dim=96, num_layers=3),
    "no-cross-norm": dict(cross_attn_norm=False, num_layers=1),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def wan_dir(request, tmp_path_factory):
    from fastvideo3.testing.synthetic_wan import TINY_TRANSFORMER, build_wan_dir
    cfg = {**TINY_TRANSFORMER, **CONFIGS[request.param]}
    seed = sorted(CONFIGS).index(request.param) + 11
    return build_wan_dir(tmp_path_factory.mktemp(request.param) / "wan", preset="tiny", seed=seed,
                         transformer_config=cfg)


def _ref_dit(path):
    from diffusers import WanTransformer3DModel
    return WanTransformer3DModel.from_pretrained(str(path / "transformer")).eval()


@pytest.mark.parametrize("seed, shape, batch", [(0, (3, 8, 8), 1), (1, (2, 6, 10), 2)])
def test_c0_dit_forward_matches_reference(wan_dir, seed, shape, batch):
    card = resolve_card(str(wan_dir))
    ours, _ = load_dit(card, "cpu", torch.float32)
    ref = _ref_dit(wan_dir)
    g = torch.Generator().manual_seed(seed)
    c = ref.config.in_channels
    x = torch.randn(batch, c, *shape, generator=g)
    t = torch.tensor([999.0, 321.0][:batch])
    txt = torch.randn(batch, 12, ref.config.text_dim, generator=g)
    rec = ParityAligner()
    remove = hook_reference_blocks(ref, rec)
    with torch.no_grad():
        want = ref(x, t, txt, return_dict=False)[0]
        cmp = ParityAligner(reference=rec, rel_tol=card.parity.c0_dit_rel)
        got = ours(x, t, txt, tap=cmp.tap)
    remove()
    assert cmp.checked >= card.components["transformer"].config["num_layers"] + 2
    assert cmp.first_divergence is None, cmp.report()
    assert rel_error(got, want) <= card.parity.c0_dit_rel


def test_c0_perturbing_one_weight_is_caught(tiny_wan_dir):
    """The gate must fail when a single weight of our DiT differs from the reference."""
    card = resolve_card(str(tiny_wan_dir))
    ours, _ = load_dit(card, "cpu", torch.float32)
    ref = _ref_dit(tiny_wan_dir)
    x = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([500.0])
    txt = torch.randn(1, 8, ref.config.text_dim, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ours.blocks[1].ffn.net[2].weight[0, 0] += 0.05
        rec = ParityAligner()
        remove = hook_reference_blocks(ref, rec)
        want = ref(x, t, txt, return_dict=False)[0]
        remove()
        cmp = ParityAligner(reference=rec, rel_tol=card.parity.c0_dit_rel)
        got = ours(x, t, txt, tap=cmp.tap)
    assert rel_error(got, want) > card.parity.c0_dit_rel
    assert cmp.first_divergence is not None and cmp.first_divergence.name == "block.1"


def test_c0_vae_decode_and_text_encode_match_reference(tiny_wan_dir):
    from diffusers import AutoencoderKLWan
    from transformers import AutoTokenizer, UMT5EncoderModel
    card = resolve_card(str(tiny_wan_dir))
    dec = VideoDecoder(card)
    ref_vae = AutoencoderKLWan.from_pretrained(str(tiny_wan_dir / "vae")).eval()
    z = torch.randn(1, ref_vae.config.z_dim, 2, 4, 4, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        mean = torch.tensor(ref_vae.config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(ref_vae.config.latents_std).view(1, -1, 1, 1, 1)
        want = ref_vae.decode(z * std + mean, return_dict=False)[0]
    want = (want / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1)
    got = dec.decode(z)
    assert (got - want).abs().max().item() <= card.parity.c0_vae_abs

    enc = TextEncoder(card)
    tok = AutoTokenizer.from_pretrained(str(tiny_wan_dir / "tokenizer"))
    ref_te = UMT5EncoderModel.from_pretrained(str(tiny_wan_dir / "text_encoder")).eval()
    prompts = ["a red circle moving left", "two  blue squares &amp; a dog"]
    got = enc.encode(prompts)
    clean = ["a red circle moving left", "two blue squares & a dog"]
    ids = tok(clean, padding="max_length", max_length=card.max_text_tokens, truncation=True, return_tensors="pt")
    with torch.no_grad():
        hid = ref_te(ids.input_ids, ids.attention_mask).last_hidden_state
    lens = ids.attention_mask.sum(1)
    for i, n in enumerate(lens.tolist()):
        assert rel_error(got[i, :n], hid[i, :n]) <= card.parity.c0_text_rel
        assert got[i, n:].abs().max().item() == 0.0
