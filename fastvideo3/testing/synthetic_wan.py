"""Random-weight Wan2.1 text-to-video checkpoints in the diffusers layout, built offline.

:func:`build_wan_dir` writes a directory that ``diffusers.WanPipeline.from_pretrained`` loads
with no network access::

    model_index.json
    transformer/   WanTransformer3DModel   (config.json + safetensors, sharded when large)
    vae/           AutoencoderKLWan
    text_encoder/  transformers UMT5EncoderModel
    tokenizer/     transformers T5Tokenizer (Unigram vocabulary trained on a built-in corpus)
    scheduler/     UniPCMultistepScheduler (flow prediction) or FlowMatchEulerDiscreteScheduler

Every component is built with diffusers' / transformers' own classes, so the directory is exactly
what those libraries write; only the numbers are random. Tests use the ``"tiny"`` preset (a few
hundred kilobytes, a pipeline call takes seconds on a CPU); benchmarks use ``"1.3b"`` / ``"14b"``,
whose transformer has the real Wan2.1 shapes.

The transformer is written by :func:`write_random_transformer`, which never holds the model
twice: it builds it on the meta device, then materializes one submodule at a time, initializes it
with that module's own ``reset_parameters`` and streams it into the current safetensors shard. Peak
memory is one shard, so a random 14B checkpoint can be written on a host with less memory than
the checkpoint. Outputs are a pure function of (configs, seed, dtype): each module's random
stream is seeded from the seed and the module's name.
"""
from __future__ import annotations

import json
import math
import string
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fastvideo3.vocab import Sampler

# ---------------------------------------------------------------------------------------------
# Configs, as plain dicts (the keyword arguments of the diffusers / transformers classes).

# Wan2.1-T2V-1.3B: 12 heads x 128 = 1536 wide, 30 layers.
WAN_1_3B_TRANSFORMER: dict[str, Any] = {
    "patch_size": [1, 2, 2],
    "num_attention_heads": 12,
    "attention_head_dim": 128,
    "in_channels": 16,
    "out_channels": 16,
    "text_dim": 4096,
    "freq_dim": 256,
    "ffn_dim": 8960,
    "num_layers": 30,
    "cross_attn_norm": True,
    "qk_norm": "rms_norm_across_heads",
    "eps": 1e-6,
    "image_dim": None,
    "added_kv_proj_dim": None,
    "rope_max_seq_len": 1024,
}

# Two heads x 16 wide, two layers, a 32-wide text and time embedding.
TINY_TRANSFORMER: dict[str, Any] = {
    **WAN_1_3B_TRANSFORMER,
    "num_attention_heads": 2,
    "attention_head_dim": 16,
    "text_dim": 32,
    "freq_dim": 32,
    "ffn_dim": 64,
    "num_layers": 2,
    "rope_max_seq_len": 32,
}

# Wan2.1-T2V-14B: 40 heads x 128 = 5120 wide, 40 layers.
WAN_14B_TRANSFORMER: dict[str, Any] = {
    **WAN_1_3B_TRANSFORMER,
    "num_attention_heads": 40,
    "ffn_dim": 13824,
    "num_layers": 40,
}

# The real Wan2.1 VAE (about 127M parameters): cheap enough to build at full size.
WAN_VAE: dict[str, Any] = {
    "base_dim": 96,
    "z_dim": 16,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 2,
    "attn_scales": [],
    "temperal_downsample": [False, True, True],
    "dropout": 0.0,
}

# Same latent layout as the real VAE (16 channels, 4x temporal, 8x spatial); base_dim=1 crashes.
TINY_VAE: dict[str, Any] = {**WAN_VAE, "base_dim": 2, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1}

# ``vocab_size`` is always replaced by the size of the tokenizer written next to it.
TINY_UMT5: dict[str, Any] = {
    "d_model": 32,
    "d_kv": 8,
    "d_ff": 64,
    "num_layers": 2,
    "num_heads": 4,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "dense_act_fn": "gelu_new",
    "layer_norm_epsilon": 1e-6,
    "tie_word_embeddings": False,
}

