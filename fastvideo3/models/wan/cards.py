"""Wan's configs and built-in cards.

``wan-tiny`` is the embedded default: the Wan2.1 architecture at a tiny size, trained by the
tiny recipe (``bench/train_tiny.py``: flow matching on procedural shape clips) and shipped inside
the package, so it runs anywhere with no download. ``wan-tiny-4step`` is its 4-step distilled
student (served only at 4 Euler steps), and ``wan-tiny-seeded`` the same architecture with
untrained weights drawn from a seed. The Wan2.1 1.3B / 14B cards describe the real
architectures; they are bound to a user's diffusers-format directory with
:func:`~fastvideo3.card.registry.bind_checkpoint` (or ``--model DIR`` on the CLI). ``wan-tiny``,
``wan2.1-t2v-1.3b`` and ``wan2.1-t2v-14b`` each have an ``-fp8`` variant
(:func:`~fastvideo3.card.registry.fp8_variant`). They reach the card registry through the Wan
family object (models/wan/family.py).
"""
from __future__ import annotations

from fastvideo3.card.registry import fp8_variant
from fastvideo3.card.spec import (
    CheckpointManifest, ComponentSpec, ExpertsSpec, ExtensionContract, GraphBucketSpec, GraphShape, Limits, LoopSpec,
    ModelCard, ParallelismContract, PrecisionContract, RecipeSpec, SamplerSpec,
)
from fastvideo3.models.wan.layout import WAN22_VAE
from fastvideo3.vocab import LoopId, Sampler, Task

#: every Wan card may run its denoiser on several ranks (fastvideo3.parallel)
_WAN_PARALLELISM = ParallelismContract(plans=["single", "sp_ulysses", "sp_ring", "hybrid"], cfg_parallel=True)

TINY_DIT = dict(
    patch_size=[1, 4, 4], num_attention_heads=9, attention_head_dim=32, in_channels=16, out_channels=16,
    text_dim=64, freq_dim=64, ffn_dim=576, num_layers=4, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=64,
)
#: the DiT config of the shipped (trained) tiny weights; bench/ship_tiny.py rewrites it from a
#: training run's log. The seeded baseline keeps TINY_DIT.
TINY_SHIPPED_DIT = dict(
    patch_size=[1, 2, 2], num_attention_heads=9, attention_head_dim=32, in_channels=16,
    out_channels=16, text_dim=64, freq_dim=64, ffn_dim=576, num_layers=4, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-06, rope_max_seq_len=64,
)
#: the tiny recipe's VAE: a patch autoencoder with the Wan VAE's latent layout (models/wan/patch_vae.py)
TINY_VAE = dict(arch="patch", z_dim=16, enc_dim=64, dec_dim=96)
TINY_TEXT = dict(vocab_size=384, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                 relative_attention_num_buckets=32, relative_attention_max_distance=64,
                 dropout_rate=0.0, tokenizer="bytes")
#: per-channel latent statistics of the trained tiny VAE (measured by bench/train_tiny.py); the
#: decoder de-normalises with them, so they belong to the shipped VAE's config
TINY_VAE_STATS = dict(
    latents_mean=[-0.564, -0.05388, 0.02332, 0.24649, -0.42514, -0.7023, 0.81051, 1.31144, 0.29235,
        0.67625, -0.04795, 0.02488, -0.71571, -0.64437, -0.12039, 1.50419],
    latents_std=[1.24603, 1.82572, 1.07532, 0.6958, 0.73215, 1.19762, 1.8137, 1.0869, 0.92468,
        1.63938, 0.39097, 1.83864, 1.16929, 1.72197, 0.55681, 1.37951],
)
#: the guidance scale the trained card serves with by default (picked by the training run's probe)
TINY_GUIDANCE = 3.0
TINY_TRAINING_COMMAND = ("bash bench/gpu_train_tiny.sh 1, then bash bench/gpu_train_tiny.sh 2 runs/c1 (one H200, two "
                         "chunks of about 7 minutes; patch VAE from bench/train_tiny.py --stages vae; exact commands "
                         "and probes: bench/results/train_h200_c1.json, train_h200_c2.json)")

