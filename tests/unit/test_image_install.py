"""The image's install lines (Dockerfile): every role names extras pyproject.toml defines, the
pools get the transport extra, the torch build is checked and labelled, and pip accepts each
line.

Images cannot be built here (no container engine), so pip runs each role's line with
`--dry-run` in a fresh venv. Two levels, for time: every distinct line is resolved against the
already-installed environment (the venv sees this one's site-packages through a .pth file, so
only names are resolved: seconds, and pip warns "does not provide the extra" for a wrong name,
which fails the test); the heaviest line (the pools') is also resolved from scratch with
`--ignore-installed` and torch pinned to the local build's version (~30-45 s here), so a dependency that no
longer resolves fails CI too.
"""
from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (REPO_ROOT / "Dockerfile").read_text()
ROLES = ("scheduler", "encoder", "denoiser", "decoder", "reward", "dynamo", "gateway")
POOLS = ("encoder", "denoiser", "decoder", "reward")


def role_extras() -> dict[str, list[str]]:
    """ROLE -> extras of its default install line, from the Dockerfile's case statement."""
    out: dict[str, list[str]] = {}
    for roles, extras in re.findall(r"^\s+([a-z|]+)\) extras=([A-Za-z0-9_,-]+) ;;", DOCKERFILE, re.M):
        for role in roles.split("|"):
            out[role] = extras.split(",")
    return out


def defined_extras() -> set[str]:
    return set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def test_every_role_installs_defined_extras() -> None:
    extras = role_extras()
    assert set(extras) == set(ROLES), f"roles without an install line: {set(ROLES) - set(extras)}"
    defined = defined_extras()
    for role, names in extras.items():
        unknown = set(names) - defined
        assert not unknown, f"{role}: extras {sorted(unknown)} are not in pyproject.toml ({sorted(defined)})"
    for role in POOLS:  # pools move tensors GPU to GPU: NIXL comes with the transport extra
        assert "transport" in extras[role] and "services" in extras[role], role
    # the line that uses them installs exactly ".[${extras}]" with torch held by a constraint
    assert 'pip install -c /tmp/torch-constraint.txt ".[${extras}]"' in DOCKERFILE


def test_makefile_install_line_names_defined_extras() -> None:
    make = (REPO_ROOT / "Makefile").read_text()
    (names,) = re.findall(r'-e "\.\[([a-z,]+)\]"', make)
    assert set(names.split(",")) <= defined_extras()


def test_image_labels_its_torch_build() -> None:
    final = DOCKERFILE.rsplit("\nFROM ", 1)[1]
    assert 'io.fastvideo3.torch.version="${TORCH_VERSION}"' in final
    assert 'io.fastvideo3.torch.cuda="${TORCH_CUDA}"' in final
    for stage in DOCKERFILE.split("\nFROM ")[1:]:  # both stages declare the args they use
        assert re.search(r"^ARG TORCH_VERSION=2\.13\.0$", stage, re.M)
        assert re.search(r"^ARG TORCH_CUDA=13\.0$", stage, re.M)
    # the build fails unless the installed torch is the labelled one
    check = DOCKERFILE.split('RUN pip install "torch==${TORCH_VERSION}"')[1].split("\nRUN ")[0]
    assert "torch.version.cuda or 'cpu'" in check and "('${TORCH_VERSION}', '${TORCH_CUDA}')" in check


def test_torch_build_check_runs(tmp_path: Path) -> None:
    """The Dockerfile's torch check, run here: passes for this torch, fails for another label."""
    import torch
    line = re.search(r'python -c "(import sys, torch;.*?)"\n', DOCKERFILE.replace("\\\n", ""), re.S).group(1)
    version, cuda = torch.__version__.split("+")[0], torch.version.cuda or "cpu"
    ok = line.replace("${TORCH_VERSION}", version).replace("${TORCH_CUDA}", cuda)
    assert subprocess.run([sys.executable, "-c", ok], capture_output=True, timeout=120).returncode == 0
    bad = line.replace("${TORCH_VERSION}", version).replace("${TORCH_CUDA}", "12.1")
    done = subprocess.run([sys.executable, "-c", bad], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "is not TORCH_VERSION" in done.stderr


def _fresh_venv(path: Path, see_installed: bool) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    if see_installed:
        site = Path(sysconfig.get_paths(vars={"base": str(path), "platbase": str(path)})["purelib"])
        (site / "installed-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return path / "bin" / "python"


def _dry_run(python: Path, extras: str, tmp: Path, *extra_args: str, timeout_s: float) -> dict:
    report = tmp / f"report-{extras.replace(',', '-')}.json"
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--report", str(report),
           *extra_args, f".[{extras}]"]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    assert "does not provide the extra" not in out, out[-3000:]
    return json.loads(report.read_text())


@pytest.mark.timeout(300)
def test_each_role_install_line_resolves(tmp_path: Path) -> None:
    python = _fresh_venv(tmp_path / "venv", see_installed=True)
    # the project's metadata is built with the installed setuptools when there is one (no index
    # needed); otherwise pip fetches the build backend into an isolated environment
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    for extras in sorted({",".join(v) for v in role_extras().values()}):
        report = _dry_run(python, extras, tmp_path, *isolation, timeout_s=240)
        (me,) = [i for i in report["install"] if i["metadata"]["name"] == "fastvideo3"]
        assert sorted(me["requested_extras"]) == sorted(extras.split(","))
        provided = set(me["metadata"].get("provides_extra", []))
        assert set(extras.split(",")) <= provided, (extras, sorted(provided))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pool_install_line_resolves_from_scratch(tmp_path: Path) -> None:
    import torch
    python = _fresh_venv(tmp_path / "venv", see_installed=False)
    constraint = tmp_path / "torch.txt"
    # the image installs torch first, pinned; the public version also admits a local build
    # (2.13.0+cpu) where the index has one, and resolves from PyPI where it does not
    public = torch.__version__.split("+")[0]
    constraint.write_text(f"torch=={public}\n")
    extras = ",".join(role_extras()["denoiser"])
    report = _dry_run(python, extras, tmp_path, "--ignore-installed", "-c", str(constraint), timeout_s=540)
    names = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert names["torch"].split("+")[0] == public, "the install line would replace torch"
    assert "nixl-cu13" in names and "grpcio-health-checking" in names and "fastvideo3" in names
