"""The shared vocabulary is written once: a role, unit kind, loop id, program, task, output format or
sampler name spelled as a string literal anywhere in fastvideo3/, services/ or fleet/ (outside
fastvideo3/vocab.py and the generated protobuf code) fails this test.

The check is over the AST: every string constant counts except docstrings; f-string fragments
are not whole constants and so do not count. A literal means the vocabulary is retyped; import
the member from fastvideo3.vocab instead (a StrEnum member compares and serializes as its string).
"""

from __future__ import annotations

import ast
from pathlib import Path

from fastvideo3.vocab import LoopId, OutputFormat, Program, Role, Sampler, Task, UnitKind

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("fastvideo3", "services", "fleet")
EXCLUDED = (ROOT / "fastvideo3" / "v1", ROOT / "fastvideo3" / "vocab.py")
BANNED: dict[str, str] = {m.value: type(m).__name__ for e in (Role, UnitKind, LoopId, Program, OutputFormat, Sampler, Task)
                          for m in e}


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def literal_violations(source: str, name: str = "<src>") -> list[str]:
    """``file:line: 'value' (Enum)`` for each vocabulary literal in ``source``."""
    tree = ast.parse(source, name)
    skip = _docstrings(tree)
    inside_fstring = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in BANNED
                and id(node) not in skip and id(node) not in inside_fstring):
            out.append(f"{name}:{node.lineno}: {node.value!r} ({BANNED[node.value]})")
    return out


def _scanned_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for p in sorted((ROOT / top).rglob("*.py")):
            if not any(p == ex or ex in p.parents for ex in EXCLUDED):
                files.append(p)
    return files


def test_no_vocabulary_literal_outside_the_vocabulary_module():
    found = []
    for p in _scanned_files():
        found += literal_violations(p.read_text(), str(p.relative_to(ROOT)))
    assert not found, "vocabulary literals outside fastvideo3/vocab.py:\n" + "\n".join(found)


def test_the_check_catches_each_kind_of_literal():
    snippet = '''
"""A docstring may say 'encoder' and "diffusion_step"."""
ROLE = "denoiser"
def f(kind="vae_tile", fmt="mp4"):
    """t2v"""
    return {"unipc": kind, "prog": "t2v"}, f"{fmt}euler", ("reward_score", "euler")
'''
    found = literal_violations(snippet)
    values = sorted(v.split(": ", 1)[1] for v in found)
    assert values == sorted(["'denoiser' (Role)", "'vae_tile' (UnitKind)", "'mp4' (OutputFormat)",
                             "'unipc' (Sampler)", "'t2v' (Program)", "'reward_score' (LoopId)", "'euler' (Sampler)"])
    assert not literal_violations('from fastvideo3.vocab import Role\nx = Role.ENCODER\ny = "text_encoder"\n')


def test_the_scan_covers_the_tree():
    files = {str(p.relative_to(ROOT)) for p in _scanned_files()}
    assert "services/common/pool.py" in files and "fleet/deployment_card.py" in files
    assert "fastvideo3/vocab.py" not in files and not any(f.startswith("fastvideo3/v1/") for f in files)
