"""What a HunyuanVideo-1.5 diffusers-format directory is, and whether we implement it: refusals
by name.

Implemented layout: ``HunyuanVideo15Pipeline`` (text-to-video) with exactly these components --
``transformer`` (HunyuanVideo15Transformer3DModel, ``task_type`` t2v, no MeanFlow), ``vae``
(AutoencoderKLHunyuanVideo15 whose latent channels are the transformer's), ``text_encoder``
(Qwen2.5-VL's text model) with its Qwen2 ``tokenizer``, ``text_encoder_2`` (a ByT5 T5EncoderModel)
with its ``tokenizer_2``, a ``scheduler`` (flow-matching Euler with a static shift) and a
``guider`` (classifier-free guidance, diffusers' formula, on every step). Every other component,
config field or value is refused, naming it: a directory must never load as a near relative and
generate wrong video.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fastvideo3.errors import CardError
from fastvideo3.models.layout import json_mapping
from fastvideo3.vocab import Program

PIPELINE = "HunyuanVideo15Pipeline"
#: the transformer's ``task_type`` for text-to-video: diffusers spells it as our text-to-video program
TASK_T2V = str(Program.T2V)
#: model_index.json component -> the classes we implement (None: any)
COMPONENTS = {
    "transformer": ("HunyuanVideo15Transformer3DModel",),
    "vae": ("AutoencoderKLHunyuanVideo15",),
    "text_encoder": ("Qwen2_5_VLTextModel",),
    "tokenizer": ("Qwen2Tokenizer", "Qwen2TokenizerFast"),
    "text_encoder_2": ("T5EncoderModel",),
    "tokenizer_2": ("ByT5Tokenizer",),
    "scheduler": ("FlowMatchEulerDiscreteScheduler",),
    "guider": ("ClassifierFreeGuidance",),
}
#: transformer config fields our DiT implements, and the values it needs where it needs one
DIT_FIELDS = ("in_channels", "out_channels", "num_attention_heads", "attention_head_dim", "num_layers",
              "num_refiner_layers", "mlp_ratio", "patch_size", "patch_size_t", "qk_norm", "text_embed_dim",
              "text_embed_2_dim", "image_embed_dim", "rope_theta", "rope_axes_dim", "target_size", "task_type",
              "use_meanflow")
DIT_VALUES = {"qk_norm": ("rms_norm", "RMSNorm QK normalization"),
              "task_type": (TASK_T2V, "text-to-video (image-to-video is HunyuanVideo15ImageToVideoPipeline)"),
              "use_meanflow": (False, "MeanFlow's second timestep (the distilled super-resolution models)")}
VAE_FIELDS = ("in_channels", "out_channels", "latent_channels", "block_out_channels", "layers_per_block",
              "spatial_compression_ratio", "temporal_compression_ratio", "downsample_match_channel",
              "upsample_match_channel", "scaling_factor")
#: scheduler config values we implement (diffusers' defaults): a static shift, plain sigmas
SCHEDULER_VALUES = {"use_dynamic_shifting": False, "invert_sigmas": False, "shift_terminal": None,
                    "use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False,
                    "stochastic_sampling": False}
SCHEDULER_FREE = ("num_train_timesteps", "shift", "base_image_seq_len", "base_shift", "max_image_seq_len",
                  "max_shift", "time_shift_type")
#: guider config values we implement: diffusers' CFG formula on every step, no rescale
GUIDER_VALUES = {"guidance_rescale": 0.0, "use_original_formulation": False, "start": 0.0, "stop": 1.0,
                 "enabled": True}

_OTHER_PIPELINES = {
    "HunyuanVideo15ImageToVideoPipeline": "HunyuanVideo-1.5 image-to-video",
    "HunyuanVideoPipeline": "HunyuanVideo (1.0) text-to-video",
    "WanPipeline": "Wan text-to-video",
    "WanImageToVideoPipeline": "Wan image-to-video",
}


@dataclass(frozen=True)
class Layout:
    model_index: dict
    transformer: dict
    vae: dict
    scheduler: dict
    guider: dict


def pipeline_class(root: Path) -> str | None:
    """The ``_class_name`` of a directory's model_index.json (None: not a diffusers directory)."""
    index = Path(root) / "model_index.json"
    if not index.is_file():
        return None
    try:
        return json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, AttributeError):
        return None


def _present(entry) -> bool:
    return isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] is not None and entry[1] is not None


