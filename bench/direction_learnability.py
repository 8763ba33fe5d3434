"""Is the text -> direction link learnable fast? A small CPU experiment of the tiny recipe.

Trains the tiny DiT + text encoder from their seeded start on the shipped patch VAE's latents at
a reduced size (default 64x64, 17 frames, a narrower DiT), one torch thread, for a wall-clock
budget, probing the direction rate of sampled clips (Euler + CFG, decoded, scored) as it goes:

    python bench/direction_learnability.py --seconds 300 --patch 1,2,2 --groups --text-aux 0.1 --out /tmp/A.json

Chance is 0.25. The full recipe (bench/train_tiny.py) uses the same trainer and probe.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from options import add_defaults  # noqa: E402 - the sibling module in bench/

from fastvideo3.models.wan import cards as registry  # noqa: E402
from fastvideo3.models.wan.components import WEIGHTS_DIR, TextEncoder, load_dit, load_shipped  # noqa: E402
from fastvideo3.training.data import ShapesDataset, eval_prompts  # noqa: E402
from fastvideo3.training.probe import caption_probe, direction_probe  # noqa: E402
from fastvideo3.training.trainer import DiTTrainConfig, JointTrainer, train_dit  # noqa: E402
from fastvideo3.training.vae import LatentCodec, build_vae  # noqa: E402


def with_dit(card, overrides: dict):
    comps = dict(card.components)
    t = comps["transformer"]
    comps["transformer"] = t.model_copy(update={"config": {**t.config, **overrides}})
    return card.model_copy(update={"components": comps})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_defaults(p, seconds=300.0, threads=1, size=64, frames=17, patch="1,2,2", heads=4, ffn=256, layers=2,
                 batch=16, lr=1e-3)
    p.add_argument("--groups", action="store_true")
    p.add_argument("--text-aux", type=float, default=0.0)
    p.add_argument("--reuse", type=int, default=2)
    p.add_argument("--probe-every", type=float, default=120)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--sample-probe", action="store_true", help="also sample, decode and score clips at each probe")
    p.add_argument("--shared-noise-off", action="store_true")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    over = {"patch_size": [int(x) for x in a.patch.split(",")], "num_attention_heads": a.heads,
            "ffn_dim": a.ffn, "num_layers": a.layers}
    card = with_dit(registry.wan_tiny_seeded(), over)
    vae = build_vae(registry.TINY_VAE)
    vae.register_to_config(**registry.TINY_VAE_STATS)
    load_shipped(vae, WEIGHTS_DIR / "wan-tiny/vae.safetensors")
    vae.eval().requires_grad_(False)
    codec = LatentCodec(vae)
    dit, _ = load_dit(card)
    text = TextEncoder(card)
    cfg = DiTTrainConfig(steps=10**9, batch_size=a.batch, lr=a.lr, text_lr=a.lr / 2, warmup=50,
                         time_budget_s=a.seconds, groups=a.groups, text_aux=a.text_aux, reuse=a.reuse,
                         ema_decay=0.99, log_every=100)
    tr = JointTrainer(dit, text, cfg)
    data = ShapesDataset(seed=11, frames=a.frames, height=a.size, width=a.size)
    seeds = [int(s) for s in a.seeds.split(",")]

    held_out = ShapesDataset(seed=99, frames=a.frames, height=a.size, width=a.size)

    def probe():  # the raw weights (the EMA lags in a short run); EMA at the end below
        res = caption_probe(tr.dit, tr.text, codec, held_out, clips=32)
        if a.sample_probe:
            res.update(direction_probe(tr.dit, tr.text, codec, eval_prompts(), seeds, a.frames, a.size,
                                       steps=10, guidance=3.0))
        return res

    t0 = time.perf_counter()
    dlog = train_dit(tr, codec, data, print, probe=probe, probe_every_s=a.probe_every)
    ema_text = TextEncoder(card)
    ema_text.model = tr.ema_text.shadow
    ema = direction_probe(tr.ema_dit.shadow, ema_text, codec, eval_prompts(), seeds, a.frames, a.size,
                          steps=10, guidance=3.0)
    ema.update(caption_probe(tr.ema_dit.shadow, ema_text, codec, held_out, clips=32))
    print("ema probe", ema)
    rec = {"args": vars(a), "dit": over, "params": sum(p.numel() for p in dit.parameters()),
           "steps": dlog.steps, "samples": dlog.samples, "seconds": round(time.perf_counter() - t0, 1),
           "losses": dlog.losses, "probes": dlog.probes, "ema_probe": ema}
    Path(a.out).write_text(json.dumps(rec, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
