"""A reference e4m3 (float8_e4m3fn) built from its bits, for the FP8 tests: every finite
non-negative value and round-to-nearest (ties to the even code, saturating at 448)."""
from __future__ import annotations

import torch


def e4m3_values() -> torch.Tensor:
    """Every finite non-negative e4m3 (float8_e4m3fn) value, from its definition: 1 sign, 4
    exponent bits (bias 7), 3 mantissa bits; exponent 0 is subnormal; S.1111.111 is NaN."""
    vals = {(m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
            for e in range(16) for m in range(8) if not (e == 15 and m == 7)}
    return torch.tensor(sorted(vals), dtype=torch.float64)


E4M3_GRID = e4m3_values()


def ref_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Nearest e4m3 value of each element of ``v`` (ties to the even code), saturating at 448, in float64."""
    a = v.double().abs().clamp(max=448.0)
    hi = torch.searchsorted(E4M3_GRID, a).clamp(max=len(E4M3_GRID) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - E4M3_GRID[lo], E4M3_GRID[hi] - a
    pick = torch.where(d_lo < d_hi, lo, hi)
    tie = d_lo == d_hi
    pick = torch.where(tie & (lo % 2 == 0), lo, torch.where(tie, hi, pick))  # codes are index order
    return E4M3_GRID[pick] * v.double().sign()
