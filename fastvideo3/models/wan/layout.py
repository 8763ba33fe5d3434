"""What a diffusers-format directory is, and whether we implement it: refusals by name.

A directory is read through its ``model_index.json`` (pipeline class, components, pipeline config
fields such as ``boundary_ratio``) and its components' ``config.json``. Every component, config
field and value is either one we implement (and then loads through an explicit key map) or a
refusal naming it: a directory must never load as a near relative and generate wrong video.

Implemented layouts (``Layout.kind``):

- ``wan2.1-t2v``: ``WanPipeline`` with one ``transformer``, no ``boundary_ratio``, no
  ``expand_timesteps``, the Wan2.1 VAE (16 latent channels, 4x temporal, 8x spatial).
- ``wan2.2-t2v-moe``: ``WanPipeline`` with ``transformer`` (high noise) and ``transformer_2``
  (low noise) of the same architecture and a ``boundary_ratio`` in (0, 1); the same VAE. Its card
  declares the two experts (``loops.diffusion_denoise.experts``).
- ``wan2.2-ti2v``: ``WanPipeline`` with ``expand_timesteps`` (Wan2.2 TI2V-5B), one 48-channel
  ``transformer`` and the Wan2.2 VAE (48 channels, 2x2 input patch, 16x spatial), served as
  text-to-video: with no image every token shares the step's timestep, so per-token timesteps
  reduce to the step's one. Its card declares that VAE layout (``components.vae.config``).
- ``wan2.1-i2v``: ``WanImageToVideoPipeline`` (Wan2.1 I2V 14B 480P / 720P) with a CLIP
  ``image_encoder`` (``CLIPVisionModel`` or ``CLIPVisionModelWithProjection``: the penultimate
  hidden states are used, the projection never), its ``image_processor``, one ``transformer``
  with image cross-attention (``image_dim``, ``added_kv_proj_dim`` = the DiT width, no
  ``pos_embed_seq_len``) and ``in_channels`` = 2 x z_dim + 4 (noisy latent, first-frame mask,
  image latent), and the Wan2.1 VAE. No ``transformer_2`` (Wan2.2 I2V A14B), no
  ``expand_timesteps``. Its card names ``image_encoder`` (``card.components``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fastvideo3.errors import CardError
from fastvideo3.models.layout import json_mapping
from fastvideo3.vocab import LoopId

#: what the T2V layouts' components are (model_index.json: name -> [library, class])
T2V_COMPONENTS = {
    "transformer": "WanTransformer3DModel",
    "transformer_2": "WanTransformer3DModel",
    "vae": "AutoencoderKLWan",
    "text_encoder": "UMT5EncoderModel",
    "tokenizer": None,  # any transformers tokenizer class of the T5 family
    "scheduler": None,  # checked by the card builder (UniPC or flow-matching Euler)
}
#: what the I2V layout's components are, beyond the T2V ones (transformer_2 excepted)
I2V_COMPONENTS = {
    **{k: v for k, v in T2V_COMPONENTS.items() if k != "transformer_2"},
    "image_encoder": ("CLIPVisionModel", "CLIPVisionModelWithProjection"),
    "image_processor": ("CLIPImageProcessor",),
}
#: the image-to-video fields of the transformer config (set in the I2V layout, unset elsewhere)
DIT_I2V_FIELDS = ("image_dim", "added_kv_proj_dim")
#: the channels the I2V DiT takes besides the noisy latent: the 4-channel first-frame mask
I2V_MASK_CHANNELS = 4
#: pipeline config fields of WanPipeline and the values we implement (None: absent/unset)
PIPELINE_FIELDS = ("boundary_ratio", "expand_timesteps")
#: transformer config fields our DiT implements (checked against the card), and the fields of the
#: diffusers class we do not implement, which must be unset
DIT_FIELDS = ("patch_size", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels", "text_dim",
              "freq_dim", "ffn_dim", "num_layers", "cross_attn_norm", "qk_norm", "eps", "rope_max_seq_len")
DIT_UNSET = {"image_dim": "image cross-attention (the Wan2.1 I2V layout)",
             "added_kv_proj_dim": "image cross-attention (the Wan2.1 I2V layout)",
             "pos_embed_seq_len": "a learned image position embedding (the FLF2V layout)"}
#: the VAE config values the Wan2.1 latent layout needs (16 channels, 4x temporal, 8x spatial)
WAN21_VAE = {"z_dim": 16, "scale_factor_temporal": 4, "scale_factor_spatial": 8, "is_residual": False,
             "patch_size": None, "in_channels": 3, "out_channels": 3, "temperal_downsample": [False, True, True]}

#: the Wan2.2 VAE's latent layout (TI2V-5B): 48 channels, a 2x2 input patch, 16x spatial
WAN22_VAE = {"z_dim": 48, "scale_factor_temporal": 4, "scale_factor_spatial": 16, "is_residual": True,
             "patch_size": 2, "in_channels": 12, "out_channels": 12, "temperal_downsample": [False, True, True]}

_KNOWN_PIPELINES = {
    "WanVideoToVideoPipeline": "Wan video-to-video",
    "WanVACEPipeline": "Wan VACE",
    "HunyuanVideo15Pipeline": "HunyuanVideo-1.5 text-to-video",
    "HunyuanVideo15ImageToVideoPipeline": "HunyuanVideo-1.5 image-to-video",
    "HunyuanVideoPipeline": "HunyuanVideo text-to-video",
}


@dataclass(frozen=True)
class Layout:
    kind: str  # "wan2.1-t2v" | "wan2.2-t2v-moe" | "wan2.2-ti2v" | "wan2.1-i2v"
    model_index: dict
    transformer: dict  # transformer/config.json
    boundary_ratio: float | None = None


def _present(entry) -> bool:
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] is not None and entry[1] is not None


def inspect_directory(root: Path) -> Layout:
    """Classify a diffusers-format directory or refuse it, naming what we do not implement."""
    root = Path(root)
    index = root / "model_index.json"
    if not index.exists():
        raise CardError(f"{root.name}/ is not a diffusers-format directory (no model_index.json)", field="model")
    mi = json_mapping(index, "model_index")
    cls = mi.get("_class_name")
    if cls == "WanImageToVideoPipeline":
        return _inspect_i2v(root, mi)
    if cls != "WanPipeline":
        what = _KNOWN_PIPELINES.get(cls, "a pipeline this build does not implement")
        raise CardError(f"{root.name}/ is a {cls} directory ({what}); loading implements WanPipeline text-to-video "
                        "and WanImageToVideoPipeline (Wan2.1 I2V) layouts only", field="model_index._class_name",
                        limit="WanPipeline, WanImageToVideoPipeline")
    for key, value in mi.items():
        if key.startswith("_") or key in PIPELINE_FIELDS:
            continue
        if key not in T2V_COMPONENTS:
            if _present(value) or not isinstance(value, (list, tuple)):
                raise CardError(f"{root.name}/ has component or field {key!r}, which this build does not implement",
                                field=f"model_index.{key}")
            continue
        want = T2V_COMPONENTS[key]
        if _present(value) and want is not None and value[1] != want:
            raise CardError(f"component {key} is a {value[1]}; the layout needs a {want}", field=f"model_index.{key}",
                            limit=want)
    for sub in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler"):
        if not _present(mi.get(sub)) or not (root / sub).is_dir():
            raise CardError(f"{root.name}/ lacks the {sub}/ component a text-to-video card requires",
                            field=f"checkpoint.{sub}")
    tcfg = json_mapping(root / "transformer" / "config.json", "checkpoint.transformer")
    check_dit_fields("transformer", tcfg)
    vcfg = json_mapping(root / "vae" / "config.json", "checkpoint.vae")
    ratio = mi.get("boundary_ratio")
    two = _present(mi.get("transformer_2"))
    if mi.get("expand_timesteps"):
        if two or ratio is not None:
            raise CardError("expand_timesteps with a second expert is not a published layout and is not implemented",
                            field="model_index.expand_timesteps", limit="false")
        if vcfg.get("z_dim") != WAN22_VAE["z_dim"]:
            raise CardError(f"expand_timesteps=true is implemented with the Wan2.2 VAE (z_dim 48, 16x); this VAE has "
                            f"z_dim={vcfg.get('z_dim')}", field="model_index.expand_timesteps", limit="false")
        check_vae_fields(vcfg, tcfg, expected=WAN22_VAE)
        return Layout("wan2.2-ti2v", mi, tcfg)
    check_vae_fields(vcfg, tcfg)
    if not two and ratio is None:
        return Layout("wan2.1-t2v", mi, tcfg)
    if two and ratio is None:
        raise CardError("the directory has a transformer_2 but no boundary_ratio: nothing says when the second "
                        "expert takes over", field="model_index.boundary_ratio")
    if not two:
        raise CardError(f"boundary_ratio={ratio!r} names a switch to transformer_2, which the directory lacks",
                        field="model_index.boundary_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0.0 < float(ratio) < 1.0:
        raise CardError(f"boundary_ratio={ratio!r} must be a number in (0, 1)", field="model_index.boundary_ratio",
                        limit="(0, 1)")
    if not (root / "transformer_2").is_dir():
        raise CardError(f"{root.name}/ lacks the transformer_2/ its model_index names",
                        field="checkpoint.transformer_2")
    t2 = json_mapping(root / "transformer_2" / "config.json", "checkpoint.transformer_2")
    check_dit_fields("transformer_2", t2)
    for k in DIT_FIELDS:
        if t2.get(k) != tcfg.get(k):
            raise CardError(f"transformer_2/config.json has {k}={t2.get(k)!r} but transformer has {tcfg.get(k)!r}: "
                            "the two experts must share one architecture", field=f"components.transformer_2.config.{k}")
    return Layout("wan2.2-t2v-moe", mi, tcfg, float(ratio))


def _inspect_i2v(root: Path, mi: dict) -> Layout:
    """The Wan2.1 I2V layout, or a refusal naming what differs from it."""
    for key, value in mi.items():
        if key.startswith("_"):
            continue
        if key in PIPELINE_FIELDS:
            if value not in (None, False):
                what = ("a second expert (the Wan2.2 I2V A14B layout)" if key == "boundary_ratio"
                        else "per-token timesteps (the Wan2.2 TI2V layout)")
                raise CardError(f"{root.name}/ sets {key}={value!r}: {what} is not implemented for image-to-video",
                                field=f"model_index.{key}", limit="null")
            continue
        if key not in I2V_COMPONENTS:
            if _present(value) or not isinstance(value, (list, tuple)):
                what = " (the Wan2.2 I2V A14B layout)" if key == "transformer_2" else ""
                raise CardError(f"{root.name}/ has component or field {key!r}{what}, which this build does not "
                                "implement for image-to-video", field=f"model_index.{key}")
            continue
        want = I2V_COMPONENTS[key]
        names = want if isinstance(want, tuple) else (want,)
        if _present(value) and want is not None and value[1] not in names:
            raise CardError(f"component {key} is a {value[1]}; the layout needs a {' or '.join(names)}",
                            field=f"model_index.{key}", limit=", ".join(names))
    for sub in ("transformer", "vae", "text_encoder", "tokenizer", "scheduler", "image_encoder", "image_processor"):
        if not _present(mi.get(sub)) or not (root / sub).is_dir():
            raise CardError(f"{root.name}/ lacks the {sub}/ component an image-to-video card requires",
                            field=f"checkpoint.{sub}")
    tcfg = json_mapping(root / "transformer" / "config.json", "checkpoint.transformer")
    check_dit_fields("transformer", tcfg, image_to_video=True)
    vcfg = json_mapping(root / "vae" / "config.json", "checkpoint.vae")
    check_vae_fields(vcfg, tcfg)
    return Layout("wan2.1-i2v", mi, tcfg)


def check_dit_fields(component: str, cfg: dict, image_to_video: bool = False) -> None:
    """Refuse a transformer config with a field we do not implement (set, or unknown). With
    ``image_to_video`` the I2V fields must be set and consistent (the Wan2.1 I2V layout)."""
    cls = cfg.get("_class_name")
    if cls is not None and cls != "WanTransformer3DModel":
        raise CardError(f"{component}/config.json is a {cls}, not a WanTransformer3DModel",
                        field=f"components.{component}.config._class_name")
    for k, v in cfg.items():
        if k.startswith("_") or k in DIT_FIELDS or (image_to_video and k in DIT_I2V_FIELDS):
            continue
        if k in DIT_UNSET:
            if v is not None:
                raise CardError(f"{component}/config.json sets {k}={v!r}: {DIT_UNSET[k]} is not implemented",
                                field=f"components.{component}.config.{k}", limit="null")
            continue
        raise CardError(f"{component}/config.json has field {k!r}, which this build does not implement",
                        field=f"components.{component}.config.{k}")
    if image_to_video:
        _check_i2v_dit(component, cfg)
        return
    if cfg.get("in_channels") != cfg.get("out_channels"):
        raise CardError(f"{component}/config.json has in_channels={cfg.get('in_channels')} != out_channels="
                        f"{cfg.get('out_channels')}: channel-concatenated conditioning (image-to-video) is not "
                        "implemented", field=f"components.{component}.config.in_channels")


def _check_i2v_dit(component: str, cfg: dict) -> None:
    f = f"components.{component}.config"
    for k in DIT_I2V_FIELDS:
        if not isinstance(cfg.get(k), int) or isinstance(cfg.get(k), bool) or cfg[k] < 1:
            raise CardError(f"{component}/config.json has {k}={cfg.get(k)!r}: an image-to-video transformer needs "
                            "image cross-attention", field=f"{f}.{k}", limit="a positive integer")
    inner = int(cfg.get("num_attention_heads", 0)) * int(cfg.get("attention_head_dim", 0))
    if cfg["added_kv_proj_dim"] != inner:
        raise CardError(f"{component}/config.json has added_kv_proj_dim={cfg['added_kv_proj_dim']}; the image "
                        f"embedder's output is the DiT width {inner}", field=f"{f}.added_kv_proj_dim", limit=str(inner))
    want = 2 * int(cfg.get("out_channels", 0)) + I2V_MASK_CHANNELS
    if cfg.get("in_channels") != want:
        raise CardError(f"{component}/config.json has in_channels={cfg.get('in_channels')}; image-to-video takes "
                        f"latent + mask + image latent = {want}", field=f"{f}.in_channels", limit=str(want))


def check_vae_fields(vcfg: dict, tcfg: dict | None = None, expected: dict | None = None) -> None:
    """Refuse a VAE whose latent layout (channels, compression) differs from what the card decodes."""
    expected = expected or WAN21_VAE
    cls = vcfg.get("_class_name")
    if cls is not None and cls != "AutoencoderKLWan":
        raise CardError(f"vae/config.json is a {cls}, not an AutoencoderKLWan",
                        field="components.vae.config._class_name")
    for k, want in expected.items():
        got = vcfg.get(k, want)
        if (list(got) if isinstance(got, tuple) else got) != want:
            raise CardError(f"vae/config.json has {k}={got!r}; the card's latent layout needs {want!r} "
                            f"({expected['z_dim']} channels, 4x temporal, {expected['scale_factor_spatial']}x spatial)",
                            field=f"components.vae.config.{k}", limit=str(want))
    if tcfg is not None and tcfg.get("out_channels") != vcfg.get("z_dim", 16):
        raise CardError(f"transformer out_channels={tcfg.get('out_channels')} but the VAE's z_dim is "
                        f"{vcfg.get('z_dim')}", field="components.vae.config.z_dim")


def check_card_layout(card) -> Layout | None:
    """Refuse a card bound to a directory of another layout (a card file or a built-in card given
    ``checkpoint.root``): a second expert the card does not name, a different boundary, and so on."""
    if not card.checkpoint.root or not any(c.source == "diffusers_dir" for c in card.components.values()):
        return None
    root = Path(card.checkpoint.root)
    if not (root / "model_index.json").exists():
        # a bare directory named by a card file: the card's components are all there is, but a
        # component folder it does not name is still refused rather than ignored
        named = {c.subfolder for c in card.components.values()}
        for extra in ("transformer_2", "image_encoder", "image_processor"):
            if (root / extra).is_dir() and extra not in named:
                raise CardError(f"{root.name}/ has a {extra}/ that card {card.model_id} does not name",
                                field=f"checkpoint.{extra}")
        return None
    layout = inspect_directory(root)
    i2v = "image_encoder" in card.components
    if (layout.kind == "wan2.1-i2v") != i2v:
        if i2v:
            raise CardError(f"card {card.model_id} is image-to-video but the directory is a "
                            f"{layout.model_index.get('_class_name')} {layout.kind} layout (no image encoder, no "
                            "image cross-attention)", field="model_index._class_name", limit="WanImageToVideoPipeline")
        raise CardError(f"card {card.model_id} is text-to-video but the directory is a WanImageToVideoPipeline "
                        "(Wan2.1 image-to-video) layout", field="model_index._class_name", limit="WanPipeline")
    moe = LoopId.DIFFUSION_DENOISE in card.loops and card.denoise.experts is not None
    ti2v = "vae" in card.components and card.components["vae"].config.get("z_dim") == WAN22_VAE["z_dim"]
    if (layout.kind == "wan2.2-ti2v") != ti2v:
        raise CardError(f"card {card.model_id} decodes a {'48' if ti2v else '16'}-channel latent layout but the "
                        f"directory is a {layout.kind} layout" + (" (expand_timesteps, the 48-channel 16x VAE)"
                                                                  if layout.kind == "wan2.2-ti2v" else ""),
                        field="model_index.expand_timesteps", limit=str(ti2v).lower())
    if layout.kind == "wan2.2-t2v-moe" and not moe:
        raise CardError(f"card {card.model_id} has one denoising expert but the directory adds transformer_2 "
                        f"(boundary_ratio={layout.boundary_ratio})", field="model_index.transformer_2")
    if layout.kind == "wan2.1-t2v" and moe:
        raise CardError(f"card {card.model_id} has two denoising experts but the directory has no transformer_2",
                        field="checkpoint.transformer_2")
    if moe and abs(card.denoise.experts.boundary_ratio - (layout.boundary_ratio or 0.0)) > 1e-9:
        raise CardError(f"directory boundary_ratio={layout.boundary_ratio} but card {card.model_id} declares "
                        f"{card.denoise.experts.boundary_ratio}", field="model_index.boundary_ratio")
    return layout