# UMT5-XXL's output width (4096) at tiny depth: feeds a real-size transformer for benchmarks
# without building a 5.7B-parameter encoder. Prompt embeddings are random either way.
SHALLOW_UMT5_XXL: dict[str, Any] = {**TINY_UMT5, "d_model": 4096, "d_kv": 64, "d_ff": 256, "num_heads": 4}


@dataclass(frozen=True)
class WanPreset:
    """The component configs and default weight dtype of one preset."""

    transformer: dict[str, Any]
    vae: dict[str, Any]
    text_encoder: dict[str, Any]
    dtype: torch.dtype


PRESETS: dict[str, WanPreset] = {
    "tiny": WanPreset(TINY_TRANSFORMER, TINY_VAE, TINY_UMT5, torch.float32),
    "1.3b": WanPreset(WAN_1_3B_TRANSFORMER, WAN_VAE, SHALLOW_UMT5_XXL, torch.bfloat16),
    "14b": WanPreset(WAN_14B_TRANSFORMER, WAN_VAE, SHALLOW_UMT5_XXL, torch.bfloat16),
}

TOKENIZER_MAX_LENGTH = 512  # what WanPipeline pads prompts to
TOKENIZER_EXTRA_IDS = 8  # T5-style sentinels <extra_id_N>, kept in the vocabulary like T5's
DEFAULT_MAX_SHARD_SIZE = "5GB"

# ---------------------------------------------------------------------------------------------
# Tokenizer

_ALPHABET = string.ascii_letters + string.digits + string.punctuation

# A small English corpus of video-prompt-like sentences.
_CORPUS = """\
A cat walks along the beach at sunset while gentle waves roll onto the sand.
A red sports car drives through a rainy city street at night, neon lights reflecting in puddles.
Two dogs play in a green park, chasing a yellow ball under a bright blue sky.
An astronaut floats slowly inside a space station, looking out at the Earth below.
A chef chops fresh vegetables on a wooden table in a busy restaurant kitchen.
Snow falls quietly over a small village in the mountains as smoke rises from the chimneys.
A hummingbird hovers near a bright flower, its wings moving too fast to see.
Close-up of a cup of coffee, steam rising, morning light through the window.
A drone shot flying over a forest of tall pine trees covered in fog.
A young woman reads a book in a cozy library, turning the pages slowly.
Ocean waves crash against dark rocks during a storm, with lightning in the distance.
A panda eats bamboo in a quiet forest, sitting on a mossy log.
Fireworks explode over a river at midnight, colors reflecting on the water.
A slow motion shot of a glass of water falling and shattering on the floor.
A group of friends laugh around a campfire under a sky full of stars.
A train crosses an old stone bridge in the countryside on a summer afternoon.
Time-lapse of clouds moving across a mountain valley, shadows racing over the hills.
A golden retriever runs through a field of tall grass, ears flapping in the wind.
An old man plays the violin on a street corner while people walk past.
A robot assembles small parts in a clean factory with blue lights.
Cinematic shot of a horse galloping across a desert, dust flying behind it.
A child blows bubbles in a garden, the bubbles floating up into the sunlight.
Aerial view of a city skyline at dawn, with traffic starting to move on the roads.
A sailboat glides across a calm lake surrounded by autumn trees.
A close-up of rain drops running down a window, blurry lights behind the glass.
A fox walks carefully through fresh snow in a winter forest at dusk.
A skateboarder performs a trick in an empty parking lot, shot from a low angle.
Colorful fish swim around a coral reef in clear tropical water.
A hot air balloon rises above green fields in the early morning mist.
A person walks with an umbrella down a narrow street in Paris, 4K, realistic, high quality.
An owl turns its head slowly on a branch under the full moon.
Lava flows down the side of a volcano, glowing orange in the dark night.
A barista pours milk into coffee, making a heart shape in the foam.
Sunlight shines through the leaves of a tall tree, slow camera pan upward.
A kitten sleeps on a soft blanket next to a warm fireplace.
Cars and buses move quickly through a crowded intersection in Tokyo at night.
A waterfall pours into a deep blue pool in the middle of a jungle.
A woman in a white dress dances in an empty hall with large windows.
Wheat fields sway in the wind under a dramatic orange sky, wide angle.
A close-up portrait of an old sailor with a gray beard, soft natural light.
Bright, detailed, sharp focus, smooth motion, vivid colors, best quality, 8K, HDR.
Low quality, blurry, static, worst quality, overexposed, distorted, ugly, extra fingers.
The camera zooms in slowly; then it pans left and right (handheld, shaky), 24 fps.
"""