#: full-content digests of the shipped weight files (relative to fastvideo3/weights). A pool checks
#: the files it loads against them at start; after retraining, regenerate with
#: ``python -m fastvideo3.card.verify --card wan-tiny --print-digests`` (and wan-tiny-4step).
SHIPPED_DIGESTS = {
    "wan-tiny/text_encoder.safetensors":
        "sha256:8b89928cceaa0a01e552d4993ee0521e9579406baf298dac8c2e19dd3b74f9e6",
    "wan-tiny/transformer.safetensors":
        "sha256:423169e93f204f8881bf11884fc3e211c0433871dff56d9ce70134e1dbe1de5d",
    "wan-tiny/vae.safetensors":
        "sha256:4a29bdce528e5771a370b31c1877f8664ecf046feb2d6e39cc5b77c3925b14d1",
    "wan-tiny-4step/transformer.safetensors":
        "sha256:13f2dd2ad7edbf40d11e12240fa08c2188d9c5e9ffe7622b47180b47194263c1",
}

WAN_1_3B_DIT = dict(
    patch_size=[1, 2, 2], num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
    text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=30, cross_attn_norm=True,
    qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024,
)
WAN_14B_DIT = dict(WAN_1_3B_DIT, num_attention_heads=40, ffn_dim=13824, num_layers=40)

#: CUDA-graph buckets (rows per DiT forward; batched CFG is 2 rows a request) at each card's default
#: shape: the tiny cards batch many requests; a real card's default video is large, so a few rows
#: cover one or two requests with CFG (the serving workload's smaller shapes run eagerly unless a
#: card file declares them)
TINY_GRAPH_ROWS = [1, 2, 4, 8, 16, 32]
WAN_1_3B_GRAPH_ROWS = [1, 2, 4]
WAN_LARGE_GRAPH_ROWS = [1, 2]


def graph_buckets(rows: list[int], limits: Limits) -> GraphBucketSpec:
    """``rows`` at the card's default request shape."""
    shape = GraphShape(frames=limits.default_frames, height=limits.default_height, width=limits.default_width)
    return GraphBucketSpec(rows=rows, shapes=[shape])


_T2V_TASKS = {Task.TEXT_TO_VIDEO: ["text_encoder", "transformer", "vae"], Task.VAE_DECODE: ["vae"]}


def _denoise(default_steps: int, flow_shift: float, sampler: str = Sampler.UNIPC) -> LoopSpec:
    return LoopSpec(loop_id=LoopId.DIFFUSION_DENOISE, default_steps=default_steps,
                    sampler=SamplerSpec(name=sampler, flow_shift=flow_shift))


def _loops(default_steps: int, flow_shift: float) -> dict[str, LoopSpec]:
    return {
        LoopId.TEXT_ENCODE: LoopSpec(loop_id=LoopId.TEXT_ENCODE),
        LoopId.DIFFUSION_DENOISE: _denoise(default_steps, flow_shift),
        LoopId.VAE_DECODE: LoopSpec(loop_id=LoopId.VAE_DECODE),
    }


def _tiny(model_id: str, description: str, components: dict[str, ComponentSpec], loops: dict[str, LoopSpec],
          recipe: RecipeSpec, guidance: float, precision: PrecisionContract | None = None,
          extensions: ExtensionContract | None = None) -> ModelCard:
    # sizes are multiples of 32: the VAE's 8x times the DiT's 4x4 latent patch
    limits = Limits(max_frames=65, min_size=32, max_height=512, max_width=512, size_multiple=32,
                    default_frames=33, default_height=128, default_width=128, default_guidance=guidance)
    return ModelCard(
        model_id=model_id,
        description=description,
        components=components,
        loops=loops,
        recipe=recipe,
        precision=precision or PrecisionContract(),
        parallelism=_WAN_PARALLELISM,
        checkpoint=CheckpointManifest(root=None, seed=0, required_for=_T2V_TASKS, digests={
            c.subfolder: SHIPPED_DIGESTS[c.subfolder] for c in components.values()
            if c.source == "shipped" and c.subfolder in SHIPPED_DIGESTS}),
        limits=limits,
        extensions=extensions or ExtensionContract(),
        max_text_tokens=64,
        graph_buckets=graph_buckets(TINY_GRAPH_ROWS, limits),
    )


