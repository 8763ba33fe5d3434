"""Checkpoint reading every family shares: the safetensors files of a folder, their digest, the
precision table, the config check and the strict, shape-checked tensor reader.

Family-neutral: a family's ``checkpoint`` module holds its key maps and its directory's card, and
reads its weights through :func:`checked_tensors`.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from fastvideo3.errors import CardError

#: precision -> the dtype weights load in and activations run in; under fp8_e4m3 that is bf16
#: (a family then quantizes its block Linears to e4m3)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp8_e4m3": torch.bfloat16}


def safetensors_files(folder: Path) -> list[Path]:
    index = sorted(folder.glob("*.safetensors.index.json"))
    if index:
        weight_map = json.loads(index[0].read_text())["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CardError(f"no safetensors weights in {folder.name}/", field=f"checkpoint.{folder.name}")
    return files


def weights_digest(files: list[Path]) -> str:
    """A cheap digest of weight files: names, sizes and safetensors headers (which hold every
    tensor's dtype, shape and byte offsets). Reading the bodies would cost a full pass."""
    h = hashlib.sha256()
    for p in files:
        with open(p, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            h.update(p.name.encode())
            h.update(str(p.stat().st_size).encode())
            h.update(fh.read(min(n, 1 << 26)))
    return "sha256:" + h.hexdigest()


def checked_tensors(folder: Path, table: dict[str, tuple[str, tuple[int, ...]]], component: str,
                    unexpected: list[str]) -> Iterator[tuple[str, str, torch.Tensor]]:
    """``(key, name, tensor)`` for every tensor of ``folder`` that the key map ``table`` (key ->
    (our name, shape)) knows, read on the CPU after its shape is checked (a mis-shaped one is
    refused, named); a key the table does not know is appended to ``unexpected``."""
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            for key in fh.keys():
                if key not in table:
                    unexpected.append(key)
                    continue
                name, shape = table[key]
                got = tuple(fh.get_slice(key).get_shape())
                if got != shape:
                    raise CardError(f"tensor {key} has shape {list(got)}, the card's config expects {list(shape)}",
                                    field=f"{component}.{key}")
                yield key, name, fh.get_tensor(key)


def same_value(a, b) -> bool:
    """Config values equal, a list and a tuple of the same items included (JSON has no tuples)."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == b


def check_config(component: str, expected: dict, actual: dict) -> None:
    """Refuse a checkpoint whose architecture config disagrees with its card, naming the field."""
    for k, v in expected.items():
        if k in actual and not same_value(v, actual[k]):
            raise CardError(f"checkpoint {component}/config.json has {k}={actual[k]!r}, the card declares {v!r}",
                            field=f"components.{component}.config.{k}")


def slug(name: str) -> str:
    """A directory name made safe for a custom card's id."""
    s = "".join(c if c.isalnum() or c in "._-" else "-" for c in name).strip("-._")
    return (s or "dir")[:64]
