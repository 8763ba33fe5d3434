"""Prompt adherence of the tiny cards, measured through the serving loop.

    python bench/quality.py                        # CPU; writes bench/results/quality_cpu.json
    python bench/quality.py --device cuda --out bench/results/quality_cuda.json

Each card generates the fixed prompt set (:func:`fastvideo3.training.data.eval_prompts`: every
color x direction pair, 20 prompts) for each seed, through :class:`~fastvideo3.training.rollout.Rollout`
(the serving loops with behavior capture, decode included), and
:class:`~fastvideo3.models.reward.adherence.AdherenceScorer` reads the shape's color and motion
direction back from the decoded frames. A clip adheres when both match the prompt. DiT
evaluations per clip are counted by the denoiser itself (one row = one DiT evaluation of one
sample; classifier-free guidance costs two).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from fastvideo3.card import get_card  # noqa: E402
from fastvideo3.models.reward.adherence import AdherenceScorer  # noqa: E402
from fastvideo3.engine import Engine  # noqa: E402
from fastvideo3.training.data import eval_prompts  # noqa: E402
from fastvideo3.training.rollout import Rollout  # noqa: E402

#: (card, steps): the trained default at the teacher's 50 steps, its 4-step student, and the
#: same architecture with untrained seeded weights served like the trained default
RUNS = (("wan-tiny", 50), ("wan-tiny-4step", 4), ("wan-tiny-seeded", 50))


def run_card(card_name: str, run: Path):
    """A tiny card as a training run's output directory made it: the run's weight files (the
    package's VAE when the run did not retrain it) and its ``train_log.json`` card update (DiT
    config, latent statistics, guidance) — what ``bench/ship_tiny.py`` would put in the package."""
    card = get_card(card_name)
    if card_name not in ("wan-tiny", "wan-tiny-4step"):
        return card
    import tempfile

    from fastvideo3.models.wan.components import WEIGHTS_DIR
    upd = json.loads((run / "train_log.json").read_text())["card_update"]
    root = Path(tempfile.mkdtemp(prefix="tiny_run_"))
    for rel in ("wan-tiny/text_encoder.safetensors", "wan-tiny/transformer.safetensors", "wan-tiny/vae.safetensors",
                "wan-tiny-4step/transformer.safetensors"):
        src = run / rel if (run / rel).exists() else WEIGHTS_DIR / rel
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).symlink_to(src.resolve())
    comps = dict(card.components)
    if "TINY_DIT" in upd:
        comps["transformer"] = comps["transformer"].model_copy(update={"config": dict(upd["TINY_DIT"])})
    if "TINY_VAE_STATS" in upd:
        comps["vae"] = comps["vae"].model_copy(update={"config": {**comps["vae"].config, **upd["TINY_VAE_STATS"]}})
    update = {"components": comps, "checkpoint": card.checkpoint.model_copy(update={"root": str(root), "digests": {}})}
    if card_name == "wan-tiny" and "TINY_GUIDANCE" in upd:
        update["limits"] = card.limits.model_copy(update={"default_guidance": upd["TINY_GUIDANCE"]})
    return card.model_copy(update=update)


def evaluate(card_name: str, steps: int, seeds: list[int], device: str | None, prompts: list[str],
             run: Path | None = None) -> dict:
    card = run_card(card_name, run) if run is not None else get_card(card_name)
    scorer = AdherenceScorer()
    t0 = time.perf_counter()
    with Engine(card, device=device) as engine:
        ps = [p for p in prompts for _ in seeds]
        ss = [s for _ in prompts for s in seeds]
        recs = Rollout(engine, capture="norms").run(ps, ss, decode=True, scorer=scorer.score,
                                                    num_inference_steps=steps)
        counters = dict(engine.denoiser.counters)
    seconds = time.perf_counter() - t0
    n = len(recs)

    def rate(key: str) -> float:
        return round(100.0 * sum(r.scores[key] for r in recs) / n, 1)

    r0 = recs[0]
    return {
        "card": card_name, "recipe": card.recipe.method, "steps": steps, "sampler": r0.sampler,
        "guidance": r0.guidance, "cfg_policy": r0.cfg_policy, "clips": n,
        "adherence_pct": rate("adherent"), "color_pct": rate("color_ok"), "direction_pct": rate("direction_ok"),
        "shape_pct": rate("shape_ok"),
        "median_travel": round(statistics.median(float(r.scores.get("travel", 0.0)) for r in recs), 4),
        "dit_evals_per_clip": counters["rows"] / n, "dit_forward_calls": counters["forwards"],
        "seconds": round(seconds, 1), "weights": r0.weights_version,
        "clips_detail": [{"prompt": r.prompt, "seed": r.seed, "color": r.scores["color"],
                          "direction": r.scores["direction"], "shape": r.scores["shape"],
                          "travel": round(float(r.scores.get("travel", 0.0)), 4),
                          "adherent": r.scores["adherent"]} for r in recs],
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default=None, help="cpu or cuda (auto)")
    p.add_argument("--seeds", default="0,1", help="comma-separated seeds per prompt")
    p.add_argument("--cards", default=",".join(f"{c}@{s}" for c, s in RUNS), help="card@steps,...")
    p.add_argument("--out", default=None, help="JSON path (default bench/results/quality_<device>.json)")
    p.add_argument("--run", default=None,
                   help="a bench/train_tiny.py output directory: score its weights and card update "
                        "instead of the package's")
    a = p.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    seeds = [int(s) for s in a.seeds.split(",")]
    prompts = eval_prompts()
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    kind = "cuda" if device.startswith("cuda") else "cpu"
    out = Path(a.out or Path(__file__).parent / "results" / f"quality_{kind}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for item in a.cards.split(","):
        name, steps = item.split("@")
        res = evaluate(name, int(steps), seeds, device, prompts, Path(a.run) if a.run else None)
        results.append(res)
        print(f"{name:16s} steps={steps:>3s} adherence {res['adherence_pct']:5.1f}%  color {res['color_pct']:5.1f}%  "
              f"direction {res['direction_pct']:5.1f}%  shape {res['shape_pct']:5.1f}%  travel {res['median_travel']:.2f}  "
              f"DiT evals/clip {res['dit_evals_per_clip']:.0f}  ({res['seconds']:.0f}s)", flush=True)
        write_report(out, a, argv, device, seeds, results)  # after every card: a cut-off run keeps its cards
    print(f"wrote {out}")
    return 0


def write_report(out: Path, a, argv, device: str, seeds, results) -> None:
    report = {
        "command": "python bench/quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else (platform.processor() or "cpu"),
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "prompt_set": "eval_prompts(): 20 prompts (every color x direction), seeds " + a.seeds,
        "criterion": "color AND direction detected from the decoded frames match the prompt",
        "chance_pct": round(100.0 / (5 * 4), 1),
        "weights": a.run or "the package's (fastvideo3/weights)",
        "summary": summarize(results),
        "results": results,
    }
    out.write_text(json.dumps(report, indent=1))


def summarize(results: list[dict]) -> dict:
    """Per card: adherence, color and direction rates, median travel, DiT evaluations per clip;
    and, where both tiny cards ran, the student's gap to its teacher and how many times fewer
    evaluations it needs."""
    cards = {r["card"]: {k: r[k] for k in ("steps", "adherence_pct", "color_pct", "direction_pct", "median_travel",
                                         "dit_evals_per_clip", "clips")} for r in results}
    summary: dict = {"cards": cards}
    teacher, student = cards.get("wan-tiny"), cards.get("wan-tiny-4step")
    if teacher and student:
        summary["student_gap_points"] = round(teacher["adherence_pct"] - student["adherence_pct"], 1)
        summary["student_fewer_evals_x"] = round(teacher["dit_evals_per_clip"] / student["dit_evals_per_clip"], 1)
    return summary


if __name__ == "__main__":
    sys.exit(main())
