"""Random-weight HunyuanVideo-1.5 text-to-video checkpoints in the diffusers layout, built offline.

:func:`build_hunyuan15_dir` assembles a ``diffusers.HunyuanVideo15Pipeline`` from diffusers' and
transformers' own classes at a tiny size and writes it with the pipeline's ``save_pretrained``::

    model_index.json
    transformer/     HunyuanVideo15Transformer3DModel
    vae/             AutoencoderKLHunyuanVideo15
    text_encoder/    transformers Qwen2_5_VLTextModel
    tokenizer/       transformers Qwen2Tokenizer (byte-level BPE with no merges, the Qwen chat template)
    text_encoder_2/  transformers T5EncoderModel (ByT5-shaped)
    tokenizer_2/     transformers ByT5Tokenizer
    scheduler/       FlowMatchEulerDiscreteScheduler
    guider/          ClassifierFreeGuidance

so ``HunyuanVideo15Pipeline.from_pretrained`` loads it with no network access. The configs are
those of diffusers' own pipeline tests at this size; only the numbers are random (seeded).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from fastvideo3.models.hunyuan15.layout import TASK_T2V

#: the diffusers test's tiny transformer (text-to-video)
TINY_TRANSFORMER: dict[str, Any] = dict(
    in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2, num_refiner_layers=1,
    mlp_ratio=2.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=16, text_embed_2_dim=32,
    image_embed_dim=12, rope_theta=256.0, rope_axes_dim=[2, 2, 4], target_size=16, task_type=TASK_T2V,
    use_meanflow=False,
)
#: 4 latent channels, 2x temporal, 4x spatial
TINY_VAE: dict[str, Any] = dict(
    in_channels=3, out_channels=3, latent_channels=4, block_out_channels=[16, 16], layers_per_block=1,
    spatial_compression_ratio=4, temporal_compression_ratio=2, downsample_match_channel=False,
    upsample_match_channel=False,
)
TINY_QWEN: dict[str, Any] = dict(
    hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    rope_scaling={"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"}, rope_theta=1000000.0,
)
TINY_BYT5: dict[str, Any] = dict(
    d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
    feed_forward_proj="gated-gelu", dropout_rate=0.0,
)
#: Qwen's chat template, as the pipeline formats a prompt (system message, user turn, assistant cue)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen_tokenizer():
    """A Qwen2 tokenizer whose vocabulary is the 256 byte symbols and Qwen's chat tokens."""
    from tokenizers import pre_tokenizers
    from transformers import Qwen2Tokenizer

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab[ch] = len(vocab)
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=specials[1:])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _seed(seed: int, name: str) -> int:
    import zlib
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def build_hunyuan15_dir(path: str | Path, *, seed: int = 0, flow_shift: float = 7.0, guidance_scale: float = 6.0,
                        transformer_config: dict | None = None, dtype: torch.dtype = torch.float32) -> Path:
    """Write a random tiny HunyuanVideo-1.5 T2V pipeline directory at ``path`` and return it.
    Deterministic in its arguments."""
    from diffusers import (AutoencoderKLHunyuanVideo15, FlowMatchEulerDiscreteScheduler, HunyuanVideo15Pipeline,
                           HunyuanVideo15Transformer3DModel)
    from diffusers.guiders import ClassifierFreeGuidance
    from transformers import ByT5Tokenizer, Qwen2_5_VLTextConfig, Qwen2_5_VLTextModel, T5Config, T5EncoderModel

    tok = build_qwen_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(_seed(seed, "transformer"))
        transformer = HunyuanVideo15Transformer3DModel(**(transformer_config or TINY_TRANSFORMER))
        torch.manual_seed(_seed(seed, "vae"))
        vae = AutoencoderKLHunyuanVideo15(**TINY_VAE)
        torch.manual_seed(_seed(seed, "text_encoder"))
        qwen = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**TINY_QWEN, vocab_size=len(tok)))
        torch.manual_seed(_seed(seed, "text_encoder_2"))
        tok2 = ByT5Tokenizer()
        byt5 = T5EncoderModel(T5Config(**TINY_BYT5, vocab_size=len(tok2)))
    pipe = HunyuanVideo15Pipeline(
        transformer=transformer.eval().to(dtype), vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=flow_shift),
        text_encoder=qwen.eval().to(dtype), tokenizer=tok, text_encoder_2=byt5.eval().to(dtype), tokenizer_2=tok2,
        guider=ClassifierFreeGuidance(guidance_scale=guidance_scale),
    )
    root = Path(path)
    pipe.save_pretrained(str(root))
    return root
