"""The pool's batch profiler (FASTVIDEO3_PROFILE_BATCHES): its window, its files, its refusals."""
import json

import pytest
import torch

from fastvideo3.errors import InvalidRequest
from fastvideo3.runtime.pool.profiling import ENV, BatchProfiler, window_from_env


def test_window_parsed_and_bad_values_refused_by_name():
    assert window_from_env({}) is None
    w = window_from_env({ENV: "/tmp/p,3,2"})
    assert (w.directory, w.start, w.count) == ("/tmp/p", 3, 2)
    for bad in ("/tmp/p", "/tmp/p,x,2", "/tmp/p,1,0", ",1,2", "/tmp/p,-1,2", "/tmp/p,0,100000"):
        with pytest.raises(InvalidRequest) as e:
            window_from_env({ENV: bad})
        assert ENV in str(e.value)


def test_only_the_window_is_profiled_and_written(tmp_path):
    prof = BatchProfiler(window_from_env({ENV: f"{tmp_path},2,3"}), "denoiser")
    ran = []
    for i in range(8):
        with prof.batch():
            a = torch.randn(64, 64)
            (a @ a).sum()
            ran.append(i)
        # written when the window's last batch ends, not before
        assert bool(list(tmp_path.glob("*.json"))) == (i >= 4)
    assert ran == list(range(8)) and prof.done
    [summary] = [json.loads(p.read_text()) for p in tmp_path.glob("denoiser-*.json")]
    assert summary["batches"] == 3 and summary["first_batch"] == 2
    assert 0 < summary["busy_s"] <= summary["wall_s"]
    table = next(tmp_path.glob("denoiser-*.txt")).read_text()
    assert "aten::mm" in table  # the window's operators are in the table


def test_executor_profiles_its_batches(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from fastvideo3.runtime.pool.executors import _Base

    class Echo(_Base):
        role = "encoder"

        def _execute(self, batch):
            return []

    card = SimpleNamespace(precision=SimpleNamespace(default_cpu="fp32", default_cuda="bf16"))
    assert Echo(card, None, device="cpu")._profiler is None  # no variable: no profiler
    monkeypatch.setenv(ENV, f"{tmp_path},0,1")
    ex = Echo(card, None, device="cpu")
    ex.execute([])
    assert ex.counters["batches"] == 1
    assert list(tmp_path.glob("encoder-*.json")) and list(tmp_path.glob("encoder-*.txt"))