def _shipped(component: str, kind: str, config: dict, file: str, key_map: str | None = None) -> ComponentSpec:
    return ComponentSpec(component_id=component, kind=kind, source="shipped", subfolder=file, config=config,
                         key_map=key_map)


def _tiny_shipped_components(transformer_file: str) -> dict[str, ComponentSpec]:
    return {
        "text_encoder": _shipped("text_encoder", "text_encoder", TINY_TEXT, "wan-tiny/text_encoder.safetensors"),
        "transformer": _shipped("transformer", "dit", TINY_SHIPPED_DIT, transformer_file, "wan_dit_diffusers_v1"),
        "vae": _shipped("vae", "vae", {**TINY_VAE, **TINY_VAE_STATS}, "wan-tiny/vae.safetensors"),
    }


_TRAINED_FP32 = PrecisionContract(supported=["fp32"], default_cpu="fp32", default_cuda="fp32")


def wan_tiny() -> ModelCard:
    return _tiny(
        "wan-tiny",
        "Wan2.1 architecture at a tiny size, trained with flow matching on procedural shape clips "
        "(a colored circle, square or triangle moving left, right, up or down on a plain background); "
        "weights ship in the package.",
        _tiny_shipped_components("wan-tiny/transformer.safetensors"),
        _loops(default_steps=50, flow_shift=3.0),
        RecipeSpec(method="flow_matching", data_contract="procedural shapes v1", assumes_loop=LoopId.DIFFUSION_DENOISE,
                   assumes_precision="fp32", consistency_required="C1", training_command=TINY_TRAINING_COMMAND),
        guidance=TINY_GUIDANCE,
        precision=_TRAINED_FP32,
        # tuned on this card's 50-step schedule (bench/cache_quality.py): about half the block
        # evaluations skipped at >= 30 dB PSNR against uncached frames
        extensions=ExtensionContract(params={"dbcache": {"threshold": 0.2, "warmup_steps": 4, "taylorseer": True}}),
    )


def wan_tiny_4step() -> ModelCard:
    return _tiny(
        "wan-tiny-4step",
        "wan-tiny distilled to 4 Euler steps without guidance (reflow on the teacher's guided rollouts); "
        "served only at 4 steps with the euler sampler.",
        _tiny_shipped_components("wan-tiny-4step/transformer.safetensors"),
        {LoopId.TEXT_ENCODE: LoopSpec(loop_id=LoopId.TEXT_ENCODE),
         LoopId.DIFFUSION_DENOISE: LoopSpec(loop_id=LoopId.DIFFUSION_DENOISE, default_steps=4,
                                       sampler=SamplerSpec(name=Sampler.EULER, flow_shift=3.0)),
         LoopId.VAE_DECODE: LoopSpec(loop_id=LoopId.VAE_DECODE)},
        RecipeSpec(method="step_distill", parents=["wan-tiny"], data_contract="procedural shapes v1 "
                   "(teacher rollouts: wan-tiny, 25 unipc steps, guided)", assumes_loop=LoopId.DIFFUSION_DENOISE,
                   assumes_steps=4, assumes_sampler=Sampler.EULER, assumes_precision="fp32", consistency_required="C1",
                   training_command=TINY_TRAINING_COMMAND),
        guidance=1.0,  # guidance is distilled in: one conditional forward per step
        precision=_TRAINED_FP32,
        extensions=ExtensionContract(allowed=[]),  # 4 distilled steps: reusing any of them is refused
    )


