"""A Triton FP8 self-attention kernel of ours against FlashAttention-3's FP8 forward at the Wan
shapes (CUDA), on the same e4m3 inputs and per-(sample, head) descales; and FA3 reading Q, K, V as
strided views of one fused [B, L, 3D] buffer (what the fast path passes by default) against each
contiguous.

    python bench/attention_triton_probe.py [--out FILE] [--tokens 32760] [--heads 12 40]

Inputs as in ``bench/attention_fp8_probe.py`` ([1, L, H, 128], Q and K RMS-normed with per-head
gains, V Gaussian, per-head scales from the measured amax). Every launch config and exponential
mode of the Triton kernel is timed; each output is compared on its first 2,048 query rows with an
fp32 reference. The transposed copy of V the Triton kernel reads is timed on its own
(``transpose_v_ms``): the fast path would pay it once per layer.

The kernel (below) has FA3's contract, with three differences aimed at the two units that bound
FP8 attention at head dim 128 on Hopper: per score, one 128-deep FP8 QK^T and PV costs as many
tensor-core cycles as one ``ex2.approx.f32`` costs on the 16-lane special-function unit.

* ``exp_mode``: ``mufu`` -- every exponential on the special-function unit, as FA3 does;
  ``f16x2`` -- ``ex2.approx.f16x2``, two exponentials per instruction (P is rounded to e4m3's 3
  mantissa bits right after); ``split`` -- each key tile in two halves, the second half's
  exponentials on the FMA units (``2^x = 2^round(x) * poly(frac)``, a cubic).
* P is cast to e4m3 with a fixed scale of 256 folded into the exponent (``2^(x+8)``), so
  probabilities down to 2^-17 survive the cast; the row sums carry the same factor.
* V is read transposed ([B, H, D, Lp], keys contiguous): FP8 MMAs need both operands K-major.

On an H100 it did not reach FA3 (bench/results/attention_triton_probe_h100.json), so the fast path
keeps FA3; the kernel stays here as the measured alternative.

Times are CUDA-event milliseconds of 10 back-to-back calls divided by 10 (the median of 3 runs);
TFLOP/s counts 4 * L^2 * 128 * H.
"""
from __future__ import annotations

import functools
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_fp8_probe import cli, make_inputs, per_head_fp8, reference, rel_err  # noqa: E402
from fp8_kernels_probe import per_call_ms  # noqa: E402

#: (block M, block N, warps, stages, exp mode): the fastest of each mode in a first H100 run of
#: eleven (128x64/4 warps/3 stages mufu 8.64 ms, f16x2 9.52; 128x256/8/2 split 10.3; FA3 6.91)
CONFIGS = [(128, 64, 4, 3, "mufu"), (128, 128, 8, 3, "mufu"), (128, 64, 4, 3, "f16x2"), (128, 256, 8, 2, "split")]


EXP_MODES = ("mufu", "f16x2", "split")


