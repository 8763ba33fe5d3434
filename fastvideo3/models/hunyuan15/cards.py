"""HunyuanVideo-1.5's configs and built-in cards.

The published text-to-video checkpoints in the diffusers layout (``HunyuanVideo15Pipeline``):
``hunyuanvideo-1.5-480p-t2v`` and ``hunyuanvideo-1.5-720p-t2v``, the same 8.3B DiT trained for
two resolutions (they differ in ``target_size`` and the scheduler's shift). ``hunyuanvideo-1.5-tiny``
describes the architecture at the size of diffusers' own pipeline tests (the parity tests build
such a directory with :func:`~fastvideo3.testing.synthetic_hunyuan15.build_hunyuan15_dir`). Each
card is bound to a directory with ``--model DIR`` (or
:func:`~fastvideo3.card.registry.bind_checkpoint`); a directory's own scheduler shift and guidance
scale become the card's defaults.

Sampling is the pipeline's: flow-matching Euler over ``linspace(1, 0, steps + 1)[:-1]`` shifted
sigmas, classifier-free guidance ``uncond + g * (cond - uncond)`` when ``g > 1``.
"""
from __future__ import annotations

from fastvideo3.card.spec import (
    CheckpointManifest, ComponentSpec, ExtensionContract, Limits, LoopSpec, ModelCard, ParallelismContract,
    ParitySpec, PrecisionContract, RecipeSpec, SamplerSpec,
)
from fastvideo3.models.hunyuan15.layout import TASK_T2V
from fastvideo3.vocab import LoopId, Sampler, Task

FAMILY = "hunyuan15"
#: the pipeline's tokenizer lengths: the Qwen prompt after the template crop, the ByT5 glyph text
TEXT_LEN, TEXT_LEN_2 = 1000, 256

HV15_DIT = dict(
    in_channels=65, out_channels=32, num_attention_heads=16, attention_head_dim=128, num_layers=54,
    num_refiner_layers=2, mlp_ratio=4.0, patch_size=1, patch_size_t=1, qk_norm="rms_norm", text_embed_dim=3584,
    text_embed_2_dim=1472, image_embed_dim=1152, rope_theta=256.0, rope_axes_dim=[16, 56, 56], target_size=640,
    task_type=TASK_T2V, use_meanflow=False,
)
#: the latent layout of the HunyuanVideo-1.5 VAE: 32 channels, 4x temporal, 16x spatial
HV15_VAE = dict(latent_channels=32, temporal_compression_ratio=4, spatial_compression_ratio=16)
TINY_DIT = dict(
    HV15_DIT, in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
    num_refiner_layers=1, mlp_ratio=2.0, text_embed_dim=16, text_embed_2_dim=32, image_embed_dim=12,
    rope_axes_dim=[2, 2, 4], target_size=16,
)
TINY_VAE = dict(latent_channels=4, temporal_compression_ratio=2, spatial_compression_ratio=4)

#: the components a text-to-video request loads, all from the directory (its guider/ holds only the
#: default guidance scale, which the card takes when it is built from the directory)
COMPONENTS = {
    "tokenizer": "tokenizer", "text_encoder": "text_encoder", "tokenizer_2": "tokenizer",
    "text_encoder_2": "text_encoder", "transformer": "dit", "vae": "vae", "scheduler": "scheduler",
}


def hunyuan15_card(model_id: str, description: str, dit: dict, vae: dict, *, flow_shift: float, guidance: float,
                   limits: Limits, default_steps: int = 50) -> ModelCard:
    def comp(cid: str, kind: str, config: dict | None = None, key_map: str | None = None) -> ComponentSpec:
        return ComponentSpec(component_id=cid, kind=kind, source="diffusers_dir", subfolder=cid,
                             config=config or {}, precision="bf16", key_map=key_map)

    configs = {"transformer": dit, "vae": vae}
    return ModelCard(
        model_id=model_id, family=FAMILY, description=description,
        components={cid: comp(cid, kind, configs.get(cid), "hunyuan15_dit_diffusers_v1" if kind == "dit" else None)
                    for cid, kind in COMPONENTS.items()},
        loops={
            LoopId.TEXT_ENCODE: LoopSpec(loop_id=LoopId.TEXT_ENCODE),
            LoopId.DIFFUSION_DENOISE: LoopSpec(
                loop_id=LoopId.DIFFUSION_DENOISE, default_steps=default_steps,
                sampler=SamplerSpec(name=Sampler.EULER, flow_shift=flow_shift, sigma_spacing="linear")),
            LoopId.VAE_DECODE: LoopSpec(loop_id=LoopId.VAE_DECODE),
        },
        # the pipeline's sampler is the only one the weights are served with
        recipe=RecipeSpec(method="base", data_contract="HunyuanVideo-1.5 pretraining (upstream)",
                          assumes_sampler=Sampler.EULER),
        parity=ParitySpec(reference="diffusers.HunyuanVideo15Pipeline"),
        precision=PrecisionContract(),
        parallelism=ParallelismContract(plans=["single"]),
        checkpoint=CheckpointManifest(root=None, required_for={
            Task.TEXT_TO_VIDEO: list(COMPONENTS), Task.VAE_DECODE: ["vae"]}),
        limits=limits.model_copy(update={"default_guidance": guidance}),
        extensions=ExtensionContract(allowed=[]),  # no step or block interceptor is implemented for it
        max_text_tokens=TEXT_LEN + TEXT_LEN_2,
    )


def builtin_cards() -> dict[str, ModelCard]:
    """The HunyuanVideo-1.5 family's built-in cards by model id."""
    # sizes: multiples of 16 (the VAE's 16x, patch 1); 121 frames at 24 fps is the published length
    p480 = Limits(max_frames=121, min_size=64, max_height=848, max_width=848, size_multiple=16, default_frames=121,
                  default_height=480, default_width=848, default_guidance=6.0, fps=24)
    p720 = p480.model_copy(update={"max_height": 1280, "max_width": 1280, "default_height": 720,
                                   "default_width": 1280})
    tiny = Limits(max_frames=33, min_size=16, max_height=128, max_width=128, size_multiple=16, default_frames=9,
                  default_height=32, default_width=48, default_guidance=6.0, fps=24)
    cards = [
        hunyuan15_card("hunyuanvideo-1.5-480p-t2v", "HunyuanVideo-1.5 text-to-video, 480p (diffusers-format "
                       "directory: HunyuanVideo15Pipeline)", HV15_DIT, HV15_VAE, flow_shift=5.0, guidance=6.0,
                       limits=p480),
        hunyuan15_card("hunyuanvideo-1.5-720p-t2v", "HunyuanVideo-1.5 text-to-video, 720p (diffusers-format "
                       "directory: HunyuanVideo15Pipeline)", dict(HV15_DIT, target_size=960), HV15_VAE,
                       flow_shift=9.0, guidance=6.0, limits=p720),
        hunyuan15_card("hunyuanvideo-1.5-tiny", "The HunyuanVideo-1.5 architecture at the size of diffusers' "
                       "pipeline tests (a random directory from build_hunyuan15_dir): parity tests",
                       TINY_DIT, TINY_VAE, flow_shift=7.0, guidance=6.0, limits=tiny, default_steps=4),
    ]
    return {c.model_id: c for c in cards}