def inspect_directory(root: Path) -> Layout:
    """Check a HunyuanVideo-1.5 text-to-video directory or refuse it, naming what differs."""
    root = Path(root)
    if not (root / "model_index.json").is_file():
        raise CardError(f"{root.name}/ is not a diffusers-format directory (no model_index.json)", field="model")
    mi = json_mapping(root / "model_index.json", "model_index")
    cls = mi.get("_class_name")
    if cls != PIPELINE:
        what = _OTHER_PIPELINES.get(cls, "a pipeline this loader does not implement")
        raise CardError(f"{root.name}/ is a {cls} directory ({what}); the HunyuanVideo-1.5 loader implements "
                        f"{PIPELINE} text-to-video only", field="model_index._class_name", limit=PIPELINE)
    for key, value in mi.items():
        if key.startswith("_"):
            continue
        if key not in COMPONENTS:
            if _present(value) or not isinstance(value, (list, tuple)):
                raise CardError(f"{root.name}/ has component or field {key!r}, which {PIPELINE} loading does not "
                                "implement", field=f"model_index.{key}")
            continue
        if _present(value) and value[1] not in COMPONENTS[key]:
            raise CardError(f"component {key} is a {value[1]}; the layout needs a {' or '.join(COMPONENTS[key])}",
                            field=f"model_index.{key}", limit=COMPONENTS[key][0])
    for sub in COMPONENTS:
        if not _present(mi.get(sub)) or not (root / sub).is_dir():
            raise CardError(f"{root.name}/ lacks the {sub}/ component a text-to-video card requires",
                            field=f"checkpoint.{sub}")
    tcfg = json_mapping(root / "transformer" / "config.json", "checkpoint.transformer")
    check_dit_fields(tcfg)
    vcfg = json_mapping(root / "vae" / "config.json", "checkpoint.vae")
    check_vae_fields(vcfg, tcfg)
    scfg = json_mapping(root / "scheduler" / "scheduler_config.json", "checkpoint.scheduler")
    check_fields("scheduler", scfg, SCHEDULER_VALUES, SCHEDULER_FREE)
    gcfg = json_mapping(root / "guider" / "guider_config.json", "checkpoint.guider")
    check_fields("guider", gcfg, GUIDER_VALUES, ("guidance_scale",))
    return Layout(mi, tcfg, vcfg, scfg, gcfg)


def check_dit_fields(cfg: dict, component: str = "transformer") -> None:
    """Refuse a transformer config with a field or value our DiT does not implement."""
    cls = cfg.get("_class_name")
    if cls is not None and cls != COMPONENTS["transformer"][0]:
        raise CardError(f"{component}/config.json is a {cls}, not a {COMPONENTS['transformer'][0]}",
                        field=f"components.{component}.config._class_name")
    for k, v in cfg.items():
        if k.startswith("_"):
            continue
        if k not in DIT_FIELDS:
            raise CardError(f"{component}/config.json has field {k!r}, which this build does not implement",
                            field=f"components.{component}.config.{k}")
        if k in DIT_VALUES and v != DIT_VALUES[k][0]:
            raise CardError(f"{component}/config.json sets {k}={v!r}; implemented: {DIT_VALUES[k][0]!r} "
                            f"({DIT_VALUES[k][1]})", field=f"components.{component}.config.{k}",
                            limit=str(DIT_VALUES[k][0]))
    c_in, c_out = cfg.get("in_channels", 65), cfg.get("out_channels", 32)
    if c_in != 2 * c_out + 1:
        raise CardError(f"{component}/config.json has in_channels={c_in}; text-to-video conditioning needs "
                        f"2 * out_channels + 1 = {2 * c_out + 1} (latent, conditioning latent, mask)",
                        field=f"components.{component}.config.in_channels", limit=str(2 * c_out + 1))
    axes, head = list(cfg.get("rope_axes_dim", (16, 56, 56))), cfg.get("attention_head_dim", 128)
    if len(axes) != 3 or sum(axes) != head or any(a % 2 for a in axes):
        raise CardError(f"{component}/config.json has rope_axes_dim={axes}: three even parts summing to "
                        f"attention_head_dim={head} are implemented",
                        field=f"components.{component}.config.rope_axes_dim")


def check_vae_fields(vcfg: dict, tcfg: dict | None = None, expected: dict | None = None) -> None:
    """Refuse a VAE of another class, with an unknown field, or whose latent layout differs from the
    transformer's (channels) or the card's (``expected``: channels and compression)."""
    cls = vcfg.get("_class_name")
    if cls is not None and cls != COMPONENTS["vae"][0]:
        raise CardError(f"vae/config.json is a {cls}, not an {COMPONENTS['vae'][0]}",
                        field="components.vae.config._class_name")
    for k in vcfg:
        if not k.startswith("_") and k not in VAE_FIELDS:
            raise CardError(f"vae/config.json has field {k!r}, which this build does not implement",
                            field=f"components.vae.config.{k}")
    if tcfg is not None and vcfg.get("latent_channels", 32) != tcfg.get("out_channels", 32):
        raise CardError(f"vae latent_channels={vcfg.get('latent_channels', 32)} but the transformer denoises "
                        f"out_channels={tcfg.get('out_channels', 32)}", field="components.vae.config.latent_channels",
                        limit=str(tcfg.get("out_channels", 32)))
    for k, want in (expected or {}).items():
        got = vcfg.get(k)
        if got != want:
            raise CardError(f"vae/config.json has {k}={got!r}; the card's latent layout needs {want!r}",
                            field=f"components.vae.config.{k}", limit=str(want))


def check_fields(component: str, cfg: dict, values: dict, free: tuple[str, ...]) -> None:
    """Refuse a scheduler or guider config with an unknown field or a value we do not implement."""
    want = COMPONENTS[component]
    cls = cfg.get("_class_name")
    if cls is not None and cls not in want:
        raise CardError(f"{component} is a {cls}; implemented: {' or '.join(want)}",
                        field=f"components.{component}.config._class_name", limit=want[0])
    for k, v in cfg.items():
        if k.startswith("_"):
            continue
        if k in values:
            if v != values[k]:
                raise CardError(f"{component} config sets {k}={v!r}; implemented: {values[k]!r}",
                                field=f"components.{component}.config.{k}", limit=str(values[k]))
        elif k not in free:
            raise CardError(f"{component} config has field {k!r}, which this build does not implement",
                            field=f"components.{component}.config.{k}")
