"""Caching policies for the Wan DiT, written as interceptors.

* :class:`DBCache` (block interceptor): the first ``front_blocks`` and last ``back_blocks``
  always run; the middle is replaced by the residual it produced at the last step that computed
  it while the front blocks' residual has changed by less than ``threshold`` (relative mean
  absolute difference) since that step. Optional TaylorSeer: the replacement is a Taylor
  extrapolation (finite differences over computed steps) instead of the last residual.
  ``fbcache`` is DBCache with one front block and no back block (First-Block-Cache).
* :class:`TeaCache` (step interceptor): reuses the whole stack's residual while the accumulated
  relative L1 change of the first block's modulated input stays under ``threshold``.

State written (per CFG stream): JSON ``state`` — ``reused`` (steps that reused), ``diffs``
(step -> measured change), counters; resident ``tensors`` — the last front residual, the middle
residual (or its Taylor ladder), TeaCache's last probe and stack residual.
"""
from __future__ import annotations

import math

import torch

from fastvideo3.extend.protocols import RowView

#: TeaCache's published rescale polynomial for Wan2.1 T2V 1.3B (highest power first)
TEACACHE_WAN_COEFFICIENTS = (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02)


def rel_l1(prev: torch.Tensor, cur: torch.Tensor) -> float:
    """mean|prev - cur| / mean|prev| (the change measure both policies threshold)."""
    return float(((prev - cur).abs().mean() / prev.abs().mean()).item())


class DBCache:
    name = "dbcache"

    def __init__(self, settings: dict):
        self.front = int(settings.get("front_blocks", 1))
        self.back = int(settings.get("back_blocks", 0))
        self.threshold = float(settings["threshold"])
        self.warmup = int(settings["warmup_steps"])
        self.max_cached = int(settings["max_cached_steps"])
        self.max_continuous = int(settings["max_continuous_cached_steps"])
        self.taylor = bool(settings.get("taylorseer", False))
        self.order = int(settings.get("taylorseer_order", 1))

    def split(self, num_blocks: int) -> tuple[int, int]:
        if self.front + self.back >= num_blocks:
            from fastvideo3.errors import InvalidRequest
            raise InvalidRequest(f"front_blocks + back_blocks must leave a middle block of {num_blocks}",
                                 field="cache.back_blocks", limit=f"front_blocks + back_blocks <= {num_blocks - 1}")
        return self.front, self.back

    def reuse_middle(self, row: RowView, front_residual: torch.Tensor) -> bool:
        st = row.state
        reused: list = st.setdefault("reused", [])
        if st.get("last_reused") != row.step - 1:
            st["continuous"] = 0  # a computed step breaks the streak
        reuse = False
        prev = row.tensors.get("front_residual")
        if (row.step >= self.warmup
                and not (self.max_cached >= 0 and len(reused) >= self.max_cached)
                and not (self.max_continuous >= 0 and st.get("continuous", 0) >= self.max_continuous)
                and prev is not None and prev.shape == front_residual.shape):
            diff = 1.0 if self.threshold >= 1.0 else rel_l1(prev, front_residual)
            st.setdefault("diffs", {})[str(row.step)] = diff
            reuse = diff < self.threshold or self.threshold >= 1.0
        if reuse:
            reused.append(row.step)
            st["last_reused"] = row.step
            st["continuous"] = st.get("continuous", 0) + 1
        else:
            row.tensors["front_residual"] = front_residual.clone()
        return reuse

    def middle_residual(self, row: RowView) -> torch.Tensor:
        if not self.taylor:
            return row.tensors["middle_residual"]
        elapsed = row.step - int(row.state["taylor_last"])
        out = 0
        for i in range(self.order + 1):
            d = row.tensors.get(f"taylor.{i}")
            if d is None:
                break
            out = out + (1 / math.factorial(i)) * d * (elapsed ** i)
        return out

    def after_middle(self, row: RowView, residual: torch.Tensor) -> None:
        if not self.taylor:
            row.tensors["middle_residual"] = residual.clone()
            return
        # the derivative ladder over computed steps: d0 = Y, d_{i+1} = (d_i - prev d_i) / window
        k, last = row.step, int(row.state.get("taylor_last", -1))
        window = k - last
        ladder = [residual.clone()]
        for i in range(self.order):
            prev = row.tensors.get(f"taylor.{i}")
            if prev is None or k <= 1:
                break
            ladder.append((ladder[i] - prev) / window)
        for i in range(self.order + 1):
            row.tensors.pop(f"taylor.{i}", None)
        for i, d in enumerate(ladder):
            row.tensors[f"taylor.{i}"] = d
        row.state["taylor_last"] = k


class FBCache(DBCache):
    name = "fbcache"

    def __init__(self, settings: dict):
        super().__init__({**settings, "front_blocks": 1, "back_blocks": 0, "taylorseer": False})


class TeaCache:
    name = "teacache"

    def __init__(self, settings: dict):
        self.threshold = float(settings["threshold"])
        self.warmup = int(settings["warmup_steps"])
        self.final = int(settings["final_steps"])
        self.rescale = bool(settings["rescale"])

    def reuse_step(self, row: RowView, probe: torch.Tensor) -> bool:
        st = row.state
        prev = row.tensors.get("probe")
        reuse = False
        if row.step < self.warmup or row.step >= row.num_steps - self.final or prev is None:
            st["accumulated"] = 0.0
        else:
            change = rel_l1(prev, probe)
            if self.rescale:
                change = float(sum(c * change ** (len(TEACACHE_WAN_COEFFICIENTS) - 1 - i)
                                   for i, c in enumerate(TEACACHE_WAN_COEFFICIENTS)))
            st.setdefault("diffs", {})[str(row.step)] = change
            acc = float(st.get("accumulated", 0.0)) + change
            reuse = acc < self.threshold and "residual" in row.tensors
            st["accumulated"] = acc if reuse else 0.0
        row.tensors["probe"] = probe.clone()
        if reuse:
            st.setdefault("reused", []).append(row.step)
        return reuse

    def reused_residual(self, row: RowView) -> torch.Tensor:
        return row.tensors["residual"]

    def after_step(self, row: RowView, blocks_in: torch.Tensor, blocks_out: torch.Tensor) -> None:
        row.tensors["residual"] = blocks_out - blocks_in


FACTORIES = {"dbcache": DBCache, "fbcache": FBCache, "teacache": TeaCache}


def build(settings: dict | None):
    """``(step_interceptor, block_interceptor)`` for validated settings (either may be None)."""
    if not settings:
        return None, None
    obj = FACTORIES[settings["policy"]](settings)
    if hasattr(obj, "reuse_step"):
        return obj, None
    return None, obj
