"""bench/denoiser.py --models for the newer families runs end to end at tiny size on the CPU and
writes the summary the GPU run fills (the real-size figures come from the H200 run)."""
import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_tiny_models_bench_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import denoiser
    out = tmp_path / "m.json"
    assert denoiser.main(["--models", "wan2.2-a14b,wan2.2-ti2v-5b", "--tiny", "--device", "cpu", "--no-graphs",
                          "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["summary"]) == {"ours_faster_480p", "ours_faster_720p", "moe_switch_recompiles",
                                      "moe_switch_weight_reloads"}
    rows = result["rows"]
    assert [(r["family"], r["expert"], r["shape"]) for r in rows] == [
        ("wan2.2-ti2v-5b", "transformer", "720p"), ("wan2.2-a14b", "transformer", "480p"),
        ("wan2.2-a14b", "transformer_2", "480p"), ("wan2.2-a14b", "transformer", "720p")]
    assert set(result["summary"]["ours_faster_720p"]) == {"wan2.2-ti2v-5b", "wan2.2-a14b"}
    assert all("error" not in r and r["rel_fro"] < 1e-4 for r in rows)
    sw = result["switch"]["wan2.2-a14b"]
    assert sw["plan"].count("transformer_2") >= 1 and sw["plan"][0] == "transformer"
    assert result["summary"]["moe_switch_recompiles"] == sw["recompiles"] == 0
    assert result["summary"]["moe_switch_weight_reloads"] == sw["weight_reloads"] == 0
    assert len(sw["switch_step_ms"]) == sw["requests"]
    assert sys.modules["denoiser_models"].FAMILIES["wan2.2-a14b"] == "wan2.2-t2v-a14b"


def test_tiny_i2v_bench_on_cpu(tmp_path, monkeypatch):
    """The Wan2.1 I2V entry: ours (image cross-attention, 36 input channels) against diffusers at
    both shapes, in one run."""
    monkeypatch.syspath_prepend(str(BENCH))
    import denoiser
    out = tmp_path / "i2v.json"
    assert denoiser.main(["--models", "wan2.1-i2v-14b", "--tiny", "--device", "cpu", "--no-graphs",
                          "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["family"], r["shape"]) for r in rows] == [("wan2.1-i2v-14b", "480p"), ("wan2.1-i2v-14b", "720p")]
    assert all("error" not in r and r["rel_fro"] < 1e-4 for r in rows), rows
    assert set(result["summary"]["ours_faster_480p"]) == set(result["summary"]["ours_faster_720p"]) == {"wan2.1-i2v-14b"}
    assert result["switch"] == {}  # one DiT: no expert switch


def test_tiny_hunyuan15_bench_on_cpu(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import denoiser
    out = tmp_path / "h.json"
    assert denoiser.main(["--models", "hunyuanvideo-1.5", "--tiny", "--device", "cpu", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [(r["family"], r["shape"]) for r in rows] == [("hunyuanvideo-1.5", "480p"), ("hunyuanvideo-1.5", "720p")]
    assert all("error" not in r and r["rel_fro"] < 1e-5 and r["finite"] for r in rows)
    assert set(result["summary"]["ours_faster_480p"]) == set(result["summary"]["ours_faster_720p"]) == {
        "hunyuanvideo-1.5"}
