"""Spawned-rank drivers for the parallel-plan tests (importable by ``torch.multiprocessing.spawn``).

:func:`run_plans` is every rank's body: join a gloo group, and for each plan run the same
scripted denoise (four requests in one step batch, CFG batched, classic and none, a snapshot/restore
midway) through a :class:`ParallelDenoiserExecutor`, after the single-process
:class:`DenoiserExecutor` ran the same units; rank 0 writes, per request, the largest error of the
final latent (relative to its largest value) and of its decoded frames (absolute, in [0, 1]).
"""
from __future__ import annotations

import json
import os

import torch

SHAPE = [16, 3, 12, 8]  # [C, F, H, W]: an 18-token grid (padded on 4 sequence ranks)
STEPS = 3


def _units(card, embeds_refs: dict, rid: str, policy: str, step: int, sched, seed: int):
    from fastvideo3.runtime.scheduling.workunit import WorkUnit
    inputs = {"prompt_embeds": embeds_refs[(rid, "c")]}
    if policy != "none":
        inputs["negative_embeds"] = embeds_refs[(rid, "u")]
    return WorkUnit(
        unit_id=f"{rid}-{step}", request_id=rid, loop_id="diffusion_denoise", kind="diffusion_step", role="denoiser",
        card_id=card.model_id, shape_sig=f"diffusion_step|{card.model_id}|{SHAPE}|fp32|{policy}", inputs=inputs,
        step=step, total=STEPS,
        params={"step": step, "timestep": sched.timesteps[step], "sigmas": sched.sigmas, "guidance": 4.0,
                "cfg_policy": policy, "sampler": "unipc", "solver_order": 2, "seed": seed,
                "latent_shape": SHAPE, "final": step == STEPS - 1})


REQUESTS = (("a", "batched", 1), ("b", "batched", 2), ("c", "classic", 3), ("d", "none", 4))


def script(executor, card, transport) -> dict[str, torch.Tensor]:
    """Run the scripted requests; returns the final latents by request id (leader side)."""
    from fastvideo3.loop.samplers import make_schedule
    sched = make_schedule("unipc", STEPS, 3.0)
    g = torch.Generator().manual_seed(11)
    refs = {}
    for rid, _, _ in REQUESTS:
        for b in ("c", "u"):
            t = torch.randn(1, card.max_text_tokens, 64, generator=g)
            refs[(rid, b)] = transport.publish(rid, f"emb_{b}", t)
    finals: dict[str, torch.Tensor] = {}
    blob = None
    for step in range(STEPS):
        batch = [_units(card, refs, rid, pol, step, sched, seed) for rid, pol, seed in REQUESTS]
        if step == 2:  # a restored copy of "a" joins the batch at the step it was saved after
            batch.append(_units(card, {("a2", k[1]): v for k, v in refs.items() if k[0] == "a"}, "a2", "batched",
                                step, sched, 1))
        for r in executor.execute(batch):
            assert r.ok, r.error
            if "latents" in r.outputs:
                finals[r.request_id] = transport.fetch(r.outputs["latents"], deadline_s=30.0)
        if step == 1:
            blob = executor.snapshot("a")
            assert executor.restore("a2", blob) == 2
    return finals


def run_plans(rank: int, world: int, port: int, specs: list[str], out: str) -> None:
    import torch.distributed as dist

    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.parallel.executor import ParallelDenoiserExecutor
    from fastvideo3.parallel.mesh import build_mesh
    from fastvideo3.parallel.plan import ParallelPlan
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    card = wan_tiny()
    from fastvideo3.export.errors import FingerprintMismatch
    ref_t = make_transport("inproc", owner="one-device")
    one = DenoiserExecutor(card, ref_t, "cpu")
    want = script(one, card, ref_t)
    previous = [one.snapshot("a")]
    report = {}
    vae = frames_want = None
    for spec in specs:
        mesh = build_mesh(ParallelPlan.parse(spec), rank, world, "cpu")
        transport = make_transport("inproc", owner=f"r{rank}-{spec}")
        ex = ParallelDenoiserExecutor(card, transport, mesh, "cpu")
        got = script(ex, card, transport)
        refused = []  # a snapshot of another plan (or of one device) never restores here
        for other in previous:
            try:
                ex.restore("foreign", other)
                refused.append(False)
            except FingerprintMismatch:
                refused.append(True)
        previous.append(ex.snapshot("a"))
        if rank == 0:
            if vae is None:
                from fastvideo3.models.wan.components import VideoDecoder
                vae = VideoDecoder(card, "cpu", torch.float32)
                frames_want = {rid: vae.decode(lat) for rid, lat in want.items()}
            report[spec] = {rid: {"latent_rel": float((got[rid] - want[rid]).abs().max() / want[rid].abs().max()),
                                  "frames_abs": float((vae.decode(got[rid]) - frames_want[rid]).abs().max())}
                            for rid in want}
            report[spec]["a2_vs_a"] = float((got["a2"] - got["a"]).abs().max() / got["a"].abs().max())
            report[spec]["fingerprint_names_plan"] = f"parallel:{mesh.plan.spec}" in ex.identity.graph_names
            report[spec]["foreign_snapshots_refused"] = refused
        dist.barrier()
    if rank == 0:
        with open(os.path.join(out, f"report_{world}.json"), "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


def run_spmd(rank: int, world: int, port: int, spec: str, out: str) -> None:
    """Rank 0 drives a :class:`LeaderExecutor` with the script (inputs exist on rank 0 only: the
    others get them with each broadcast batch); every other rank serves what it broadcasts."""
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.parallel.executor import ParallelDenoiserExecutor
    from fastvideo3.parallel.mesh import init_mesh, shutdown
    from fastvideo3.parallel.plan import ParallelPlan
    from fastvideo3.parallel.spmd import LeaderExecutor, serve_worker
    from fastvideo3.runtime.pool.executors import DenoiserExecutor
    from fastvideo3.transport import make_transport

    torch.set_num_threads(1)
    card = wan_tiny()
    mesh = init_mesh(ParallelPlan.parse(spec), rank, world, f"127.0.0.1:{port}", "cpu", timeout_s=60)
    if rank != 0:
        code = serve_worker(ParallelDenoiserExecutor(card, None, mesh, "cpu"))
        shutdown()  # tear the groups down before the process exits, as run_plans does
        assert code == 0, code
        return
    transport = make_transport("inproc", owner="leader")
    leader = LeaderExecutor(card, transport, mesh, "cpu", heartbeat_s=0.5)
    got = script(leader, card, transport)
    leader.release("b")
    report = {"resident_after_release": sorted(leader.regions), "describe": leader.describe()["parallel"]}
    ref_t = make_transport("inproc", owner="reference")
    want = script(DenoiserExecutor(card, ref_t, "cpu"), card, ref_t)
    report["latent_rel"] = {rid: float((got[rid] - want[rid]).abs().max() / want[rid].abs().max()) for rid in want}
    leader.stop()
    with open(os.path.join(out, "spmd.json"), "w") as f:
        json.dump(report, f)
    shutdown()
