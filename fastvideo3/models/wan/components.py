"""Wan components behind one small interface: a text encoder, the DiT and the VAE.

Seeded components are built deterministically from the card's seed; shipped components (the
``wan-tiny`` cards) load trained weights that ship inside the package (``fastvideo3/weights``);
the others load from a diffusers-format directory. The VAE and UMT5 text encoder wrap the
diffusers / transformers classes; the DiT is ours (:mod:`fastvideo3.models.wan.dit`).
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

import torch

from fastvideo3.card.spec import Fp8Spec, ModelCard
from fastvideo3.errors import CardError, FailedPrecondition
from fastvideo3.models.checkpoint import DTYPES, check_config, safetensors_files, weights_digest
from fastvideo3.models.wan.checkpoint import FP8_KEY_MAPS, load_dit_weights
from fastvideo3.models.wan.dit import WanDiT, WanDiTConfig
from fastvideo3.models.wan.family import WEIGHTS_DIR


def _root(card: ModelCard, sub: str) -> Path:
    if not card.checkpoint.root:
        raise CardError(f"card {card.model_id} loads weights from a checkpoint directory; none was given "
                        "(pass --model DIR or set checkpoint.root)", field="checkpoint.root")
    p = Path(card.checkpoint.root) / sub
    if not p.is_dir():
        raise CardError(f"checkpoint directory lacks {sub}/", field=f"checkpoint.{sub}")
    return p


def shipped_path(card: ModelCard, component: str) -> Path:
    """The safetensors file of a ``source: shipped`` component: ``<weights>/<subfolder>``, where
    ``<weights>`` is the package's ``fastvideo3/weights`` unless ``checkpoint.root`` names another
    directory in the same layout (a training run's output)."""
    spec = card.components[component]
    if not spec.subfolder:
        raise CardError(f"shipped component {component} names no file", field=f"components.{component}.subfolder")
    p = Path(card.checkpoint.root or WEIGHTS_DIR) / spec.subfolder
    if not p.is_file():
        raise CardError(f"shipped weights {spec.subfolder} are missing from the package",
                        field=f"components.{component}.subfolder")
    return p


def shipped_digest(path: Path) -> str:
    return "shipped:" + hashlib.sha256(path.read_bytes()).hexdigest()[:32]


def load_shipped(module: torch.nn.Module, path: Path) -> None:
    """Load a shipped state dict strictly (tied weights are stored once; fp16 files upcast)."""
    from safetensors.torch import load_file
    state = load_file(str(path))
    own = module.state_dict()
    missing = [k for k in own if k not in state]
    # tied parameters (UMT5's token embedding) are stored once under their first name
    ptrs = {}
    for k, v in own.items():
        ptrs.setdefault(v.data_ptr(), []).append(k)
    for names in ptrs.values():
        for k in names[1:]:
            if k in missing and names[0] in state:
                missing.remove(k)
    unexpected = [k for k in state if k not in own]
    if missing or unexpected:
        raise CardError(f"shipped weights {path.name} do not match the architecture "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]})", field="weights")
    with torch.no_grad():
        for k, v in state.items():
            if own[k].shape != v.shape:
                raise CardError(f"shipped weight {k} has shape {tuple(v.shape)}, expected {tuple(own[k].shape)}",
                                field="weights")
            own[k].copy_(v.to(own[k].dtype))


def _seeded_digest(card: ModelCard, component: str) -> str:
    spec = card.components[component]
    blob = json.dumps({"seed": card.checkpoint.seed, "component": component, "config": spec.config}, sort_keys=True)
    return "seeded:" + hashlib.sha256(blob.encode()).hexdigest()[:32]


def _load_local(card: ModelCard, component: str, module: torch.nn.Module) -> str:
    """A seeded or shipped component's digest; a shipped one's weights loaded into ``module``
    (a seeded one keeps the weights it was built with)."""
    if card.components[component].source == "shipped":
        path = shipped_path(card, component)
        load_shipped(module, path)
        return shipped_digest(path)
    return _seeded_digest(card, component)