def vt_length(n: int) -> int:
    """The padded key length of a transposed V buffer: a multiple of 128 (16-byte rows for TMA, whole tiles)."""
    return -(-n // 128) * 128


def transpose_v(v: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """e4m3 ``v`` [B, L, H, D] -> [B, H, D, Lp] with keys contiguous and the padding zero."""
    b, n, h, d = v.shape
    lp = vt_length(n)
    if out is None:
        out = torch.zeros(b, h, d, lp, dtype=v.dtype, device=v.device)
    out.view(torch.uint8)[..., :n].copy_(v.view(torch.uint8).permute(0, 2, 3, 1))
    return out


@functools.lru_cache(maxsize=1)
def _kernel():
    import triton
    import triton.language as tl
    global exp2_fma, exp2_f16x2, probs  # the kernel's helpers: globals, where Triton's interpreter looks

    @triton.jit
    def exp2_fma(x):
        # 2^x on the FMA units: j = round(x) through the 1.5 * 2^23 trick, f = x - j in [-0.5, 0.5],
        # 2^f by a cubic, 2^j added to the exponent bits
        x = tl.maximum(x, -120.0)
        t = x + 12582912.0
        j = t - 12582912.0
        f = x - j
        p = 0.0555041086648216 * f + 0.2402264923172690
        p = p * f + 0.6931471805599453
        p = p * f + 1.0
        bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def exp2_f16x2(x):
        xh = x.to(tl.float16)
        return tl.inline_asm_elementwise("ex2.approx.f16x2 $0, $1;", "=r,r", [xh], dtype=tl.float16,
                                         is_pure=True, pack=2)

    @triton.jit
    def probs(s, m_shift, EXP: tl.constexpr):
        # (P as e4m3, its row sums in fp32)
        x = s - m_shift[:, None]
        if EXP == 1:
            p16 = exp2_f16x2(x)
            return p16.to(tl.float8e4nv, fp_downcast_rounding="rtne"), tl.sum(p16.to(tl.float32), 1)
        if EXP == 2:
            p = exp2_fma(x)
        else:
            p = tl.math.exp2(x)
        return p.to(tl.float8e4nv, fp_downcast_rounding="rtne"), tl.sum(p, 1)

    @triton.jit
    def attn_kernel(q_ptr, k_ptr, vt_ptr, o_ptr, qd_ptr, kd_ptr, vd_ptr, L, H, sm_scale,
                    s_qb, s_ql, s_kb, s_kl, s_vb, s_vh, s_vd, s_ob, s_ol,
                    HD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EXP: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        qk_scale = tl.load(qd_ptr + bh) * tl.load(kd_ptr + bh) * sm_scale * 1.4426950408889634
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        dd = tl.arange(0, HD)
        q = tl.load(q_ptr + b * s_qb + rows[:, None] * s_ql + h * HD + dd[None, :], mask=rows[:, None] < L, other=0.0)
        HALF: tl.constexpr = BLOCK_N // 2
        if EXP == 2:
            cols = tl.arange(0, HALF)
        else:
            cols = tl.arange(0, BLOCK_N)
        k_base = k_ptr + b * s_kb + h * HD
        v_base = vt_ptr + b * s_vb + h * s_vh
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, HD], tl.float32)
        n_full = (L // BLOCK_N) * BLOCK_N
        for start in range(0, n_full, BLOCK_N):
            if EXP == 2:
                k1 = tl.load(k_base + (start + cols)[:, None] * s_kl + dd[None, :])
                k2 = tl.load(k_base + (start + HALF + cols)[:, None] * s_kl + dd[None, :])
                s1 = tl.dot(q, tl.trans(k1)) * qk_scale
                s2 = tl.dot(q, tl.trans(k2)) * qk_scale
                m_new = tl.maximum(m_i, tl.maximum(tl.max(s1, 1), tl.max(s2, 1)))
                m_shift = m_new - 8.0
                p1 = tl.math.exp2(s1 - m_shift[:, None])
                p2 = exp2_fma(s2 - m_shift[:, None])
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha + tl.sum(p1, 1) + tl.sum(p2, 1)
                acc = acc * alpha[:, None]
                v1 = tl.load(v_base + dd[:, None] * s_vd + (start + cols)[None, :])
                v2 = tl.load(v_base + dd[:, None] * s_vd + (start + HALF + cols)[None, :])
                acc = tl.dot(p1.to(tl.float8e4nv, fp_downcast_rounding="rtne"), tl.trans(v1), acc)
                acc = tl.dot(p2.to(tl.float8e4nv, fp_downcast_rounding="rtne"), tl.trans(v2), acc)
            else:
                kb = tl.load(k_base + (start + cols)[:, None] * s_kl + dd[None, :])
                s = tl.dot(q, tl.trans(kb)) * qk_scale
                m_new = tl.maximum(m_i, tl.max(s, 1))
                p8, ps = probs(s, m_new - 8.0, EXP)
                alpha = tl.math.exp2(m_i - m_new)
                l_i = l_i * alpha + ps
                acc = acc * alpha[:, None]
                vb = tl.load(v_base + dd[:, None] * s_vd + (start + cols)[None, :])
                acc = tl.dot(p8, tl.trans(vb), acc)
            m_i = m_new
        if n_full < L:  # the last, partial key tile: the padding masked out
            tcols = n_full + tl.arange(0, BLOCK_N)
            kb = tl.load(k_base + tcols[:, None] * s_kl + dd[None, :], mask=tcols[:, None] < L, other=0.0)
            s = tl.dot(q, tl.trans(kb)) * qk_scale
            s = tl.where(tcols[None, :] < L, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p8, ps = probs(s, m_new - 8.0, 0)
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + ps
            acc = acc * alpha[:, None]
            vb = tl.load(v_base + dd[:, None] * s_vd + tcols[None, :])
            acc = tl.dot(p8, tl.trans(vb), acc)
        out = acc * (tl.load(vd_ptr + bh) / l_i)[:, None]
        tl.store(o_ptr + b * s_ob + rows[:, None] * s_ol + h * HD + dd[None, :], out.to(tl.bfloat16),
                 mask=rows[:, None] < L)

    return attn_kernel


def attention_fp8_triton(q: torch.Tensor, k: torch.Tensor, vt: torch.Tensor, q_descale: torch.Tensor,
                         k_descale: torch.Tensor, v_descale: torch.Tensor, *, config) -> torch.Tensor:
    """Softmax attention (scale ``1/sqrt(D)``, no mask) of e4m3 ``q``, ``k`` [B, L, H, D] (unit
    last-dim stride; token and batch strides free, e.g. views of a fused QKV buffer) and ``vt``
    [B, H, D, Lp] (:func:`transpose_v`), descales [B, H] fp32. Returns bf16 [B, L, H, D]."""
    b, n, h, d = q.shape
    if vt.shape[:3] != (b, h, d) or vt.shape[3] < n or vt.stride(3) != 1 or vt.stride(2) != vt.shape[3]:
        raise ValueError(f"vt must be [B, H, D, Lp >= L] contiguous per head, got {tuple(vt.shape)}")
    block_m, block_n, warps, stages, mode = config
    if mode not in EXP_MODES:
        raise ValueError(f"exp mode must be one of {EXP_MODES}, got {mode!r}")
    if q.stride(3) != 1 or k.stride(3) != 1 or q.stride(2) != d or k.stride(2) != d:
        raise ValueError("q and k need unit-stride heads laid out [.., H, D]")
    out = torch.empty(b, n, h, d, dtype=torch.bfloat16, device=q.device)
    grid = (-(-n // block_m), b * h)
    _kernel()[grid](q, k, vt, out, q_descale.contiguous(), k_descale.contiguous(), v_descale.contiguous(), n, h,
                    1.0 / math.sqrt(d), q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                    vt.stride(0), vt.stride(1), vt.stride(2), out.stride(0), out.stride(1),
                    HD=d, BLOCK_M=block_m, BLOCK_N=block_n, EXP=EXP_MODES.index(mode),
                    num_warps=warps, num_stages=stages)
    return out


def case(heads: int, tokens: int, reps: dict, configs) -> dict:
    from fastvideo3.kernels.attention import _fa3
    d = 128
    q, k, v = make_inputs(heads, tokens, d)
    ref = reference(q, k, v)
    flops = 4.0 * tokens * tokens * d * heads
    row: dict = {"heads": heads, "tokens": tokens, "head_dim": d}

    (q8, k8, v8), ds, _ = per_head_fp8(q, k, v)
    vt = transpose_v(v8)
    row["transpose_v_ms"] = round(per_call_ms(lambda: transpose_v(v8, vt), **reps), 4)

    def add(name, fn):
        try:
            ms = per_call_ms(fn, **reps)
            row[name] = {"ms": round(ms, 3), "tflops": round(flops / ms / 1e9, 1), "rel_err": rel_err(fn(), ref)}
        except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
            row[name] = {"error": f"{type(e).__name__}: {e}"[:400]}
        print(name, row[name], flush=True)

    fa3 = _fa3()
    if fa3 is not None:
        def fa3_fp8():
            out = fa3(q8, k8, v8, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
            return out[0] if isinstance(out, tuple) else out
        add("fa3_fp8", fa3_fp8)
        fused = torch.cat([x.reshape(1, tokens, heads * d).view(torch.uint8) for x in (q8, k8, v8)], dim=-1)
        qs, ks, vs = (fused[..., i * heads * d:(i + 1) * heads * d].view(torch.float8_e4m3fn)
                      .view(1, tokens, heads, d) for i in range(3))

        def fa3_fp8_strided():
            out = fa3(qs, ks, vs, q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
            return out[0] if isinstance(out, tuple) else out
        add("fa3_fp8_strided", fa3_fp8_strided)
    for cfg in configs:
        add("triton_" + "_".join(map(str, cfg)),
            lambda cfg=cfg: attention_fp8_triton(q8, k8, vt, ds[0], ds[1], ds[2], config=cfg))
    return row


def main(argv: list[str] | None = None) -> int:
    a = cli(__doc__, "attention_triton_probe.json", argv)
    if a is None:
        return 2
    import triton
    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "command": "python bench/attention_triton_probe.py " + " ".join(argv or sys.argv[1:]), "cases": []}
    for h in a.heads:
        result["cases"].append(case(h, a.tokens, {"calls": 10, "runs": 3}, CONFIGS))
        Path(a.out).write_text(json.dumps(result, indent=1))
    summary = []
    for row in result["cases"]:
        timed = {k: v for k, v in row.items() if isinstance(v, dict) and "ms" in v}
        best = min((k for k in timed if k.startswith("triton")), key=lambda k: timed[k]["ms"], default=None)
        summary.append({"heads": row["heads"], "fa3_fp8_ms": timed.get("fa3_fp8", {}).get("ms"),
                        "fa3_fp8_strided_ms": timed.get("fa3_fp8_strided", {}).get("ms"),
                        "fa3_fp8_rel_err": timed.get("fa3_fp8", {}).get("rel_err"),
                        "triton_fp8_ms": timed[best]["ms"] if best else None, "triton_config": best,
                        "triton_fp8_rel_err": timed[best]["rel_err"] if best else None,
                        "transpose_v_ms": row["transpose_v_ms"]})
    result["summary"] = summary
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
