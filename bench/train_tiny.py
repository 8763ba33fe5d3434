"""Train the tiny recipe end to end: VAE -> DiT + text encoder -> guidance probe -> 4-step student.

    python bench/train_tiny.py --device cuda --out OUT            # every stage in one run
    python bench/train_tiny.py --smoke --out /tmp/smoke           # minutes on a CPU, tiny sizes
    python bench/train_tiny.py --stages vae --out R0              # one stage; later runs continue
    python bench/train_tiny.py --stages dit,probe --init-from R0 --out R1   # with --init-from

The shipped weights came from such a chain on a CPU; bench/results/train_cpu.json records the
exact commands, step counts, loss curves and probes.

Every stage is bounded by a wall-clock budget (``--*-seconds``), so the run ends on time on any
machine; the step counts reached are recorded. The weights are written in the shipped layout
under ``--weights-dir`` (default: the package's ``fastvideo3/weights``) and copied to ``--out``
with ``train_log.json`` (config, timings, loss curves, latent statistics, probe results) and
``train_loss.png`` when matplotlib is importable. The trained cards (``wan-tiny``,
``wan-tiny-4step``) read those files; the VAE's latent statistics and the picked guidance go
into ``fastvideo3/models/wan/cards.py`` (TINY_VAE_STATS, TINY_GUIDANCE) from the log.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from options import add_defaults  # noqa: E402 - the sibling module in bench/

from fastvideo3.models.wan import cards as registry  # noqa: E402
from fastvideo3.models.reward.adherence import AdherenceScorer  # noqa: E402
from fastvideo3.models.wan.components import WEIGHTS_DIR, TextEncoder, load_dit, load_shipped  # noqa: E402
from fastvideo3.engine import Engine  # noqa: E402
from fastvideo3.training.checkpoint import save_shipped  # noqa: E402
from fastvideo3.training.data import ShapesDataset, eval_prompts  # noqa: E402
from fastvideo3.training.distill import DistillConfig, PairSet, distill_student  # noqa: E402
from fastvideo3.training.probe import caption_probe, direction_probe  # noqa: E402
from fastvideo3.training.rollout import Rollout  # noqa: E402
from fastvideo3.training.trainer import DiTTrainConfig, JointTrainer, train_dit  # noqa: E402
from fastvideo3.training.vae import (  # noqa: E402
    LatentCodec, VAETrainConfig, build_vae, latent_stats, roundtrip_check, train_vae,
)

FILES = {"text_encoder": "wan-tiny/text_encoder.safetensors", "transformer": "wan-tiny/transformer.safetensors",
         "vae": "wan-tiny/vae.safetensors", "student": "wan-tiny-4step/transformer.safetensors"}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", required=True, help="logs, plot and a copy of the weights go here")
    p.add_argument("--weights-dir", default=str(WEIGHTS_DIR), help="where the shipped weight files are written")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and budgets: a pipeline check on a CPU")
    add_defaults(p, frames=33, size=128, vae_seconds=60.0, vae_batch=16, vae_frames=17, dit_seconds=140.0,
                 dit_batch=128)
    p.add_argument("--data-seed", type=int, default=None,
                   help="seed of the DiT stage's clips (default 11, or 12 when continuing with --init-from)")
    p.add_argument("--dit-lr", type=float, default=1e-3, help="peak DiT learning rate (the text encoder gets half)")
    p.add_argument("--probe-guidance", default="1,3,5", help="guidance values the probe compares")
    p.add_argument("--teacher-steps", type=int, default=25, help="teacher steps of the distillation rollouts")
    add_defaults(p, rollout_seconds=35.0, rollout_wave=128, max_pairs=4096, distill_seconds=40.0, distill_batch=96)
    p.add_argument("--probe-prompts", type=int, default=20, help="how many of the eval prompts the probes use")
    p.add_argument("--stages", default="vae,dit,probe,distill", help="stages to run; the others come from --init-from")
    p.add_argument("--init-from", default=None,
                   help="a previous run's --out directory: skipped stages take its weights, statistics and "
                        "guidance, and a DiT stage continues from its DiT and text encoder")
    p.add_argument("--guidance", type=float, default=None, help="guidance when the probe stage is skipped")
    p.add_argument("--final-probe", action="store_true", help="probe both trained cards at the end")
    # -- chunks: a run that continues a previous chunk's checkpoint --------------------------
    p.add_argument("--resume", default=None,
                   help="a previous chunk's --out: its train_log.json, EMA weights and train_state.pt (raw "
                        "weights, counters); implies --init-from DIR and continues its DiT training")
    p.add_argument("--chunk-seconds", type=float, default=None,
                   help="wall-clock budget of this whole run: the DiT stage is cut so the later stages "
                        "(their own budgets plus --reserve-seconds) still fit")
    p.add_argument("--reserve-seconds", type=float, default=30,
                   help="with --chunk-seconds: time kept for probes, saving and start-up beyond the stage budgets")
    p.add_argument("--no-state", action="store_true", help="do not write train_state.pt (a last chunk)")
    # -- the DiT recipe -----------------------------------------------------------------------
    p.add_argument("--patch", default="1,2,2",
                   help="DiT patch (t,h,w); 1,2,2 gives 16 px tokens at 128 px (1,4,4: 32 px tokens, "
                        "the shipped CPU weights)")
    p.add_argument("--dit-config", default=None, help="JSON overrides of the DiT config (TINY_DIT)")
    p.add_argument("--groups", action=argparse.BooleanOptionalAction, default=True,
                   help="direction groups: every scene in all four directions in one batch, shared noise")
    p.add_argument("--text-aux", type=float, default=0.1,
                   help="weight of the auxiliary direction classifier on the text encoder's output (0: off)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                   help="bf16 autocast for the DiT stage (default: on with CUDA)")
    p.add_argument("--dit-reuse", type=int, default=3, help="optimizer steps per rendered+encoded batch")
    p.add_argument("--dit-warmup", type=int, default=200)
    p.add_argument("--ema-decay", type=float, default=0.999)
    p.add_argument("--dir-probe-every", type=float, default=60,
                   help="seconds between direction probes in the DiT stage (0: only at the end)")
    p.add_argument("--dir-probe-seeds", default="0,1", help="seeds per eval prompt of the direction probe")
    p.add_argument("--dir-probe-steps", type=int, default=16, help="Euler steps of the direction probe")
    p.add_argument("--dir-probe-guidance", type=float, default=3.0)
    p.add_argument("--stop-direction", type=float, default=None,
                   help="end the DiT stage once two probes in a row reach this direction rate")
    a = p.parse_args(argv)
    if a.resume:
        a.init_from = a.resume
    if a.smoke:
        a.frames, a.size, a.vae_frames, a.vae_batch, a.dit_batch = 5, 32, 5, 2, 4
        a.vae_seconds, a.dit_seconds, a.rollout_seconds, a.distill_seconds = 8, 10, 5, 5
        a.rollout_wave, a.max_pairs, a.distill_batch, a.teacher_steps, a.probe_prompts = 4, 8, 4, 4, 4
        a.dir_probe_steps, a.dir_probe_seeds, a.dit_warmup = 4, "0", 10
    return a


def dit_overrides(a, prev: dict) -> dict:
    """The DiT config of this run: the registry's TINY_DIT with a previous chunk's or this run's changes."""
    if prev.get("card_update", {}).get("TINY_DIT"):
        return dict(prev["card_update"]["TINY_DIT"])
    cfg = dict(registry.TINY_DIT)
    cfg["patch_size"] = [int(x) for x in a.patch.split(",")]
    if a.dit_config:
        cfg.update(json.loads(a.dit_config))
    return cfg