def wan_tiny_seeded() -> ModelCard:
    return _tiny(
        "wan-tiny-seeded",
        "The wan-tiny architecture with untrained weights drawn from a seed (no files): a baseline.",
        {
            "text_encoder": ComponentSpec(component_id="text_encoder", kind="text_encoder", config=TINY_TEXT),
            "transformer": ComponentSpec(component_id="transformer", kind="dit", config=TINY_DIT,
                                         key_map="wan_dit_diffusers_v1"),
            "vae": ComponentSpec(component_id="vae", kind="vae", config=TINY_VAE),
        },
        _loops(default_steps=8, flow_shift=3.0),
        RecipeSpec(method="seeded", data_contract="none: weights drawn from a seeded generator"),
        guidance=5.0,
    )


def _wan_real(model_id: str, dit: dict, desc: str, graph_rows: list[int] = WAN_LARGE_GRAPH_ROWS) -> ModelCard:
    def comp(cid: str, kind: str, sub: str, config: dict | None = None, key_map: str | None = None):
        return ComponentSpec(component_id=cid, kind=kind, source="diffusers_dir", subfolder=sub,
                             config=config or {}, precision="bf16", key_map=key_map)

    limits = Limits(max_frames=129, max_height=1280, max_width=1280)
    return ModelCard(
        model_id=model_id,
        description=desc,
        components={
            "tokenizer": comp("tokenizer", "tokenizer", "tokenizer"),
            "text_encoder": comp("text_encoder", "text_encoder", "text_encoder"),
            "transformer": comp("transformer", "dit", "transformer", dit, "wan_dit_diffusers_v1"),
            "vae": comp("vae", "vae", "vae"),
            "scheduler": comp("scheduler", "scheduler", "scheduler"),
        },
        loops=_loops(default_steps=50, flow_shift=3.0),
        recipe=RecipeSpec(method="base", data_contract="Wan2.1 pretraining (upstream)"),
        # the VAE decodes in bf16 on a GPU (frames within parity.vae_bf16_frames_abs of fp32)
        precision=PrecisionContract(vae_cuda="bf16"),
        checkpoint=CheckpointManifest(
            root=None,
            required_for={Task.TEXT_TO_VIDEO: ["tokenizer", "text_encoder", "transformer", "vae", "scheduler"],
                          Task.VAE_DECODE: ["vae"]},
        ),
        limits=limits,
        parallelism=_WAN_PARALLELISM,
        max_text_tokens=512,
        graph_buckets=graph_buckets(graph_rows, limits),
    )


#: Wan2.2 A14B text-to-video: two Wan2.1-14B-shaped experts, the switch at 0.875 of the training
#: timesteps, UniPC with flow shift 12, guidance 4.0 (high noise) and 3.0 (low noise), 40 steps
WAN22_A14B_T2V = dict(boundary_ratio=0.875, flow_shift=12.0, default_steps=40, guidance=4.0, guidance_2=3.0)


def wan22_moe(model_id: str, dit: dict, desc: str, *, boundary_ratio: float, flow_shift: float = 12.0,
              default_steps: int = 40, guidance: float = 4.0, guidance_2: float | None = 3.0) -> ModelCard:
    """A two-expert Wan2.2 T2V card (diffusers' WanPipeline with ``transformer_2`` and
    ``boundary_ratio``): ``transformer`` denoises high noise, ``transformer_2`` low noise."""
    base = _wan_real(model_id, dit, desc)
    data = base.model_dump(mode="json")
    data["components"]["transformer_2"] = dict(data["components"]["transformer"], component_id="transformer_2",
                                               subfolder="transformer_2")
    data["checkpoint"]["required_for"][Task.TEXT_TO_VIDEO].append("transformer_2")
    data["loops"][LoopId.DIFFUSION_DENOISE] = _denoise(default_steps, flow_shift).model_copy(update={
        "experts": ExpertsSpec(boundary_ratio=boundary_ratio, default_guidance_2=guidance_2)}).model_dump(mode="json")
    data["recipe"]["data_contract"] = "Wan2.2 pretraining (upstream)"
    data["limits"]["default_guidance"] = guidance
    return ModelCard.model_validate(data)


