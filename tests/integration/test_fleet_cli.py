"""``fastvideo3 serve`` + ``fastvideo3 client generate`` end to end, as a user runs them
(subprocesses), producing a playable mp4; Ctrl-C stops every process of the fleet."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from fastvideo3.media import probe_video

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    out = set()
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.add(int(d.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(300)
def test_serve_then_client_generate_writes_a_playable_mp4(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    serve = subprocess.Popen([sys.executable, "-m", "fastvideo3.cli", "serve", "--no-reward", "--log-dir",
                              str(tmp_path / "logs")], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in serve.stdout], daemon=True).start()
    target, seen = None, []
    try:
        while True:
            line = lines.get(timeout=240)  # each line arrives as the fleet comes up
            seen.append(line)
            if line.strip().startswith("scheduler"):
                target = line.split()[1]
            if "Ctrl-C stops the fleet" in line:
                break
        assert target, seen
        children = _children(serve.pid)
        assert len(children) == 4, children  # encoder, denoiser, decoder, scheduler
        out = tmp_path / "out" / "clip.mp4"
        gen = subprocess.run([sys.executable, "-m", "fastvideo3.cli", "client", "generate", "--target", target,
                              "a red circle moving left", "-o", str(out), "--frames", "9", "--size", "64x64",
                              "--steps", "2", "--seed", "3"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=120)
        assert gen.returncode == 0, gen.stdout + gen.stderr
        assert "wrote" in gen.stdout
        info = probe_video(out)
        assert info["codec"] == "h264" and info["frames"] == 9 and (info["width"], info["height"]) == (64, 64)
        sidecar = json.loads(out.with_name(out.name + ".json").read_text())
        assert sidecar["request"]["seed"] == 3 and sidecar["card"] == "wan-tiny"
    finally:
        serve.send_signal(signal.SIGINT)  # Ctrl-C
        rc = serve.wait(timeout=90)
    assert rc == 0, "".join(seen) + "".join(iter(lambda: lines.get(timeout=1) if not lines.empty() else "", ""))
    assert not [p for p in children if _alive(p)], "orphan fleet processes"