def with_dit(card, dit_cfg: dict):
    comps = dict(card.components)
    t = comps["transformer"]
    comps["transformer"] = t.model_copy(update={"config": dict(dit_cfg)})
    return card.model_copy(update={"components": comps})


class Logger:
    def __init__(self, path: Path):
        self.f = open(path, "a")
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


def trained_card(stats: dict, guidance: float, weights_dir: Path, dit_cfg: dict | None = None):
    """The wan-tiny cards as this run produced them (its weights, DiT config, latent statistics, guidance)."""
    def patch(card):
        vae = card.components["vae"]
        comps = dict(card.components)
        comps["vae"] = vae.model_copy(update={"config": {**vae.config, **stats}})
        if dit_cfg is not None:
            comps["transformer"] = comps["transformer"].model_copy(update={"config": dict(dit_cfg)})
        return card.model_copy(update={
            "components": comps, "limits": card.limits.model_copy(update={"default_guidance": guidance}),
            "checkpoint": card.checkpoint.model_copy(update={"root": str(weights_dir.resolve())})})
    return patch(registry.wan_tiny()), patch(registry.wan_tiny_4step())


def probe(card, prompts, seeds, device, log, steps, guidance=None, size=128, frames=33):
    """Adherence of a card on prompts x seeds, through a rollout with decode and the scorer."""
    scorer = AdherenceScorer()
    with Engine(card, device=device, max_batch=64) as engine:
        engine.scheduler.max_running = 256
        ps = [p for p in prompts for _ in seeds]
        ss = [s for _ in prompts for s in seeds]
        kw = dict(num_inference_steps=steps, num_frames=frames, height=size, width=size)
        if guidance is not None:
            kw["guidance_scale"] = guidance
        recs = Rollout(engine, capture="norms", wave=len(ps)).run(ps, ss, decode=True, scorer=scorer.score, **kw)
        rows = engine.denoiser.counters["rows"]
    res = {"adherence": sum(r.scores["adherent"] for r in recs) / len(recs),
           "color": sum(r.scores["color_ok"] for r in recs) / len(recs),
           "direction": sum(r.scores["direction_ok"] for r in recs) / len(recs),
           "clips": len(recs), "dit_rows_per_clip": rows / len(recs)}
    log(f"probe {card.model_id} steps={steps} guidance={guidance}: {res}")
    return res