#: Wan2.2 TI2V-5B's DiT: 24 heads x 128 = 3072 wide, 30 layers, 48 latent channels
WAN22_5B_DIT = dict(WAN_1_3B_DIT, num_attention_heads=24, in_channels=48, out_channels=48, ffn_dim=14336)


def wan22_ti2v(model_id: str, dit: dict, desc: str, *, flow_shift: float = 5.0, default_steps: int = 50,
               guidance: float = 5.0) -> ModelCard:
    """A Wan2.2 TI2V-5B card served as text-to-video (diffusers' WanPipeline with
    ``expand_timesteps``): the 48-channel VAE with 16x spatial compression, 24 fps, 720p."""
    base = _wan_real(model_id, dit, desc)
    data = base.model_dump(mode="json")
    data["components"]["vae"]["config"] = dict(WAN22_VAE)
    data["loops"][LoopId.DIFFUSION_DENOISE] = _denoise(default_steps, flow_shift).model_dump(mode="json")
    data["recipe"]["data_contract"] = "Wan2.2 pretraining (upstream)"
    # sizes: multiples of 32 (the VAE's 16x times the DiT's 2x2 patch); 1280x704 is the published 720p
    limits = Limits(max_frames=129, min_size=32, max_height=1280, max_width=1280, size_multiple=32,
                    default_frames=121, default_height=704, default_width=1280, default_guidance=guidance, fps=24)
    data["limits"] = limits.model_dump(mode="json")
    data["graph_buckets"] = graph_buckets(WAN_LARGE_GRAPH_ROWS, limits).model_dump(mode="json")
    return ModelCard.model_validate(data)


#: Wan2.1 I2V 14B's DiT (480P and 720P share it): the 14B T2V DiT with image cross-attention over
#: CLIP ViT-H/14's 1280-wide hidden states and 36 input channels (latent 16 + mask 4 + image latent 16)
WAN_I2V_14B_DIT = dict(WAN_14B_DIT, in_channels=36, image_dim=1280, added_kv_proj_dim=5120)
#: the tiny I2V DiT of the test directory (fastvideo3/testing/synthetic_layouts.build_wan21_i2v_dir)
TINY_I2V_DIT = dict(
    patch_size=[1, 2, 2], num_attention_heads=2, attention_head_dim=16, in_channels=36, out_channels=16, text_dim=32,
    freq_dim=32, ffn_dim=64, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    rope_max_seq_len=32, image_dim=32, added_kv_proj_dim=32,
)
#: the published I2V checkpoints' serving defaults: 81 frames at 480x832 (flow shift 3) or 720x1280 (5)
WAN21_I2V_480P = dict(flow_shift=3.0, default_height=480, default_width=832)
WAN21_I2V_720P = dict(flow_shift=5.0, default_height=720, default_width=1280)
_I2V_COMPONENTS = ["tokenizer", "text_encoder", "image_processor", "image_encoder", "transformer", "vae", "scheduler"]


