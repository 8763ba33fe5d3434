"""bench/e2e_generation.py --decode-only runs on the CPU at tiny size and writes the summary the
H200 run fills; the summary is rebuilt from a run's variants alone (a run cut short keeps one)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def test_decode_only_writes_its_summary(tiny_wan_dir, tmp_path):
    out = tmp_path / "decode.json"
    p = subprocess.run([sys.executable, str(BENCH / "e2e_generation.py"), "--model", str(tiny_wan_dir),
                        "--device", "cpu", "--decode-only", "--frames", "5", "--height", "32", "--width", "32",
                        "--decode-repeats", "1", "--time-chunks", "1,2", "--decode-batch", "2", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads(out.read_text())
    s = r["summary"]
    assert s["vae_decode_s"] > 0 and math.isfinite(s["diffusers_vae_decode_s"])
    assert s["within_tolerance"] is True and s["frames_max_abs_vs_diffusers"] <= s["tolerance_frames_abs"]
    assert s["goal_met"] == (s["vae_decode_s"] <= s["goal_s"])
    assert "ours_default" in s["variants_measured"] and s["batched_s_per_latent"] > 0
    fused, unfused = r["decode"]["ours_fused"], r["decode"]["ours_unfused"]
    assert fused["fused"] is True and unfused["fused"] is False and r["decode"]["ours_default"]["fused"] is False
    assert s["fused_vae_decode_s"] == fused["s"] and s["unfused_vae_decode_s"] == unfused["s"]
    assert fused["frames_vs_diffusers_fp32"]["max_abs"] <= 1e-5  # fp32 on the CPU: the same computation

    sys.path.insert(0, str(BENCH))
    try:
        from e2e_decode import decode_only_summary
    finally:
        sys.path.remove(str(BENCH))
    cut = {k: r[k] for k in ("decode", "decode_workload")}
    cut["decode"] = {k: v for k, v in r["decode"].items() if k in ("diffusers_fp32", "ours_default")}
    short = decode_only_summary(cut)
    assert short["vae_decode_s"] == s["vae_decode_s"] and short["diffusers_bf16_vae_decode_s"] is None
    assert short["variants_measured"] == ["diffusers_fp32", "ours_default"]