def main(argv=None) -> int:
    a = parse(argv)
    out, wdir = Path(a.out), Path(a.weights_dir)
    out.mkdir(parents=True, exist_ok=True)
    log = Logger(out / "log.txt")
    dev = a.device
    if dev.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    record: dict = {"command": " ".join(["python", "bench/train_tiny.py", *(argv or sys.argv[1:])]),
                    "args": vars(a), "device": torch.cuda.get_device_name() if dev.startswith("cuda") else platform.processor() or "cpu",
                    "torch": torch.__version__, "stages": {}}
    t_start = time.perf_counter()

    def save_record() -> None:  # after every stage, so a run stopped early still leaves its log
        record["total_seconds"] = round(time.perf_counter() - t_start, 1)
        (out / "train_log.json").write_text(json.dumps(record, indent=1, default=str))

    stages = set(a.stages.split(","))
    init = Path(a.init_from) if a.init_from else None
    prev = json.loads((init / "train_log.json").read_text()) if init else {}
    dit_cfg = dit_overrides(a, prev)
    seeded = with_dit(registry.wan_tiny_seeded(), dit_cfg)
    record["card_update"] = {"TINY_DIT": dit_cfg}
    record["chunks"] = prev.get("chunks", []) + [{"command": record["command"], "stages": a.stages}]
    if init:
        record["init_from"] = {"dir": str(init), "command": prev.get("command"), "stages": {
            k: {f: v.get(f) for f in ("steps", "seconds", "samples", "pairs")} for k, v in prev.get("stages", {}).items()}}

    def take(component: str) -> None:  # a skipped stage's weights, from the previous run
        if component == "vae" and (init is None or not (init / FILES["vae"]).exists()):
            return  # the package's shipped VAE (unchanged)
        if init is None and component == "student":
            log("no 4-step student yet: a later chunk with --stages ...,distill makes it")
            return
        if init is None:
            raise SystemExit(f"--stages without the stage that makes {component} needs --init-from")
        if component == "student" and not (init / FILES[component]).exists():
            log("no 4-step student in --init-from: run --stages distill on this run's --out to make it")
            return
        dst = wdir / FILES[component]
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (init / FILES[component]).resolve() != dst.resolve():
            shutil.copyfile(init / FILES[component], dst)

    vae = build_vae(registry.TINY_VAE)
    if "vae" not in stages:
        take("vae")
        if init is None or not (init / FILES["vae"]).exists():  # the shipped VAE and its statistics
            stats = prev.get("card_update", {}).get("TINY_VAE_STATS") or dict(registry.TINY_VAE_STATS)
            vae_file = WEIGHTS_DIR / FILES["vae"]
        else:
            stats = prev["card_update"]["TINY_VAE_STATS"]
            vae_file = wdir / FILES["vae"]
        vae.register_to_config(**stats)
        load_shipped(vae, vae_file)
        if vae_file.resolve() != (wdir / FILES["vae"]).resolve():  # the served cards read it from wdir
            (wdir / FILES["vae"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vae_file, wdir / FILES["vae"])
        vae.to(dev).eval().requires_grad_(False)
        record["card_update"]["TINY_VAE_STATS"] = stats
    else:
        stats = train_vae_stage(a, vae, wdir, record, dev, log)
    save_record()
    if init is None and not stages - {"vae"}:  # the VAE alone: later runs continue with --init-from
        copy_weights(wdir, out)
        log(f"vae done in {record['total_seconds']}s")
        return 0

    # -- stage 2: DiT + text encoder (flow matching) ----------------------------------------
    if "dit" in stages:
        later = (a.rollout_seconds + a.distill_seconds if "distill" in stages else 0) + a.reserve_seconds
        if a.chunk_seconds is not None:
            left = a.chunk_seconds - (time.perf_counter() - t_start) - later
            if left < a.dit_seconds:
                log(f"dit budget cut to {left:.0f}s to fit --chunk-seconds {a.chunk_seconds:.0f}")
                a.dit_seconds = max(5.0, left)
        train_dit_stage(a, vae, seeded, wdir, init, record, dev, log)
    else:
        take("transformer")
        take("text_encoder")
    save_record()

    # -- stage 3: guidance probe on the shipped teacher -------------------------------------
    prompts = eval_prompts()[: a.probe_prompts]
    if "probe" in stages:
        gvals = [float(g) for g in a.probe_guidance.split(",")]
        teacher_card, _ = trained_card(stats, gvals[0], wdir, dit_cfg)
        probes = {g: probe(teacher_card, prompts, [101], dev, log, a.teacher_steps, g, a.size, a.frames) for g in gvals}
        # ties go to the guidance nearest 3 (a usual flow-model default), then the lower one
        best = max(gvals, key=lambda g: (probes[g]["adherence"], -abs(g - 3.0), -g))
        record["stages"]["guidance_probe"] = {"steps": a.teacher_steps, "picked": best,
                                              "results": {str(g): r for g, r in probes.items()}}
        log(f"guidance picked: {best}")
    else:
        best = a.guidance if a.guidance is not None else prev.get("card_update", {}).get(
            "TINY_GUIDANCE", registry.TINY_GUIDANCE)
    teacher_card, student_card = trained_card(stats, best, wdir, dit_cfg)
    record["card_update"]["TINY_GUIDANCE"] = best
    save_record()

    # -- stage 4: teacher rollouts (the serving loop + capture) and the 4-step student -------
    if "distill" in stages:
        distill_stage(a, teacher_card, best, wdir, record, dev, log)
    else:
        take("student")
    save_record()
    if a.final_probe:
        record["stages"]["final_probe"] = {
            "wan-tiny@50": probe(teacher_card, prompts, [202], dev, log, 50, None, a.size, a.frames),
            "wan-tiny-4step@4": probe(student_card, prompts, [202], dev, log, 4, None, a.size, a.frames),
        }
    save_record()
    copy_weights(wdir, out)
    try:
        plot_losses(record, out / "train_loss.png", log)
    except Exception as e:  # noqa: BLE001  (a plot must never cost the run its weights)
        log(f"no plot: {type(e).__name__}: {e}")
    log(f"done in {record['total_seconds']}s")
    return 0


def copy_weights(wdir: Path, out: Path) -> None:
    """The run's weight files (those that exist) into ``out``, in the shipped layout; a VAE that is
    the package's own file is left out (the output directory stays a few files)."""
    for rel in FILES.values():
        src, dst = wdir / rel, out / rel
        pkg = WEIGHTS_DIR / rel
        if rel == FILES["vae"] and src.exists() and pkg.exists() and src.read_bytes() == pkg.read_bytes():
            continue
        if src.exists() and src.resolve() != dst.resolve():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)


