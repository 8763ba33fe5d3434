"""TensorRefs are objects inside a process: every WorkUnit the embedded Engine runs, every result
its pools return and every loop state and request context that holds a ref holds a TensorRef, never
its dict form (which exists only on the wire and in request checkpoints)."""
from __future__ import annotations

import dataclasses

import pytest

from fastvideo3.loop.protocol import LoopState, StepResult
from fastvideo3.engine import Engine
from fastvideo3.transport.ref import TensorRef
from fastvideo3.vocab import RunStatus

pytestmark = pytest.mark.timeout(300)
SMALL = dict(num_frames=9, height=32, width=32, num_inference_steps=2)


class Recording:
    """Wraps a pool executor: keeps every unit and result that crosses ``execute``."""

    def __init__(self, inner, seen: list, states: list, scheduler):
        self.inner, self.seen, self.states, self.scheduler = inner, seen, states, scheduler

    def execute(self, batch):
        for unit in batch:  # the states the scheduler holds right now, for the units it sent
            run = self.scheduler.get(unit.request_id)
            if run is not None and run.driver is not None:
                self.states.append(run.driver.state)
        results = self.inner.execute(batch)
        self.seen.extend(zip(batch, results))
        return results

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _refs_in_state(state: LoopState) -> list:
    """Every value of a loop state that names a ref: the single-ref fields and the name -> ref maps."""
    out = []
    for name in ("embeds", "outputs", "handoff", "latent", "frames"):
        value = getattr(state, name, None)
        if isinstance(value, dict):
            out += [(f"{name}.{k}", v) for k, v in value.items()]
        elif value is not None:
            out.append((name, value))
    return out


def _record(engine: Engine):
    seen: list = []
    states: list = []
    sched = engine.scheduler
    sched.executors = {role: [Recording(ex, seen, states, sched) for ex in replicas]
                       for role, replicas in sched.executors.items()}
    return seen, states


def test_every_unit_result_state_and_context_of_a_generation_holds_tensor_refs():
    with Engine("wan-tiny") as engine:
        seen, states = _record(engine)
        run = engine.submit("a red circle", seed=1, **SMALL)
        engine.run(until=lambda: run.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED))
        assert run.status == RunStatus.SUCCEEDED, run.error
        kinds = {u.kind for u, _ in seen}
        assert kinds == {"encoder_chunk", "diffusion_step", "vae_tile"}
        n_in = n_out = 0
        for unit, res in seen:
            for name, ref in unit.inputs.items():
                assert type(ref) is TensorRef, (unit.kind, name, type(ref))
                n_in += 1
            for name, ref in res.outputs.items():
                assert type(ref) is TensorRef, (unit.kind, name, type(ref))
                n_out += 1
        # embeddings into every denoise step, latents into the decoder; embeddings, latents, frames out
        assert n_in == 2 * SMALL["num_inference_steps"] + 1 and n_out == 4
        held = [(type(s).__name__, n, r) for s in states for n, r in _refs_in_state(s)]
        assert held and all(type(r) is TensorRef for _, _, r in held), held
        assert set(run.ctx.refs) == {"prompt_embeds", "negative_embeds", "latents", "frames"}
        assert all(type(r) is TensorRef for r in run.ctx.refs.values())
        engine.result(run)


def test_a_pool_answering_with_a_dict_ref_fails_the_request_naming_the_output():
    with Engine("wan-tiny") as engine:
        enc = engine.scheduler.executors["encoder"][0]

        class DictPool:
            def execute(self, batch):
                out = enc.execute(batch)
                return [dataclasses.replace(r, outputs={k: v.to_dict() for k, v in r.outputs.items()}) for r in out]

            def __getattr__(self, name):
                return getattr(enc, name)

        engine.scheduler.executors["encoder"] = [DictPool()]
        run = engine.submit("a red circle", seed=1, **SMALL)
        engine.run()
        assert run.status == RunStatus.FAILED
        assert run.error.code == "INTERNAL" and run.error.field.startswith("outputs.")
        assert "not a TensorRef" in run.error.message


def test_loop_states_refuse_a_dict_ref_in_process_and_read_it_from_checkpoint_json():
    from fastvideo3.loop.decode import DecodeState
    ref = TensorRef("denoiser", "r/latents#1", "float32", (1, 16, 3, 4, 4), 4 * 16 * 3 * 16, "none:0", "inproc")
    state = DecodeState(request_id="r", loop_id="vae_decode", model_id="wan-tiny", latent=ref, latent_shape=[16, 3, 4, 4])
    with pytest.raises(ValueError, match="expected a TensorRef"):
        DecodeState(request_id="r", loop_id="vae_decode", model_id="wan-tiny", latent=ref.to_dict(),
                    latent_shape=[16, 3, 4, 4])
    text = state.to_json()
    assert '"buffer_id":"r/latents#1"' in text  # the checkpoint's form: the dict
    back = DecodeState.from_json(text)
    assert type(back.latent) is TensorRef and back == state
    assert hash(back.latent) == hash(ref) and len({ref, back.latent}) == 1  # hashable, equal by value
    with pytest.raises(dataclasses.FrozenInstanceError):
        ref.owner = "elsewhere"  # type: ignore[misc]
    assert StepResult("u", "r", outputs={"latents": ref}).outputs["latents"] is ref