def corpus_sentences() -> list[str]:
    """The built-in English corpus the tokenizer vocabulary is trained on, one sentence a line."""
    return [line for line in _CORPUS.splitlines() if line.strip()]


def build_tokenizer(vocab_size: int = 1000, extra_ids: int = TOKENIZER_EXTRA_IDS):
    """A T5 tokenizer whose Unigram vocabulary is trained on :func:`corpus_sentences`.

    Same id layout as T5/UMT5: ``<pad>``=0, ``</s>``=1, ``<unk>``=2, the trained pieces, then the
    sentinels ``<extra_id_{extra_ids-1}> … <extra_id_0>``. ``vocab_size`` is an upper bound: the
    trainer stops at what the corpus supports (a few hundred pieces). Deterministic.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import T5Tokenizer

    raw = Tokenizer(models.Unigram())
    # The same pre-tokenizer T5Tokenizer installs, so trained pieces match how it splits text.
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True),
        ]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "</s>", "<unk>"],
        unk_token="<unk>",
        max_piece_length=16,
        show_progress=False,
    )
    raw.train_from_iterator(corpus_sentences(), trainer)
    trained = [piece for piece, _ in json.loads(raw.to_str())["model"]["vocab"]]
    # The trainer picks the same pieces every run, but its scores wobble from run to run (its
    # hash maps iterate in a per-process order). Re-score each piece by the corpus characters
    # it covers, so the file, and every token id, is reproducible.
    specials, learned = trained[:3], trained[3:]
    words = ["▁" + word for line in corpus_sentences() for word in line.split()]
    learned += [c for c in _ALPHABET if c not in learned]  # no ASCII prompt maps to <unk>
    counts = {piece: len(piece) * sum(word.count(piece) for word in words) + 1 for piece in learned}
    total = sum(counts.values())
    scored = sorted(((p, math.log(counts[p] / total)) for p in learned), key=lambda ps: (-ps[1], ps[0]))
    pieces = [(p, 0.0) for p in specials] + scored
    pieces += [(f"<extra_id_{i}>", 0.0) for i in reversed(range(extra_ids))]
    return T5Tokenizer(vocab=pieces, extra_ids=extra_ids, model_max_length=TOKENIZER_MAX_LENGTH)


# ---------------------------------------------------------------------------------------------
# Transformer: streamed, sharded, one module in memory at a time


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    text = size.strip().upper()
    for unit in sorted(units, key=len, reverse=True):
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * units[unit])
    return int(text)


def _module_seed(seed: int, name: str) -> int:
    return zlib.crc32(f"{seed}:{name}".encode()) & 0x7FFFFFFF


def _own_tensors(module: torch.nn.Module) -> list[str]:
    """Names of the parameters and persistent buffers a module holds directly (not recursively)."""
    names = [n for n, p in module.named_parameters(recurse=False) if p is not None]
    names += [
        n for n, b in module.named_buffers(recurse=False)
        if b is not None and n not in module._non_persistent_buffers_set
    ]
    return names


def _init_module(module: torch.nn.Module, own: list[str]) -> None:
    """Random init of a freshly materialized module, as its class would do it."""
    if hasattr(module, "reset_parameters"):
        module.reset_parameters()
        return
    for name in own:
        tensor = getattr(module, name)
        if name == "scale_shift_table":  # what diffusers' Wan blocks do: randn / sqrt(dim)
            tensor.data.normal_().div_(tensor.shape[-1] ** 0.5)
        else:
            tensor.data.normal_(0.0, 0.02)


def write_random_transformer(
    config: dict[str, Any],
    out_dir: str | Path,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write a random ``WanTransformer3DModel`` as diffusers' ``save_pretrained`` lays it out.

    Files: ``config.json`` and either ``diffusion_pytorch_model.safetensors`` or shards
    ``diffusion_pytorch_model-0000i-of-0000n.safetensors`` plus
    ``diffusion_pytorch_model.safetensors.index.json``. Every tensor is stored in ``dtype``.
    Peak memory is about one shard plus one module in float32.
    """
    from diffusers import WanTransformer3DModel
    from diffusers.utils.constants import SAFE_WEIGHTS_INDEX_NAME, SAFETENSORS_WEIGHTS_NAME
    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.device("meta"):
        model = WanTransformer3DModel(**config)
    model.save_config(out)

    # Plan shards from the meta shapes, keeping each module's tensors in one shard.
    limit = _parse_size(max_shard_size)
    itemsize = torch.empty((), dtype=dtype).element_size()
    shards: list[list[tuple[str, torch.nn.Module, list[str]]]] = [[]]
    shard_bytes = 0
    total = 0
    for mod_name, module in model.named_modules():
        own = _own_tensors(module)
        if not own:
            continue
        size = sum(getattr(module, n).numel() for n in own) * itemsize
        if shards[-1] and shard_bytes + size > limit:
            shards.append([])
            shard_bytes = 0
        shards[-1].append((mod_name, module, own))
        shard_bytes += size
        total += size

    n = len(shards)
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        fname = SAFETENSORS_WEIGHTS_NAME if n == 1 else (
            SAFETENSORS_WEIGHTS_NAME.replace(".safetensors", f"-{i:05d}-of-{n:05d}.safetensors")
        )
        tensors: dict[str, torch.Tensor] = {}
        for mod_name, module, own in shard:
            module.to_empty(device="cpu", recurse=False)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(_module_seed(seed, mod_name))
                _init_module(module, own)
            for t_name in own:
                key = f"{mod_name}.{t_name}" if mod_name else t_name
                tensors[key] = getattr(module, t_name).detach().to(dtype).contiguous()
                weight_map[key] = fname
            module.to_empty(device="meta", recurse=False)  # drop the float32 copy
        # Write under a temporary name so an interrupted run leaves no valid-looking shard.
        tmp = out / f".{fname}.partial"
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.replace(out / fname)
        del tensors
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / SAFE_WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return out


