"""HunyuanVideo-1.5 components behind the same small interface as Wan's: a text encoder, the DiT
and the VAE decoder, all loaded from a diffusers-format directory.

The text encoders (Qwen2.5-VL's text model, a ByT5 encoder) and the VAE wrap the transformers /
diffusers classes, as the Wan family's do; the prompt procedure around them is the pipeline's
(chat template, crop of the system prompt, the third-last hidden state; quoted glyph text for
ByT5). The DiT is ours (:mod:`fastvideo3.models.hunyuan15.dit`). The encoder publishes one packed
tensor per prompt (:func:`~fastvideo3.models.hunyuan15.dit.pack_text`), so the denoiser batches
requests as it does any card's.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from fastvideo3.card.spec import ModelCard
from fastvideo3.errors import CardError
from fastvideo3.models.hunyuan15.dit import HunyuanDiT, HunyuanDiTConfig, pack_text
from fastvideo3.models.checkpoint import DTYPES, check_config, safetensors_files, weights_digest

#: the pipeline's system prompt (HunyuanVideo15Pipeline.system_message, its spacing included)
SYSTEM_MESSAGE = (
    "You are a helpful assistant. Describe the video by detailing the following aspects: "
    + " " * 8 + "1. The main content and theme of the video. "
    + " " * 8 + "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects. "
    + " " * 8 + "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects. "
    + " " * 8 + "4. background environment, light, style and atmosphere. "
    + " " * 8 + "5. camera angles, movements, and transitions used in the video."
)
#: tokens of the templated system prompt the pipeline crops from the Qwen hidden states
CROP_START = 108
#: Qwen hidden states taken: the third from last (the pipeline skips the last two layers)
HIDDEN_LAYERS_SKIPPED = 2


def _root(card: ModelCard, sub: str) -> Path:
    if not card.checkpoint.root:
        raise CardError(f"card {card.model_id} loads weights from a checkpoint directory; none was given "
                        "(pass --model DIR or set checkpoint.root)", field="checkpoint.root")
    spec = card.components.get(sub)
    if spec is not None and spec.source != "diffusers_dir":
        raise CardError(f"component {sub} has source {spec.source!r}; HunyuanVideo-1.5 components load from a "
                        "diffusers-format directory", field=f"components.{sub}.source", limit="diffusers_dir")
    p = Path(card.checkpoint.root) / (spec.subfolder if spec is not None and spec.subfolder else sub)
    if not p.is_dir():
        raise CardError(f"checkpoint directory lacks {p.name}/", field=f"checkpoint.{sub}")
    return p


def check_directory(card: ModelCard):
    """The card's directory is the layout it implements (refusals by name), and its VAE's latent
    layout is the card's."""
    from fastvideo3.models.hunyuan15.layout import check_vae_fields, inspect_directory
    layout = inspect_directory(Path(_root(card, "transformer")).parent)
    check_vae_fields(layout.vae, layout.transformer, expected=dict(card.components["vae"].config))
    return layout


def glyph_text(prompt: str) -> str | None:
    """The quoted text of a prompt, as the pipeline feeds it to ByT5 (None: nothing quoted)."""
    found = [a or b for a, b in re.findall(r"\"(.*?)\"|“(.*?)”", prompt)]
    found = list(dict.fromkeys(found)) if len(found) > 1 else found
    return ". ".join(f'Text "{t}"' for t in found) + ". " if found else None


