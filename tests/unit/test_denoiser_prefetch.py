"""The denoiser's prefetch keeps a failed pull for the ref it pulled only: a request whose input
was made again (its encoder died and encoded the prompt anew) gets the new input at its next
step, not the old pull's error; the old ref's step still sees that error, as if it pulled then."""
from __future__ import annotations

import pytest
import torch

from fastvideo3.loop.params import DiffusionStepParams
from fastvideo3.models.wan.cards import wan_tiny_seeded
from fastvideo3.models.wan.family import latent_shape
from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
from fastvideo3.runtime.scheduling.workunit import WorkUnit
from fastvideo3.transport.inproc import InprocHub, InprocTransport
from fastvideo3.vocab import Role, Sampler, UnitKind

pytestmark = pytest.mark.timeout(120)
FRAMES, SIZE = 5, 32


def _unit(card, ref, rid: str = "req") -> WorkUnit:
    shape = list(latent_shape(card, FRAMES, SIZE, SIZE))
    params = DiffusionStepParams(step=0, timestep=900.0, sigmas=[0.9, 0.0], guidance=1.0, cfg_policy="none",
                                 sampler=Sampler.EULER, solver_order=1, seed=3, latent_shape=shape, final=True)
    return WorkUnit(unit_id=f"{rid}-0", request_id=rid, loop_id="diffusion_denoise", kind=UnitKind.DIFFUSION_STEP,
                    role=Role.DENOISER, card_id=card.model_id, shape_sig=f"s|{shape}", params=params,
                    inputs={"prompt_embeds": ref}, step=0)


def test_a_failed_prefetch_is_not_served_for_the_input_made_again():
    card = wan_tiny_seeded()
    hub = InprocHub()
    ex = DenoiserExecutor(card, InprocTransport("denoiser-0", hub=hub), "cpu")
    embeds = torch.randn(1, card.max_text_tokens, ex.dit.cfg.text_dim, generator=torch.Generator().manual_seed(1))
    old_encoder = InprocTransport("encoder-0", hub=hub)
    old = old_encoder.publish("req", "prompt_embeds", embeds)
    old_encoder.close()  # the encoder died: its ref can no longer be pulled
    ex.prefetch([_unit(card, old)])  # the pull fails and is kept for that unit's step

    [res] = ex.execute([_unit(card, old)])
    assert not res.ok and res.error.code == "UNAVAILABLE" and res.error.field == "owner", res.error

    ex.prefetch([_unit(card, old)])  # pulled (and failed) again while the scheduler makes it anew
    new_encoder = InprocTransport("encoder-0b", hub=hub)
    new = new_encoder.publish("req", "prompt_embeds", embeds)
    [res] = ex.execute([_unit(card, new)])
    assert res.ok, res.error  # the new ref is pulled; the old pull's error is not raised for it
    assert ex.regions["req"].step == 1
    ex.release("req")
    assert not ex._staged  # nothing of the request is left staged