# ---------------------------------------------------------------------------------------------
# Whole pipeline directory


def _scheduler(kind: str, flow_shift: float):
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    if kind == Sampler.UNIPC:  # what Wan2.1 ships
        return UniPCMultistepScheduler(
            num_train_timesteps=1000,
            prediction_type="flow_prediction",
            use_flow_sigmas=True,
            flow_shift=flow_shift,
            solver_order=2,
            solver_type="bh2",
        )
    if kind == Sampler.EULER:
        return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=flow_shift)
    raise ValueError(f"scheduler must be 'unipc' or 'euler', got {kind!r}")


def build_wan_dir(
    path: str | Path,
    *,
    preset: str = "tiny",
    transformer_config: dict[str, Any] | None = None,
    vae_config: dict[str, Any] | None = None,
    text_encoder_config: dict[str, Any] | None = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    vae_dtype: torch.dtype = torch.float32,
    text_encoder: bool = True,
    vae: bool = True,
    transformer_only: bool = False,
    scheduler: str = Sampler.UNIPC,
    flow_shift: float = 3.0,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> Path:
    """Write a random Wan2.1 T2V pipeline directory at ``path`` and return it.

    ``preset`` picks the configs (``"tiny"``, ``"1.3b"``, ``"14b"``); ``*_config`` dicts replace
    a preset's config for one component. ``dtype`` is the transformer and text-encoder weight
    dtype (default: float32 for tiny, bfloat16 for the real-size presets); the VAE is stored in
    ``vae_dtype`` (float32, the precision Wan's VAE runs in). ``text_encoder=False`` omits the
    tokenizer and text encoder, ``vae=False`` the VAE; ``transformer_only=True`` omits all three.
    Omitted components are ``[null, null]`` in ``model_index.json``; diffusers then loads the
    directory given them explicitly (``WanPipeline.from_pretrained(path, vae=None,
    text_encoder=None, tokenizer=None)``) and runs with ``prompt_embeds=`` and
    ``output_type="latent"``.

    Deterministic: the same arguments give byte-identical weights. The scheduler is UniPC with
    flow prediction (Wan2.1's own) or flow-matching Euler, both with ``flow_shift``.
    """
    import diffusers
    from diffusers import AutoencoderKLWan
    from transformers import UMT5Config, UMT5EncoderModel

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    chosen = PRESETS[preset]
    t_cfg = dict(transformer_config or chosen.transformer)
    v_cfg = dict(vae_config or chosen.vae)
    e_cfg = dict(text_encoder_config or chosen.text_encoder)
    dtype = dtype or chosen.dtype
    if transformer_only:
        text_encoder = vae = False
    z_dim = v_cfg.get("z_dim", 16)
    # the latent goes in and comes out; an image-to-video DiT (image_dim) also takes its conditioning channels
    if vae and (t_cfg.get("out_channels", 16) != z_dim
                or (t_cfg.get("in_channels", 16) != z_dim and not t_cfg.get("image_dim"))):
        raise ValueError(
            f"transformer in/out_channels ({t_cfg.get('in_channels')}/{t_cfg.get('out_channels')}) "
            f"must equal vae z_dim ({z_dim})"
        )
    if text_encoder and t_cfg.get("text_dim", 4096) != e_cfg["d_model"]:
        raise ValueError(
            f"transformer text_dim ({t_cfg.get('text_dim')}) must equal text encoder d_model ({e_cfg['d_model']})"
        )

    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    write_random_transformer(
        t_cfg, root / "transformer", seed=seed, dtype=dtype, max_shard_size=max_shard_size
    )
    sched = _scheduler(scheduler, flow_shift)
    sched.save_pretrained(root / "scheduler")

    index: dict[str, Any] = {
        "_class_name": "WanPipeline",
        "_diffusers_version": diffusers.__version__,
        "boundary_ratio": None,
        "expand_timesteps": False,
        "scheduler": ["diffusers", type(sched).__name__],
        "text_encoder": [None, None],
        "tokenizer": [None, None],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": [None, None],
    }
    if text_encoder:
        tokenizer = build_tokenizer()
        tokenizer.save_pretrained(root / "tokenizer")
        e_cfg["vocab_size"] = len(tokenizer)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_module_seed(seed, "text_encoder"))
            encoder = UMT5EncoderModel(UMT5Config(**e_cfg)).eval()
        if dtype != torch.float32:
            encoder.to(dtype)
        encoder.save_pretrained(root / "text_encoder", max_shard_size=max_shard_size)
        index["tokenizer"] = ["transformers", type(tokenizer).__name__]
        index["text_encoder"] = ["transformers", "UMT5EncoderModel"]
        del encoder
    if vae:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_module_seed(seed, "vae"))
            autoencoder = AutoencoderKLWan(**v_cfg).eval()
        if vae_dtype != torch.float32:
            autoencoder.to(vae_dtype)
        autoencoder.save_pretrained(root / "vae", max_shard_size=max_shard_size)
        index["vae"] = ["diffusers", "AutoencoderKLWan"]
        del autoencoder
    # Written last: a directory with model_index.json is complete.
    (root / "model_index.json").write_text(json.dumps(index, indent=2) + "\n")
    return root