def _seed_for(card: ModelCard, component: str) -> int:
    # one independent stream per component so adding a component never shifts another's weights
    h = hashlib.sha256(f"{card.checkpoint.seed}:{component}".encode()).digest()
    return int.from_bytes(h[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


# ---------------------------------------------------------------------------------- text
def prompt_clean(text: str) -> str:
    """The reference pipeline's prompt normalisation: unescape HTML twice, collapse whitespace."""
    try:  # the reference applies ftfy when it is installed; so do we, to stay comparable
        import ftfy
        text = ftfy.fix_text(text)
    except ImportError:
        pass
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class ByteTokenizer:
    """A fixed byte-level tokenizer for seeded cards: no vocabulary file, fully deterministic.
    ids: 0 pad, 1 eos, 2 unk, bytes at 3..258."""

    pad_id, eos_id = 0, 1

    def __call__(self, prompts: list[str], max_length: int):
        ids = torch.zeros(len(prompts), max_length, dtype=torch.long)
        mask = torch.zeros(len(prompts), max_length, dtype=torch.long)
        for i, p in enumerate(prompts):
            toks = [b + 3 for b in p.encode("utf-8")][: max_length - 1] + [self.eos_id]
            ids[i, : len(toks)] = torch.tensor(toks)
            mask[i, : len(toks)] = 1
        return ids, mask


class _HFTokenizer:
    def __init__(self, folder: Path):
        from transformers import AutoTokenizer
        self.tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)

    def __call__(self, prompts: list[str], max_length: int):
        out = self.tok(prompts, padding="max_length", max_length=max_length, truncation=True,
                       add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        return out.input_ids, out.attention_mask


class TextEncoder:
    """prompts -> [B, max_len, d] embeddings, trimmed to each prompt's length and zero-padded,
    exactly as the reference pipeline prepares them."""

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import UMT5Config, UMT5EncoderModel
        spec = card.components["text_encoder"]
        self.max_len = card.max_text_tokens
        self.device, self.dtype = device, dtype
        if spec.source in ("seeded", "shipped"):
            cfg = {k: v for k, v in spec.config.items() if k != "tokenizer"}
            torch.manual_seed(_seed_for(card, "text_encoder"))
            self.model = UMT5EncoderModel(UMT5Config(**cfg))
            self.tokenizer = ByteTokenizer()
            self.digest = _load_local(card, "text_encoder", self.model)
        else:
            folder = _root(card, spec.subfolder or "text_encoder")
            self.model = UMT5EncoderModel.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
            self.tokenizer = _HFTokenizer(_root(card, card.components["tokenizer"].subfolder or "tokenizer"))
            self.digest = weights_digest(safetensors_files(folder))
        self.model.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.dim = self.model.config.d_model

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        return self.forward(prompts)

    def forward(self, prompts: list[str]) -> torch.Tensor:
        """:meth:`encode` without the no-grad guard: the train profile of the same forward."""
        ids, mask = self.tokenizer([prompt_clean(p) for p in prompts], self.max_len)
        ids, mask = ids.to(self.device), mask.to(self.device)
        hidden = self.model(ids, mask).last_hidden_state.to(self.dtype)
        lens = mask.gt(0).sum(dim=1)
        out = torch.zeros_like(hidden)
        for i, n in enumerate(lens.tolist()):
            out[i, :n] = hidden[i, :n]
        return out


# ---------------------------------------------------------------------------------- DiT
def require_fp8_device(card: ModelCard, device: str) -> None:
    """Refuse (FAILED_PRECONDITION) an FP8 card on a device without FP8 tensor cores."""
    from fastvideo3.kernels.fp8 import fp8_device_problem
    problem = fp8_device_problem(device)
    if problem is not None:
        raise FailedPrecondition(f"card {card.model_id} declares precision fp8_e4m3 for its DiT, which cannot run "
                                 f"on {device}: {problem}", field="precision", limit="fp8_e4m3 on CUDA sm_89 or newer")


def load_dit(card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32,
             component: str = "transformer") -> tuple[WanDiT, str]:
    """The card's DiT ``component`` (``transformer``; a two-expert card's ``transformer_2`` too) on
    ``device``. A DiT of precision ``fp8_e4m3`` loads in bf16 and has its block Linears quantized
    (or loads them pre-quantized with an FP8 key map); its digest names the scheme."""
    spec = card.components[component]
    fp8 = spec.precision == "fp8_e4m3"
    if fp8:  # before any weight is read
        require_fp8_device(card, device)
        dtype = DTYPES["fp8_e4m3"]
    fp8_spec = spec.fp8 or Fp8Spec()
    prequantized = fp8 and spec.source == "diffusers_dir" and (spec.key_map or "") in FP8_KEY_MAPS
    if (spec.key_map or "") in FP8_KEY_MAPS and not fp8:
        raise CardError(f"key map {spec.key_map} holds e4m3 weights; the DiT's precision must be fp8_e4m3",
                        field=f"components.{component}.precision")
    cfg = WanDiTConfig.from_dict(spec.config)
    if spec.source == "seeded":
        torch.manual_seed(_seed_for(card, component))
        model = WanDiT(cfg)
        _init_seeded_dit(model)
        digest = _seeded_digest(card, component)
    elif spec.source == "shipped":
        model = WanDiT(cfg)
        path = shipped_path(card, component)
        load_shipped(model, path)
        digest = shipped_digest(path)
    else:
        folder = _root(card, spec.subfolder or component)
        actual = json.loads((folder / "config.json").read_text())
        from fastvideo3.models.wan.layout import check_card_layout, check_dit_fields
        check_card_layout(card)  # the directory as a whole is the layout the card implements
        check_dit_fields(component, actual, image_to_video=spec.config.get("image_dim") is not None)
        check_config(component, spec.config, actual)
        cfg = WanDiTConfig.from_dict({**spec.config, **{k: actual[k] for k in spec.config if k in actual}})
        with torch.device("meta"):
            model = WanDiT(cfg)
        if prequantized:
            from fastvideo3.models.wan.fp8 import fp8_skeleton_
            fp8_skeleton_(model, fp8_spec.activation_scaling, fp8_spec.attention, fp8_spec.accumulation, dtype,
                          attention_scales=fp8_spec.attention_scales)
        load_dit_weights(model, folder, cfg, spec.key_map or "wan_dit_diffusers_v1", dtype, device, component)
        # non-persistent RoPE tables were created on meta: rebuild them for real
        from fastvideo3.models.wan.dit import rope_tables
        cos, sin = rope_tables(cfg.attention_head_dim, cfg.rope_max_seq_len)
        model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
        digest = weights_digest(safetensors_files(folder))
    model.to(device=device).eval().requires_grad_(False)
    if spec.source in ("seeded", "shipped"):
        model.to(dtype=dtype)
        # the fp32 modules of the reference stay fp32 at any precision
    _keep_fp32(model)
    if fp8:
        from fastvideo3.models.wan.fp8 import quantize_dit_, scheme_name
        if not prequantized:  # on the device, after every dtype cast
            quantize_dit_(model, fp8_spec.activation_scaling, fp8_spec.attention, fp8_spec.accumulation,
                          fp8_spec.attention_scales)
        digest = f"{digest}+" + scheme_name(fp8_spec.activation_scaling, fp8_spec.attention, fp8_spec.accumulation,
                                            fp8_spec.attention_scales)
    return model, digest


def fast_dit(model: WanDiT):
    """The CUDA fast path of a loaded DiT (:class:`~fastvideo3.models.wan.fast.FastWanDiT`)."""
    from fastvideo3.models.wan.fast import FastWanDiT
    return FastWanDiT(model)


def lora_layers(model: WanDiT):
    """(layer shapes, adapted Linear modules, fused groups) of per-row LoRA on this DiT."""
    from fastvideo3.models.wan.lora import adapted_linears, layer_shapes, lora_groups
    return layer_shapes(model.cfg), adapted_linears(model, model.cfg), lora_groups(model.cfg)


def _init_seeded_dit(model: WanDiT) -> None:
    """Seeded weights with a useful scale: small normal weights, zero biases."""
    for name, p in model.named_parameters():
        if name.endswith("bias"):
            torch.nn.init.zeros_(p)
        elif "norm" in name:
            torch.nn.init.ones_(p)
        elif p.ndim >= 2 and "scale_shift_table" not in name:
            torch.nn.init.normal_(p, std=0.02 * (2.0 if "proj_out" in name else 1.0))


def keep_reference_fp32(model: WanDiT) -> WanDiT:
    """What the loader does at bf16: the time embedder, the cross-attention norm, the modulation
    tables and the RoPE tables stay fp32 (as in the reference)."""
    for name, mod in model.named_modules():
        if name.endswith("time_embedder") or name.endswith("norm2") or name.endswith("image_embedder.norm1"):
            mod.float()
    for name, p in model.named_parameters():
        if name.endswith("scale_shift_table"):
            p.data = p.data.float()
    model.rope_cos, model.rope_sin = model.rope_cos.float(), model.rope_sin.float()
    return model


_keep_fp32 = keep_reference_fp32  # the name the FP8 bench and tests use


# ---------------------------------------------------------------------------------- VAE
def build_vae(config: dict):
    """A VAE module from a card config: ``arch: patch`` is the tiny recipe's
    :class:`~fastvideo3.models.wan.patch_vae.PatchVAE`; anything else is ``AutoencoderKLWan``."""
    cfg = {k: v for k, v in config.items() if k != "arch"}
    if config.get("arch") == "patch":
        from fastvideo3.models.wan.patch_vae import PatchVAE
        return PatchVAE(**cfg)
    from diffusers import AutoencoderKLWan
    return AutoencoderKLWan(**cfg)


class VideoDecoder:
    """latents -> frames float32 [F, H, W, 3] in [0, 1] (the reference's de-normalisation).

    ``fast`` (default: on CUDA) decodes a Wan VAE through :mod:`fastvideo3.models.wan.vae_decode`:
    ``time_chunk`` latent frames per decoder call instead of one, cuDNN autotuning,
    ``channels_last`` 3-D convolution weights and (``fused``, default: on CUDA) the fused norm +
    SiLU and causal convolutions of :func:`~fastvideo3.models.wan.vae_decode.fuse_decoder`;
    otherwise ``AutoencoderKLWan.decode`` as is."""

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 fast: bool | None = None, time_chunk: int | None = None, channels_last: bool | None = None,
                 fused: bool | None = None):
        spec = card.components["vae"]
        if spec.source in ("seeded", "shipped"):
            torch.manual_seed(_seed_for(card, "vae"))
            self.model = build_vae(spec.config)
            self.digest = _load_local(card, "vae", self.model)
        else:
            from diffusers import AutoencoderKLWan
            from fastvideo3.models.wan.layout import check_vae_fields
            folder = _root(card, spec.subfolder or "vae")
            # before any weight is read: the latent layout the card declares (default: Wan2.1's)
            check_vae_fields(json.loads((folder / "config.json").read_text()), expected=vae_layout(card))
            self.model = AutoencoderKLWan.from_pretrained(str(folder), local_files_only=True, dtype=dtype)
            self.digest = weights_digest(safetensors_files(folder))
        self.model.to(device=device).eval().requires_grad_(False)
        if self.model.dtype != dtype:  # avoid a needless (and noisy) cast
            self.model.to(dtype=dtype)
        self.device, self.dtype = device, dtype
        from fastvideo3.models.wan import vae_decode
        cuda = str(device).startswith("cuda")
        self.fast = vae_decode.is_wan_vae(self.model) and (cuda if fast is None else bool(fast))
        self.time_chunk = int(time_chunk or vae_decode.DEFAULT_TIME_CHUNK) if self.fast else 1
        self.channels_last = self.fast and (cuda if channels_last is None else bool(channels_last))
        if self.channels_last:
            vae_decode.to_channels_last(self.model)
        self.fused = self.fast and (cuda if fused is None else bool(fused))
        if self.fused:
            vae_decode.fuse_decoder(self.model)
        c = self.model.config
        self.z_dim = c.z_dim
        self.temporal_scale = 2 ** sum(c.temperal_downsample)
        self.spatial_scale = int(getattr(c, "scale_factor_spatial", None) or 2 ** len(c.temperal_downsample))
        self.mean = torch.tensor(c.latents_mean).view(1, c.z_dim, 1, 1, 1)
        self.inv_std = 1.0 / torch.tensor(c.latents_std).view(1, c.z_dim, 1, 1, 1)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.device, self.dtype)
        z = z / self.inv_std.to(z) + self.mean.to(z)
        if self.fast:
            from fastvideo3.models.wan.vae_decode import chunked_decode, cuda_flags
            with cuda_flags(self.device):
                video = chunked_decode(self.model, z, self.time_chunk)
        elif str(self.device).startswith("cuda") or z.shape[0] == 1:
            video = self.model.decode(z, return_dict=False)[0]  # [B, 3, F, H, W] in [-1, 1]
        else:
            # a CPU's kernels round a batch's rows differently from one sample's (oneDNN blocks
            # by batch size; a vectorised elementwise loop's scalar tail moves with the tensor's
            # length) and batching buys a CPU little: each row decoded as if alone is bit-equal
            # to decoding it alone, on any CPU
            video = torch.cat([self.model.decode(z[i:i + 1], return_dict=False)[0] for i in range(z.shape[0])])
        frames = (video / 2 + 0.5).clamp(0, 1)
        return frames.permute(0, 2, 3, 4, 1).float().cpu()  # [B, F, H, W, 3]


def vae_layout(card: ModelCard) -> dict | None:
    """The VAE latent layout a card declares (its VAE config's layout keys), None for Wan2.1's."""
    from fastvideo3.models.wan.layout import WAN21_VAE
    cfg = card.components["vae"].config if "vae" in card.components else {}
    declared = {k: cfg[k] for k in WAN21_VAE if k in cfg}
    return {**WAN21_VAE, **declared} if declared else None


def latent_shape(card: ModelCard, frames: int, height: int, width: int) -> tuple[int, int, int, int]:
    """(C, F_lat, H_lat, W_lat) for a request (the Wan family's one rule: models/wan/family.py)."""
    from fastvideo3.models.wan.family import latent_shape as wan_latent_shape
    return wan_latent_shape(card, frames, height, width)


def precision_dtype(precision: str) -> torch.dtype:
    return DTYPES[precision]


def encode_image_condition(decoder: "VideoDecoder", pixels: torch.Tensor, num_frames: int) -> torch.Tensor:
    """The decoder pool's ``vae_encode``: the I2V image latent conditioning (models/wan/image.py)."""
    from fastvideo3.models.wan.image import encode_condition
    return encode_condition(decoder.model, decoder.mean, decoder.inv_std, pixels.to(decoder.device), num_frames)