class TextEncoder:
    """prompts -> the packed conditioning ``[B, 1000 + 256, max(dims) + 1]``: the Qwen prompt
    embeddings and mask, the ByT5 glyph embeddings and mask, as the reference pipeline makes them."""

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32):
        import transformers
        layout = check_directory(card)
        cfg = HunyuanDiTConfig.from_dict(card.components["transformer"].config)
        self.text_len, self.text_len_2, self.width = cfg.text_len, cfg.text_len_2, cfg.text_dim
        self.max_len = cfg.packed_text_len  # rows of the packed conditioning (the feature cache's key)
        self.device, self.dtype = device, dtype
        folders = {c: _root(card, c) for c in ("tokenizer", "text_encoder", "tokenizer_2", "text_encoder_2")}
        mi = layout.model_index
        self.tokenizer = getattr(transformers, mi["tokenizer"][1]).from_pretrained(str(folders["tokenizer"]))
        self.tokenizer_2 = getattr(transformers, mi["tokenizer_2"][1]).from_pretrained(str(folders["tokenizer_2"]))
        self.model = transformers.Qwen2_5_VLTextModel.from_pretrained(str(folders["text_encoder"]), dtype=dtype)
        self.model_2 = transformers.T5EncoderModel.from_pretrained(str(folders["text_encoder_2"]), dtype=dtype)
        for m in (self.model, self.model_2):
            m.to(device=device, dtype=dtype).eval().requires_grad_(False)
        if self.model.config.hidden_size != cfg.text_embed_dim or self.model_2.config.d_model != cfg.text_embed_2_dim:
            raise CardError(f"text encoders are {self.model.config.hidden_size} / {self.model_2.config.d_model} wide; "
                            f"the transformer reads {cfg.text_embed_dim} / {cfg.text_embed_2_dim}",
                            field="components.text_encoder")
        self.digest = weights_digest(safetensors_files(folders["text_encoder"])
                                     + safetensors_files(folders["text_encoder_2"]))
        self.dim = self.width

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        return self.forward(prompts)

    def forward(self, prompts: list[str]) -> torch.Tensor:
        embeds, mask = self._qwen(prompts)
        embeds_2, mask_2 = self._byt5(prompts)
        return pack_text(embeds.to(self.dtype), mask, embeds_2.to(self.dtype), mask_2, self.width)

    def _qwen(self, prompts: list[str]):
        chats = [[{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": p or " "}]
                 for p in prompts]
        tok = self.tokenizer.apply_chat_template(chats, add_generation_prompt=True, tokenize=True, return_dict=True,
                                                 padding="max_length", max_length=self.text_len + CROP_START,
                                                 truncation=True, return_tensors="pt")
        ids, mask = tok["input_ids"].to(self.device), tok["attention_mask"].to(self.device)
        hidden = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        return hidden[-(HIDDEN_LAYERS_SKIPPED + 1)][:, CROP_START:], mask[:, CROP_START:]

    def _byt5(self, prompts: list[str]):
        embeds, masks = [], []
        for p in prompts:
            text = glyph_text(p)
            if text is None:
                embeds.append(torch.zeros(1, self.text_len_2, self.model_2.config.d_model, device=self.device,
                                          dtype=self.dtype))
                masks.append(torch.zeros(1, self.text_len_2, dtype=torch.int64, device=self.device))
                continue
            tok = self.tokenizer_2(text, padding="max_length", max_length=self.text_len_2, truncation=True,
                                   add_special_tokens=True, return_tensors="pt").to(self.device)
            embeds.append(self.model_2(input_ids=tok.input_ids, attention_mask=tok.attention_mask.float())[0])
            masks.append(tok.attention_mask)
        return torch.cat(embeds), torch.cat(masks)


def load_dit(card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32,
             component: str = "transformer") -> tuple[HunyuanDiT, str]:
    """The card's DiT on ``device``, loaded strictly by its key map after the directory's layout and
    the transformer config are checked against the card."""
    from fastvideo3.models.hunyuan15.checkpoint import load_dit_weights
    from fastvideo3.models.hunyuan15.layout import check_dit_fields
    spec = card.components[component]
    if spec.precision == "fp8_e4m3":
        raise CardError("precision fp8_e4m3 is not implemented for the HunyuanVideo-1.5 DiT",
                        field=f"components.{component}.precision", limit="fp32, bf16, fp16")
    folder = _root(card, component)
    check_directory(card)
    actual = json.loads((folder / "config.json").read_text())
    check_dit_fields(actual, component)
    check_config(component, spec.config, actual)
    cfg = HunyuanDiTConfig.from_dict({**spec.config, **{k: v for k, v in actual.items() if not k.startswith("_")}})
    with torch.device("meta"):
        model = HunyuanDiT(cfg)
    load_dit_weights(model, folder, cfg, spec.key_map or "hunyuan15_dit_diffusers_v1", dtype, device, component)
    model.to(device=device).eval().requires_grad_(False)
    return model, weights_digest(safetensors_files(folder))


def fast_dit(model: HunyuanDiT):
    """The CUDA forward: the same module with the fused attention kernels (see fast.py)."""
    from fastvideo3.models.hunyuan15.fast import FastHunyuanDiT
    return FastHunyuanDiT(model)


def lora_layers(model: HunyuanDiT):
    """(layer shapes, adapted modules, groups) for per-row LoRA: none are implemented for this DiT."""
    return {}, {}, {}


class VideoDecoder:
    """latents -> frames float32 ``[B, F, H, W, 3]`` in [0, 1]: ``latents / scaling_factor``, the
    VAE's decode, then the pipeline's post-processing."""

    #: the decode settings a pool describes: this VAE decodes as diffusers does, one call per latent
    fast, time_chunk, channels_last, fused = False, 1, False, False

    def __init__(self, card: ModelCard, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 fast: bool | None = None):
        # ``fast``: the pools' switch for a family's fast decode; this VAE has none (diffusers' decode)
        from diffusers import AutoencoderKLHunyuanVideo15
        check_directory(card)
        folder = _root(card, "vae")
        self.model = AutoencoderKLHunyuanVideo15.from_pretrained(str(folder), dtype=dtype)
        self.model.to(device=device).eval().requires_grad_(False)
        self.device, self.dtype = device, dtype
        c = self.model.config
        self.z_dim, self.scaling_factor = c.latent_channels, float(c.scaling_factor)
        self.temporal_scale, self.spatial_scale = c.temporal_compression_ratio, c.spatial_compression_ratio
        self.digest = weights_digest(safetensors_files(folder))

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.to(self.device, self.dtype) / self.scaling_factor
        # one latent per VAE call: diffusers' AutoencoderKLHunyuanVideo15 (0.42) builds its mid-block
        # attention mask for one sample, and a batch of several fails to broadcast against it
        video = torch.cat([self.model.decode(z[i : i + 1], return_dict=False)[0] for i in range(z.shape[0])])
        return (video / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).float().cpu()  # video: [B, 3, F, H, W]


def precision_dtype(precision: str) -> torch.dtype:
    return DTYPES[precision]
