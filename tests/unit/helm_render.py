"""Render the fastvideo3 Helm chart with a real `helm` binary and index the objects.

`helm` comes from deploy/scripts/install-helm.sh (into .venv/bin) or from PATH. The chart
tests use `render()` to run `helm template` and get the parsed manifests back, and
`render_error()` for the message of a render that must fail.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "fastvideo3"
VALUES_DIR = REPO_ROOT / "deploy" / "helm" / "values"
INSTALL_HINT = "deploy/scripts/install-helm.sh  (installs a pinned helm into .venv/bin)"

RELEASE = "fv"
NAMESPACE = "video"


class HelmError(RuntimeError):
    """`helm` exited non-zero; the message is helm's stderr."""


def find_helm() -> str | None:
    """Path of a helm binary: PATH first, then the project venv."""
    found = shutil.which("helm")
    if found:
        return found
    local = REPO_ROOT / ".venv" / "bin" / "helm"
    return str(local) if local.is_file() and os.access(local, os.X_OK) else None


def require_helm() -> str:
    """:func:`find_helm`, or the test fails (in CI, where helm is installed) or is skipped."""
    path = find_helm()
    if path is None:
        message = f"no helm binary; run {INSTALL_HINT}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def _run(helm: str, args: list[str]) -> str:
    proc = subprocess.run(
        [helm, *args], capture_output=True, text=True, timeout=50, cwd=REPO_ROOT
    )
    if proc.returncode != 0:
        raise HelmError(proc.stderr.strip() or proc.stdout.strip())
    return proc.stdout


def _value_args(values_files: Iterable[str | Path], set_values: Iterable[str]) -> list[str]:
    args: list[str] = []
    for path in values_files:
        args += ["-f", str(path)]
    for item in set_values:
        args += ["--set", item]
    return args


def render(
    helm: str,
    values_files: Iterable[str | Path] = (),
    set_values: Iterable[str] = (),
    *,
    skip_schema: bool = False,
) -> list[dict[str, Any]]:
    """`helm template` the chart; return every non-empty manifest, parsed."""
    args = ["template", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE]
    args += _value_args(values_files, set_values)
    if skip_schema:
        args.append("--skip-schema-validation")
    docs = yaml.safe_load_all(_run(helm, args))
    return [d for d in docs if d]


def render_error(
    helm: str,
    values_files: Iterable[str | Path] = (),
    set_values: Iterable[str] = (),
    *,
    skip_schema: bool = False,
) -> str:
    """The message of the :class:`HelmError` that :func:`render` with these arguments must raise."""
    try:
        render(helm, values_files, set_values, skip_schema=skip_schema)
    except HelmError as err:
        return str(err)
    raise AssertionError("helm rendered the chart; a failure was expected")


def template_fail_test(cases: list[tuple[list[str], str]], *, id_chars: int = 40, timeout_s: float = 60,
                       execution_error: bool = True) -> Callable[..., None]:
    """A test over ``cases`` (``--set`` values, a message): each render must fail with the message
    (and, with ``execution_error``, as a template execution error). It renders without the
    schema, so the template's own checks are what fails. Bind it to a ``test_...`` name in a
    module that has a ``helm`` fixture."""

    @pytest.mark.timeout(timeout_s)
    @pytest.mark.parametrize(("sets", "message"), cases, ids=[m[:id_chars] for _, m in cases])
    def test(helm: str, sets: list[str], message: str) -> None:
        err = render_error(helm, set_values=sets, skip_schema=True)
        assert message in err
        if execution_error:
            assert "execution error" in err

    return test


def lint(helm: str, values_files: Iterable[str | Path] = ()) -> str:
    return _run(helm, ["lint", "--strict", str(CHART_DIR), *_value_args(values_files, ())])


@dataclass
class Rendered:
    """Rendered manifests with lookups by kind and name."""

    objects: list[dict[str, Any]]

    def of_kind(self, kind: str, *, hooks: bool = False) -> list[dict[str, Any]]:
        return [
            o
            for o in self.objects
            if o["kind"] == kind
            and (hooks or "helm.sh/hook" not in o["metadata"].get("annotations", {}))
        ]

    def get(self, kind: str, name: str) -> dict[str, Any]:
        for obj in self.objects:
            if obj["kind"] == kind and obj["metadata"]["name"] == name:
                return obj
        raise KeyError(f"{kind}/{name} not rendered; have {self.names()}")

    def has(self, kind: str, name: str) -> bool:
        return any(o["kind"] == kind and o["metadata"]["name"] == name for o in self.objects)

    def names(self) -> list[str]:
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects)

    def config(self) -> dict[str, Any]:
        """The fleet ConfigMap's three files, parsed."""
        cm = self.get("ConfigMap", f"{RELEASE}-fastvideo3-config")
        return {key: yaml.safe_load(text) for key, text in cm["data"].items()}


def name(component: str) -> str:
    """Object name of a component for the test release."""
    return f"{RELEASE}-fastvideo3-{component}"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge values the way helm merges -f files: maps merge, everything else replaces."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def load_values(*paths: Path) -> dict[str, Any]:
    """Chart defaults merged with the given values files, in order."""
    merged = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for path in paths:
        merged = deep_merge(merged, yaml.safe_load(path.read_text()) or {})
    return merged