def wan21_i2v(model_id: str, dit: dict, desc: str, *, flow_shift: float, default_height: int, default_width: int,
              default_frames: int = 81, default_steps: int = 50, guidance: float = 5.0, max_size: int = 1280,
              min_size: int = 16, image_tokens: int = 257) -> ModelCard:
    """A Wan2.1 image-to-video card (diffusers' WanImageToVideoPipeline): the T2V components plus
    the CLIP image encoder and its processor; the DiT takes the image's CLIP hidden states and the
    first-frame latent conditioning. One DiT, served at one rank (no sequence-parallel plan and
    no interceptor covers the image inputs yet). ``image_tokens``: the image encoder's sequence
    length (CLIP ViT-H/14 at 224 px: 16 x 16 patches + the class token), for the cost model."""
    base = _wan_real(model_id, dit, desc)
    data = base.model_dump(mode="json")
    for cid in ("image_encoder", "image_processor"):
        cfg = {"tokens": image_tokens} if cid == "image_encoder" else {}
        data["components"][cid] = ComponentSpec(component_id=cid, kind=cid, source="diffusers_dir", subfolder=cid,
                                                precision="fp32", config=cfg).model_dump(mode="json")
    data["capabilities"]["tasks"] = [Task.IMAGE_TO_VIDEO, Task.VAE_DECODE]
    data["checkpoint"]["required_for"] = {Task.IMAGE_TO_VIDEO: list(_I2V_COMPONENTS), Task.VAE_DECODE: ["vae"]}
    data["loops"][LoopId.DIFFUSION_DENOISE] = _denoise(default_steps, flow_shift).model_dump(mode="json")
    data["parity"]["reference"] = "diffusers.WanImageToVideoPipeline"
    data["parallelism"] = ParallelismContract(plans=["single"]).model_dump(mode="json")
    data["extensions"] = ExtensionContract(allowed=[]).model_dump(mode="json")
    data["limits"] = Limits(max_frames=129, min_size=min_size, max_height=max_size, max_width=max_size,
                            size_multiple=16, default_frames=default_frames, default_height=default_height,
                            default_width=default_width, default_guidance=guidance).model_dump(mode="json")
    # no graph buckets: an image-conditioned step runs eagerly (the runtime export's ports carry no image)
    data["graph_buckets"] = GraphBucketSpec().model_dump(mode="json")
    return ModelCard.model_validate(data)


def i2v_cards() -> list[ModelCard]:
    return [
        wan21_i2v("wan2.1-i2v-14b-480p", WAN_I2V_14B_DIT, "Wan2.1 image-to-video 14B, 480P (diffusers-format "
                  "directory with image_encoder and image_processor)", **WAN21_I2V_480P),
        wan21_i2v("wan2.1-i2v-14b-720p", WAN_I2V_14B_DIT, "Wan2.1 image-to-video 14B, 720P (diffusers-format "
                  "directory with image_encoder and image_processor)", **WAN21_I2V_720P),
        wan21_i2v("wan2.1-i2v-tiny", TINY_I2V_DIT, "The Wan2.1 I2V layout at a tiny size (random weights written "
                  "by diffusers: fastvideo3/testing/synthetic_layouts.build_wan21_i2v_dir): parity tests",
                  flow_shift=3.0, default_height=32, default_width=48, default_frames=9, default_steps=4,
                  max_size=512, image_tokens=17),
    ]


def builtin_cards() -> dict[str, ModelCard]:
    """The Wan family's built-in cards by model id."""
    w13 = _wan_real("wan2.1-t2v-1.3b", WAN_1_3B_DIT, "Wan2.1 text-to-video 1.3B (diffusers-format directory)",
                    graph_rows=WAN_1_3B_GRAPH_ROWS)
    w14 = _wan_real("wan2.1-t2v-14b", WAN_14B_DIT, "Wan2.1 text-to-video 14B (diffusers-format directory)")
    tiny = wan_tiny()
    w22 = wan22_moe("wan2.2-t2v-a14b", WAN_14B_DIT, "Wan2.2 text-to-video A14B: two 14B experts split by noise "
                    "level (diffusers-format directory with transformer_2)", **WAN22_A14B_T2V)
    cards = [
        tiny,
        w22,
        wan22_ti2v("wan2.2-ti2v-5b", WAN22_5B_DIT, "Wan2.2 TI2V-5B served as text-to-video: 48-channel VAE, 16x "
                   "spatial compression (diffusers-format directory with expand_timesteps)"),
        wan_tiny_4step(),
        wan_tiny_seeded(),
        w13,
        w14,
        fp8_variant(tiny, "wan-tiny-fp8"),
        fp8_variant(w13, "wan2.1-t2v-1.3b-fp8"),
        fp8_variant(w14, "wan2.1-t2v-14b-fp8"),
        *i2v_cards(),
    ]
    return {c.model_id: c for c in cards}
