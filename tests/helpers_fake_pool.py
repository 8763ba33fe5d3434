"""What the scheduler tests' fake pools answer for a unit: fake tensor refs of the shape each unit
kind produces (prompt embeddings, the final step's latents, decoded frames) in a successful
StepResult."""
from __future__ import annotations

from fastvideo3.loop.protocol import StepResult
from services.common.fake import fake_ref


def fake_outputs(role: str, u) -> dict:
    """The outputs a pool of ``role`` returns for unit ``u``: none for a non-final step."""
    if u.kind == "encoder_chunk":
        return {n: fake_ref(role, u.request_id, n, [1, 8, 4]) for n in u.params["prompts"]}
    if u.kind == "diffusion_step" and u.params["final"]:
        return {"latents": fake_ref(role, u.request_id, "z", [1, *u.params["latent_shape"]])}
    if u.kind == "vae_tile":
        return {"frames": fake_ref(role, u.request_id, "f", [9, 8, 8, 3], "uint8")}
    return {}


def fake_result(role: str, u) -> StepResult:
    """A successful StepResult of ``u`` with :func:`fake_outputs` and fixed metrics and timing."""
    return StepResult(u.unit_id, u.request_id, outputs=fake_outputs(role, u), metrics={"latent_norm": 1.0},
                      measured_seconds=0.01)