def train_vae_stage(a, vae, wdir: Path, record: dict, dev: str, log) -> dict:
    vcfg = VAETrainConfig(steps=10**9, batch_size=a.vae_batch, frames=a.vae_frames, height=a.size, width=a.size,
                          time_budget_s=a.vae_seconds)
    vres = train_vae(vae, vcfg, dev, log)
    mean, std = latent_stats(vae, ShapesDataset(seed=7, frames=a.frames, height=a.size, width=a.size),
                             clips=64 if not a.smoke else 4, batch_size=8 if not a.smoke else 2, device=dev)
    stats = {"latents_mean": mean, "latents_std": std}
    vae.register_to_config(**stats)
    save_shipped(vae, wdir / FILES["vae"])
    check = roundtrip_check(vae, ShapesDataset(seed=7, frames=a.frames, height=a.size, width=a.size),
                            clips=4 if a.smoke else 16, device=dev)
    record["card_update"] = {"TINY_VAE_STATS": stats}
    record["stages"]["vae"] = {"steps": vres.steps, "seconds": round(vres.seconds, 1), "losses": vres.losses,
                               "config": vcfg.__dict__, "latent_stats": stats, "roundtrip": check}
    log(f"vae: {vres.steps} steps in {vres.seconds:.0f}s; latent std {min(std):.3f}..{max(std):.3f}; "
        f"round trip {check}")
    return stats


