"""The price of a diffusion step on a parallel replica: compute split over the ranks, plus the
bytes the plan moves between them.

Per rank and forward (``n`` sequences on this rank = all / cfg, ``T`` tokens per sequence,
``D`` hidden, ``L`` layers, ``a`` activation bytes, sequence degree ``S = R * U``):

* Ulysses (``U > 1``): four all-to-alls per layer (Q, K, V out, O back), each sending
  ``(U - 1) / U`` of a ``n * T/S * D`` tensor: ``4 L n (T/S) D a (U-1)/U``;
* ring (``R > 1``): ``R - 1`` passes of a ring chunk's K and V per layer, ``T/R`` tokens of
  ``D/U`` channels: ``2 L (R-1) n (T/R) (D/U) a``;
* CFG (``C > 1``): one all-gather of the output rows: ``n (T/S) P a (C-1)``.

FLOPs and activation bytes divide by the ranks; each rank still reads every weight once per
call; resident and peak activation bytes divide by the sequence degree (per device). The
moved bytes are charged at the link's rate, expressed in device-memory bytes
(:func:`link_ratio`), so the one calibrated factor of the cost model scales the whole prior.
"""
from __future__ import annotations

from dataclasses import replace

#: sustained bytes/s one rank moves over the replica's link (NVLink on an H200 node; loopback
#: TCP for gloo ranks on a CPU). Priors: calibration corrects the product.
LINK_BYTES_PER_S = {"cpu": 2.0e9, "h200": 3.0e11}


def link_ratio(device) -> float:
    """Device-memory bytes that cost as much time as one byte over the link."""
    link = LINK_BYTES_PER_S.get(getattr(device, "name", ""), LINK_BYTES_PER_S["cpu"])
    return device.bandwidth * device.bandwidth_efficiency / link


def comm_bytes(config, shape, plan, act_bytes: int = 2) -> float:
    """Bytes one rank sends per forward under ``plan`` (module docstring)."""
    c, r, u = plan.cfg, plan.ring, plan.ulysses
    s = r * u
    n = -(-shape.sequences // c)
    tok, d, nl = shape.tokens(config), config.hidden, config.num_layers
    out = 0.0
    if u > 1:
        out += 4.0 * nl * n * (tok / s) * d * act_bytes * (u - 1) / u
    if r > 1:
        out += 2.0 * nl * (r - 1) * n * (tok / r) * (d / u) * act_bytes
    if c > 1:
        out += n * (tok / s) * config.out_channels * config.patch_volume * act_bytes * (c - 1)
    return out


def parallel_work(work, weight_bytes: float, config, shape, plan, act_bytes: int, ratio: float):
    """One rank's share of ``work`` (a :class:`fastvideo3.runtime.economy.cost.Work`) plus its traffic."""
    world = plan.world
    act = max(0.0, work.bytes - weight_bytes)
    moved = comm_bytes(config, shape, plan, act_bytes) * ratio
    return replace(work, flops=work.flops / world, bytes=weight_bytes + act / world + moved,
                   peak_bytes=int(work.peak_bytes / plan.sp), resident_bytes=int(work.resident_bytes / plan.sp))
