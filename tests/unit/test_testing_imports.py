"""Test-only builders stay out of serving code's import path: nothing in ``fastvideo3`` (outside
``fastvideo3/testing``), ``services`` or ``fleet`` imports ``fastvideo3.testing``, and starting the
engine or a service's modules does not load it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            out += [(a.name, n.lineno) for a in n.names]
        elif isinstance(n, ast.ImportFrom) and n.module:
            out += [(n.module, n.lineno)] + [(f"{n.module}.{a.name}", n.lineno) for a in n.names]
    return out


def test_no_serving_module_imports_the_testing_package():
    offenders = []
    for top in ("fastvideo3", "services", "fleet"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parts[:2] == ("fastvideo3", "testing"):
                continue
            offenders += [f"{rel}:{line} imports {mod}" for mod, line in _imports(path)
                          if mod == "fastvideo3.testing" or mod.startswith("fastvideo3.testing.")]
    assert not offenders, offenders


def test_serving_entry_points_do_not_load_it():
    code = ("import sys, fastvideo3, fastvideo3.cli, fastvideo3.engine, services.common.pool, "
            "services.scheduler.service, services.scheduler.app\n"
            "print(sorted(m for m in sys.modules if m.startswith('fastvideo3.testing')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