def train_dit_stage(a, vae, seeded, wdir: Path, init: Path | None, record: dict, dev: str, log) -> None:
    dit, _ = load_dit(seeded, dev)
    text = TextEncoder(seeded, dev)
    continued = init is not None and (init / FILES["transformer"]).exists()
    state_file = init / "train_state.pt" if init is not None else None
    resumed = bool(a.resume) and state_file is not None and state_file.exists()
    if continued:  # continue from the previous run's EMA (and, resuming, its raw weights below)
        load_shipped(dit, init / FILES["transformer"])
        load_shipped(text.model, init / FILES["text_encoder"])
    bf16 = a.bf16 if a.bf16 is not None else dev.startswith("cuda")
    dcfg = DiTTrainConfig(steps=10**9, batch_size=a.dit_batch, time_budget_s=a.dit_seconds, lr=a.dit_lr,
                          text_lr=a.dit_lr / 2, warmup=a.dit_warmup, ema_decay=a.ema_decay, reuse=a.dit_reuse,
                          groups=a.groups, text_aux=a.text_aux, autocast="bf16" if bf16 else None)
    trainer = JointTrainer(dit, text, dcfg, dev)  # the EMAs start from the loaded (EMA) weights
    if dcfg.autocast:  # one forward/backward under autocast first: on any error, train in fp32
        try:
            x = torch.randn(4, 16, (a.frames - 1) // 4 + 1, a.size // 8, a.size // 8, device=dev)
            trainer.loss(x, eval_prompts()[:4]).backward()
            trainer.opt.zero_grad(set_to_none=True)
        except Exception as e:  # noqa: BLE001
            log(f"bf16 autocast failed ({type(e).__name__}: {e}); training in fp32")
            dcfg.autocast = None
            trainer.opt.zero_grad(set_to_none=True)
            bf16 = False
    start_batch, prev_steps = 0, 0
    if resumed:
        st = torch.load(state_file, map_location="cpu", weights_only=False)
        trainer.load_state(st)
        start_batch, prev_steps = int(st["batch_index"]), int(st["steps"])
        log(f"resumed from {state_file}: {prev_steps} steps, next batch {start_batch}")
    seed = a.data_seed if a.data_seed is not None else (11 + (init is not None and not resumed))
    data = ShapesDataset(seed=seed, frames=a.frames, height=a.size, width=a.size)
    codec = LatentCodec(vae, dev)
    ema_text = TextEncoder(seeded, dev)
    ema_text.model = trainer.ema_text.shadow
    seeds = [int(x) for x in a.dir_probe_seeds.split(",")]
    prompts = eval_prompts()

    held_out = ShapesDataset(seed=99, frames=a.frames, height=a.size, width=a.size)

    def dir_probe() -> dict:  # the EMA: what ships
        ac = torch.bfloat16 if bf16 else None
        res = direction_probe(trainer.ema_dit.shadow, ema_text, codec, prompts, seeds, a.frames, a.size,
                              steps=a.dir_probe_steps, guidance=a.dir_probe_guidance, device=dev, autocast=ac)
        res.update(caption_probe(trainer.ema_dit.shadow, ema_text, codec, held_out, clips=4 if a.smoke else 32,
                                 device=dev, autocast=ac))
        return res

    hits = []

    def stop(res: dict) -> bool:
        hits.append(a.stop_direction is not None and res["direction"] >= a.stop_direction)
        return len(hits) >= 2 and hits[-1] and hits[-2]

    dlog = train_dit(trainer, codec, data, log, probe=dir_probe, probe_every_s=a.dir_probe_every or None,
                     stop=stop, start_batch=start_batch)
    save_shipped(trainer.ema_dit.shadow, wdir / FILES["transformer"], torch.float16)
    save_shipped(trainer.ema_text.shadow, wdir / FILES["text_encoder"])
    if not a.no_state:
        st = trainer.state()
        st.update(batch_index=dlog.batch_index, steps=prev_steps + dlog.steps, dit_config=dict(seeded.components["transformer"].config))
        Path(a.out).mkdir(parents=True, exist_ok=True)
        torch.save(st, Path(a.out) / "train_state.pt")
    prev_probes = []
    if init is not None:
        prev_log = json.loads((init / "train_log.json").read_text())
        prev_probes = prev_log.get("direction_probes", [])
    total = prev_steps
    record["direction_probes"] = prev_probes + [{**p, "step": p["step"] + total} for p in dlog.probes]
    record["stages"]["dit"] = {"steps": dlog.steps, "seconds": round(dlog.seconds, 1), "samples": dlog.samples,
                               "losses": dlog.losses, "probes": dlog.probes, "config": dcfg.__dict__,
                               "data_seed": seed, "start_batch": start_batch, "steps_before": prev_steps,
                               "continued": continued, "resumed": resumed}
    log(f"dit: {dlog.steps} steps, {dlog.samples} clips in {dlog.seconds:.0f}s")


def distill_stage(a, teacher_card, guidance: float, wdir: Path, record: dict, dev: str, log) -> None:
    t0 = time.perf_counter()
    data = ShapesDataset(seed=23)
    records = []
    with Engine(teacher_card, device=dev, max_batch=a.rollout_wave) as engine:
        engine.scheduler.max_running = a.rollout_wave
        rollout = Rollout(engine, capture="endpoints", wave=a.rollout_wave)
        i = 0
        while len(records) < a.max_pairs and time.perf_counter() - t0 < a.rollout_seconds:
            caps = [data.scene(i + k).caption for k in range(a.rollout_wave)]
            seeds = [1_000_000 + i + k for k in range(a.rollout_wave)]
            records += rollout.run(caps, seeds, num_inference_steps=a.teacher_steps, guidance_scale=guidance,
                                   num_frames=a.frames, height=a.size, width=a.size)
            i += a.rollout_wave
        pairs = PairSet(records, engine.encoder.encoder, dev)
    record["stages"]["rollouts"] = {"pairs": len(pairs), "seconds": round(time.perf_counter() - t0, 1),
                                    "teacher_steps": a.teacher_steps, "guidance": guidance,
                                    "example": records[0].to_dict()}
    log(f"rollouts: {len(pairs)} teacher pairs in {time.perf_counter() - t0:.0f}s")
    student, _ = load_dit(teacher_card, dev)
    scfg = DistillConfig(steps=10**9, batch_size=a.distill_batch, time_budget_s=a.distill_seconds)
    ema_student, slog = distill_student(student, pairs, scfg, dev, log)
    save_shipped(ema_student, wdir / FILES["student"], torch.float16)
    record["stages"]["distill"] = {"steps": slog.steps, "seconds": round(slog.seconds, 1), "pairs": slog.pairs,
                                   "losses": slog.losses, "config": scfg.__dict__}
    log(f"distill: {slog.steps} steps in {slog.seconds:.0f}s")


def plot_losses(record: dict, path: Path, log=print) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        plot_losses_pil(record, path)
        log(f"wrote {path.name} (PIL)")
        return
    stages = [("vae", "VAE (rec + KL)"), ("dit", "DiT + text encoder (flow matching)"), ("distill", "4-step student (reflow)")]
    fig, axes = plt.subplots(1, 4, figsize=(18, 3.6))
    probes = record.get("direction_probes", [])
    ax = axes[3]
    if probes:
        for key, style in (("direction", "-o"), ("adherence", "-s"), ("median_travel", "--")):
            ax.plot([p["step"] for p in probes], [p.get(key, 0) for p in probes], style, label=key)
        ax.legend(fontsize=8)
    ax.axhline(0.25, color="gray", lw=0.8)
    ax.set_ylim(0, 1)
    ax.set_title("direction probe (EMA, Euler + CFG)")
    ax.set_xlabel("DiT step (all chunks)")
    ax.grid(alpha=0.3)
    for ax, (key, title) in zip(axes[:3], stages):
        pts = record["stages"].get(key, {}).get("losses", [])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts])
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("training loss")
    fig.suptitle(f"tiny recipe on {record['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path.name}")


