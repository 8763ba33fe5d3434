"""What the LoRA kernels share (:mod:`~fastvideo3.kernels.lora`, :mod:`~.lora_grouped`,
:mod:`~.lora_norm`, :mod:`~.lora_shrink`): the ``@triton.jit`` pieces of their down and up
projections, and the host-side checks and flags of their wrappers.

The jit helpers are inlined into the kernels that call them, so each kernel compiles as if they
were written out. Like the kernels they are defined on first use (:func:`jit`: Triton decides at
decoration time whether to compile or interpret), as globals of this module, and kernels call them
through it (``lc.down(...)``): Triton's interpreter sees a kernel's globals, not its closure.
"""
from __future__ import annotations

import functools
import os

import torch


def interpreting() -> bool:
    # Triton's CPU interpreter computes bf16/fp16 tl.dot wrongly (checked with triton 3.9):
    # there the operands go up to fp32 first, which is what the GPU's tensor cores accumulate in
    return os.environ.get("TRITON_INTERPRET") == "1"


def dot_flags(dtype: torch.dtype) -> dict:
    """The kernels' IEEE and F32DOT flags for activations of ``dtype``: fp32 activations take
    IEEE fp32 dots; under the interpreter every dot runs on fp32 operands."""
    return dict(IEEE=dtype == torch.float32, F32DOT=dtype == torch.float32 or interpreting())


def check_impl(impl: str) -> None:
    """Called after a wrapper has handled ``impl="torch"``: anything but "triton" is an error."""
    if impl != "triton":
        raise ValueError(f"impl must be 'triton' or 'torch', got {impl!r}")


def check_act(act: str | None) -> None:
    if act not in (None, "gelu_tanh"):
        raise ValueError(f"act must be None or 'gelu_tanh', got {act!r}")


def check_rows(slots: torch.Tensor, scales: torch.Tensor, bsz: int) -> None:
    if slots.shape != (bsz,) or scales.shape != (bsz,):
        raise ValueError("slots and scales need one entry per row")


def check_operands(x, y, a, b, slots, scales, groups: int = 1) -> None:
    """The shapes of a delta over ``groups`` members: ``x`` [B, N, K], ``y`` [B, N, G*OUT],
    ``a`` [S, G*R, K], ``b`` [S, G*OUT, R], one slot and scale per row."""
    if x.dim() != 3 or y.dim() != 3 or x.shape[:2] != y.shape[:2]:
        raise ValueError(f"x {tuple(x.shape)} and y {tuple(y.shape)} must be [B, N, K] and [B, N, G*OUT]")
    if groups < 1 or a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[1] % groups:
        raise ValueError(f"a {tuple(a.shape)} / b {tuple(b.shape)} must be [S, G*R, K] / [S, G*OUT, R], G={groups}")
    r = a.shape[1] // groups
    if b.shape[2] != r or a.shape[2] != x.shape[2] or b.shape[1] != y.shape[2] or y.shape[2] % groups:
        raise ValueError(f"adapter dims {tuple(a.shape)}/{tuple(b.shape)} do not fit x {tuple(x.shape)} "
                         f"y {tuple(y.shape)} with {groups} member(s)")
    check_rows(slots, scales, x.shape[0])


def check_unit_stride(*tensors: torch.Tensor) -> None:
    if any(t.stride(-1) != 1 for t in tensors):
        raise ValueError("the Triton path needs unit stride along the feature dims")


def check_rank(r: int) -> None:
    if r < 16 or r & (r - 1):
        raise ValueError(f"the Triton path needs a power-of-two rank >= 16, got {r}")


@functools.lru_cache(maxsize=1)
def jit() -> None:
    """Define the shared ``@triton.jit`` helpers (before the kernels that call them run)."""
    global dot, mma, adapter, row_tile, down, up, gelu_tanh
    global tl  # the interpreter wants triton.language among a jit function's globals
    import triton
    import triton.language as tl

    @triton.jit
    def dot(x, w, IEEE: tl.constexpr):
        if IEEE:
            d = tl.dot(x, w, input_precision="ieee")
        else:
            d = tl.dot(x, w)
        return d

    @triton.jit
    def mma(acc, x, w, IEEE: tl.constexpr, F32DOT: tl.constexpr):
        # acc + x @ w, the operands raised to fp32 first with F32DOT
        if F32DOT:
            x, w = x.to(tl.float32), w.to(tl.float32)
        return acc + dot(x, w, IEEE)

    @triton.jit
    def adapter(slot, SCALE, row):
        # a row without an adapter (slot < 0) reads slot 0's weights with a zero scale
        has = slot >= 0
        return has, tl.maximum(slot, 0), tl.where(has, tl.load(SCALE + row), 0.0)

    @triton.jit
    def row_tile(SLOT, BM: tl.constexpr, R: tl.constexpr):
        # a (token tile, batch row) program's row, that row's slot, its token and rank offsets
        row = tl.program_id(1)
        return row, tl.load(SLOT + row), tl.program_id(0) * BM + tl.arange(0, BM), tl.arange(0, R)

    @triton.jit
    def down(X, a_base, row, sxb, sxn, offs_m, m_ok, k_begin, k_end,
             BM: tl.constexpr, R: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr, F32DOT: tl.constexpr):
        # fp32 x[row, offs_m, k_begin:k_end] @ a.T, a's [R] rows at a_base (unit stride along K)
        acc = tl.zeros((BM, R), dtype=tl.float32)
        for k0 in range(k_begin, k_end, BK):
            offs_k = k0 + tl.arange(0, BK)
            k_ok = offs_k < k_end
            x = tl.load(X + row * sxb + offs_m[:, None] * sxn + offs_k[None, :], mask=m_ok & k_ok[None, :],
                        other=0.0)
            a = tl.load(a_base + offs_k[:, None], mask=k_ok[:, None], other=0.0)
            acc = mma(acc, x, a, IEEE, F32DOT)
        return acc

    @triton.jit
    def up(xa, B, s, sbs, sbo, offs_o, o_ok, offs_r, IEEE: tl.constexpr, F32DOT: tl.constexpr):
        # one output tile of xa @ b[s].T (xa already fp32 with F32DOT)
        bt = tl.load(B + s * sbs + offs_o[None, :] * sbo + offs_r[:, None], mask=o_ok[None, :], other=0.0)
        if F32DOT:
            bt = bt.to(tl.float32)
        return dot(xa, bt, IEEE)

    @triton.jit
    def gelu_tanh(out):
        # tanh GELU: 0.5 * (1 + tanh(u)) == sigmoid(2u)
        return out * tl.sigmoid(1.5957691216057308 * (out + 0.044715 * out * out * out))