def plot_losses_pil(record: dict, path: Path) -> None:
    """The same panels with PIL only (log-scale loss against step; the direction probe, linear)."""
    import math

    from PIL import Image, ImageDraw
    stages = [("vae", "VAE"), ("dit", "DiT + text encoder"), ("distill", "4-step student")]
    w, h, pad = 360, 260, 40
    img = Image.new("RGB", (w * 4, h + 30), "white")
    d = ImageDraw.Draw(img)
    d.text((10, 5), f"tiny recipe training loss (log scale) on {record['device']}", fill="black")

    def panel(i, title, pts, log_scale, fixed=None, color=(30, 90, 200)):
        x0, y0 = i * w + pad, 30
        d.rectangle([x0, y0, x0 + w - 2 * pad, y0 + h - pad], outline="black")
        d.text((x0 + 4, y0 + 4), title, fill="black")
        pts = [(a, math.log10(b) if log_scale else b) for a, b in pts if (b > 0 or not log_scale)]
        if len(pts) < 2:
            return
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        lo, hi = fixed or (min(ys), max(ys) + 1e-9)

        def xy(px, py):
            return (x0 + (px - xs[0]) / max(1, xs[-1] - xs[0]) * (w - 2 * pad),
                    y0 + h - pad - (py - lo) / (hi - lo) * (h - pad - 20))
        d.line([xy(a, b) for a, b in zip(xs, ys)], fill=color, width=2)
        d.text((x0, y0 + h - pad + 2), f"step {xs[0]}..{xs[-1]}", fill="black")
        lab = f"{10**hi:.3g} .. {10**lo:.3g}" if log_scale else f"{lo:.2g} .. {hi:.2g}"
        d.text((x0 + w - 2 * pad - 120, y0 + 4), lab, fill="black")

    for i, (key, title) in enumerate(stages):
        panel(i, title, [(p[0], p[1]) for p in record["stages"].get(key, {}).get("losses", [])], True)
    probes = record.get("direction_probes", [])
    panel(3, "direction probe (blue) / adherence (red)", [(p["step"], p["direction"]) for p in probes], False, (0.0, 1.0))
    panel(3, "", [(p["step"], p["adherence"]) for p in probes], False, (0.0, 1.0), color=(200, 40, 40))
    img.save(path)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
