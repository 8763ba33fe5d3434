"""The fast path of the Wan DiT under ``fp8_e4m3``: :class:`FastWanDiT`'s forward with every block
GEMM on the e4m3 tensor-core path and self-attention in FP8 where it can run.

Per block (``impl="triton"``; the PyTorch twins compute the same on a CPU):

* each modulated / affine norm (:func:`add_norm`) writes its output directly as e4m3 with one
  scale per token, so the QKV, cross-attention Q and FFN-in GEMMs read FP8 with no extra pass;
* the FFN's first GEMM writes ``gelu_tanh(x W^T + b)`` as e4m3 from its epilogue, with per-token
  scales bounded before the GEMM (:func:`~fastvideo3.kernels.fp8_gemm.ffn_in_gelu_fp8`), so the
  hidden layer is never written in bf16 (``ffn_fused``; ``FASTVIDEO3_FP8_BOUNDED=0`` turns it off,
  and with per-tensor scales it is off: a bf16 GEMM output, then bias + GELU + the per-token cast
  in one pass, :func:`bias_gelu_quant`);
* self-attention: QK RMSNorm + RoPE + the e4m3 cast of Q, K and V are one kernel
  (:func:`qkv_fp8`; Q/K scales static bounds by default, or measured / K-smoothed as the card's
  ``fp8.attention_scales`` says), then FlashAttention-3's FP8 forward with per-(sample, head) descales;
  without the fa3_fwd wheel (or for a head dim it lacks) attention runs in bf16 as before;
* optionally, the two attention outputs are cast to e4m3 before their output GEMMs with one
  scale per sample known before attention runs: an output row is a convex combination of V's rows, so ``|o| <=
  max |V|`` (FP8 self-attention: V's per-head descales; cross-attention: its text values' amax,
  once per forward), and the cast is elementwise (``attn_out_bounded``, opt-in:
  ``FASTVIDEO3_FP8_BOUNDED_ATTENTION_OUT=1``; off: per-token amax, the default, as the bounded
  cast timed no faster);
  cross-attention itself (512 text keys, ~1% of the step) stays bf16;
* GEMMs: ``torch._scaled_mm`` row-wise (per-token x per-channel scales, fp32 accumulation,
  bf16 out, bias in the epilogue).

The patch embedding, condition embedder and head stay bf16, as in :mod:`fastvideo3.models.wan.fp8`.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fastvideo3.kernels import add_norm, attention, qk_norm_rope
from fastvideo3.kernels.fp8 import (
    E4M3, E4M3_MAX, attention_fp8, bias_gelu_quant, fp8_attention_available, fp8_linear, qk_scale_bound, qkv_fp8,
    quantize_bounded, quantize_rows,
)
from fastvideo3.kernels.fp8_gemm import ffn_in_gelu_fp8, weight_stats
from fastvideo3.models.wan.dit import Tap, WanDiT
from fastvideo3.models.wan.fp8 import bounded_attention_out_enabled, bounded_scales_enabled
from fastvideo3.models.wan.fast import FastWanDiT


_log = logging.getLogger(__name__)

#: an attention output can exceed max |V| only by the rounding of its probabilities (FP8 or bf16
#: P summing to a little over 1); the bound is widened by this factor, and the cast clamps anyway
_OUT_SLACK = 1.0625


@dataclass
class _QLinear:
    w: torch.Tensor  # e4m3 [N, K]
    s: torch.Tensor  # fp32 [N]
    b: torch.Tensor  # bf16 [N]


@dataclass
class _Fp8Block:
    qkv: _QLinear
    qk_norm: torch.Tensor  # [2, D]
    qk_scales: torch.Tensor  # [2, heads]: the bound scales of normed Q and K
    out: _QLinear
    q2: _QLinear
    q2_norm: torch.Tensor  # [1, D]
    out2: _QLinear
    norm2_w: torch.Tensor | None
    norm2_b: torch.Tensor | None
    ff1: _QLinear
    ff2: _QLinear
    ff1_stats: tuple[float, float]  # (max row norm of W, max |b|): the fused FFN-in's scale bound
    v_bound: torch.Tensor  # [2, heads]: 448 sqrt(K) x (max row norm of W_v), max |b_v|, per head


def _cat8(ts: list[torch.Tensor]) -> torch.Tensor:
    # e4m3 concatenated through its bytes: cat need not support float8 on every backend
    return torch.cat([t.view(torch.uint8) for t in ts]).view(E4M3)


def _fuse8(linears, share: bool) -> _QLinear:
    q = _QLinear(_cat8([lin.weight for lin in linears]), torch.cat([lin.weight_scale for lin in linears]),
                 torch.cat([lin.bias.detach() for lin in linears]))
    if share:
        row = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight, lin.weight_scale = q.w[row:row + n], q.s[row:row + n]
            lin.bias.data = q.b[row:row + n]
            row += n
    return q


def _one(lin) -> _QLinear:
    return _QLinear(lin.weight, lin.weight_scale, lin.bias.detach())


def _v_bound(lin, heads: int) -> torch.Tensor:
    """Per head of the V projection ``lin`` (e4m3 [D, K], per-channel scales): ``[448 sqrt(K) max
    |w_n|, max |b_n|]`` over the head's rows n, fp32 [2, heads]. With e4m3 rows ``|xq| <= 448``
    of scale ``sa``, ``|v_n| <= sa * 448 sqrt(K) |w_n| + |b_n|`` (Cauchy-Schwarz): the bound V's
    per-head scale takes without measuring V. Rounded up by 2^-7 (bf16's rounding of the GEMM
    output; the cast clamps anyway)."""
    k = lin.weight.shape[1]
    w = (lin.weight.float() * lin.weight_scale.float()[:, None]).norm(dim=1).view(heads, -1).amax(dim=1)
    b = lin.bias.detach().float().abs().view(heads, -1).amax(dim=1)
    return torch.stack([E4M3_MAX * math.sqrt(k) * w, b]) * (1 + 2 ** -7)


class Fp8FastWanDiT(FastWanDiT):
    """:class:`FastWanDiT` for a model whose block Linears are :class:`Fp8Linear`. ``fp8_attention``:
    True / False / None (FP8 self-attention wherever :func:`fp8_attention_available`, unless the
    card asked for bf16 attention: ``model.fp8_attention`` set at quantization)."""

    def __init__(self, dit: WanDiT, *, fp8_attention: bool | None = None, **kw):
        super().__init__(dit, **kw)
        avail = fp8_attention_available(self.device, self.head_dim)
        if fp8_attention and not avail:
            raise RuntimeError("FP8 attention needs the fa3_fwd wheel on a Hopper GPU and head_dim 64/128/256")
        wanted = getattr(dit, "fp8_attention", True)
        self.fp8_attention = (avail and wanted) if fp8_attention is None else bool(fp8_attention)
        #: keep GEMM partial sums in the FP8 accumulator (the card's ``fp8.accumulation: fast``)
        self.fast_accum = bool(getattr(dit, "fp8_fast_accum", False))
        #: how Q and K of the FP8 self-attention are scaled (the card's ``fp8.attention_scales``)
        self.attention_scales = getattr(dit, "fp8_attention_scales", "bound")
        self.per_tensor = dit.blocks[0].attn1.to_q.activation_scaling == "tensor"
        #: the FFN-in GEMM writes the GELU'd hidden layer as e4m3 itself (per-token scales only)
        self.ffn_fused = not self.per_tensor and bounded_scales_enabled()
        #: the attention outputs cast with the bound max |V| instead of a per-token amax pass
        self.attn_out_bounded = not self.per_tensor and bounded_attention_out_enabled()
        #: whether the QKV pass writes Q, K and V each contiguous for FA3 (else strided views of
        #: one [B, L, 3D] buffer), and its launch (token rows a program, warps; None: the default)
        self.qkv_split = False
        self.qkv_launch: tuple[int | None, int | None] = (None, None)
        #: the QKV pass's kernel (None: :data:`~fastvideo3.kernels.fp8.QKV_KERNEL`) and the fused
        #: FFN-in's launch config (None: its default; see :data:`~fastvideo3.kernels.fp8_gemm.CONFIGS`)
        self.qkv_kernel: str | None = None
        self.ffn_config: tuple | None = None
        #: V's per-head scales bounded from the QKV GEMM's input scales and W_v (:func:`_v_bound`)
        #: instead of measured by a pass over V (off: not yet timed on a GPU)
        self.v_bounded = False

    def _build(self, dit: WanDiT, share: bool) -> None:
        d, heads = self.cfg.inner_dim, self.cfg.num_attention_heads
        self.patch_w = dit.patch_embedding.weight.detach().reshape(d, -1)
        self.patch_b = dit.patch_embedding.bias.detach()
        self.blocks = []
        for blk in dit.blocks:
            a1, a2 = blk.attn1, blk.attn2
            self.blocks.append(_Fp8Block(
                _fuse8([a1.to_q, a1.to_k, a1.to_v], share),
                torch.stack([a1.norm_q.weight.detach(), a1.norm_k.weight.detach()]),
                torch.stack([qk_scale_bound(a1.norm_q.weight, heads), qk_scale_bound(a1.norm_k.weight, heads)]),
                _one(a1.to_out[0]), _one(a2.to_q), a2.norm_q.weight.detach().view(1, d), _one(a2.to_out[0]),
                blk.norm2.weight.detach() if blk.norm2 is not None else None,
                blk.norm2.bias.detach() if blk.norm2 is not None else None,
                _one(blk.ffn.net[0].proj), _one(blk.ffn.net[2]),
                weight_stats(blk.ffn.net[0].proj.weight, blk.ffn.net[0].proj.weight_scale, blk.ffn.net[0].proj.bias),
                _v_bound(a1.to_v, heads),
            ))
        self.kv = _fuse8([lin for blk in dit.blocks for lin in (blk.attn2.to_k, blk.attn2.to_v)], share)
        self.k_norm = torch.stack([blk.attn2.norm_k.weight.detach().float() for blk in dit.blocks])
        self.mod_table = torch.stack([blk.scale_shift_table.detach().float() for blk in dit.blocks])
        self.ikv_w = self.ikv_b = self.ik_norm = None  # no image K/V: the FP8 cards are text-to-video

    # -----------------------------------------------------------------------------------
    def _quant(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_rows(h, per_tensor=self.per_tensor, impl=self.kernels)

    def _norm_fp8(self, x, y, gate, a, b, *, modulate: bool):
        """add_norm with its output quantized: fused per token, or via bf16 for per-tensor scales."""
        eps, impl = self.cfg.eps, self.kernels
        if self.per_tensor:
            return self._quant(add_norm(x, y, gate, a, b, modulate=modulate, eps=eps, impl=impl))
        return add_norm(x, y, gate, a, b, modulate=modulate, eps=eps, impl=impl, fp8=True)

    def _linear(self, h: torch.Tensor, lin: _QLinear) -> torch.Tensor:
        return self._gemm(self._quant(h), lin)

    def _gemm(self, hq: tuple[torch.Tensor, torch.Tensor], lin: _QLinear, bias: bool = True) -> torch.Tensor:
        return fp8_linear(*hq, lin.w, lin.s, lin.b if bias else None, out_dtype=self.dtype, fast_accum=self.fast_accum)

    def _attn_out(self, o: torch.Tensor, scale: torch.Tensor | None, lin: _QLinear) -> torch.Tensor:
        """An attention output's GEMM: ``o`` cast with its per-sample bound ``scale`` [B], or
        quantized per token where there is none."""
        if scale is None:
            return self._linear(o, lin)
        return self._gemm(quantize_bounded(o, scale, impl=self.kernels), lin)

    def _ffn_hidden(self, hq: tuple[torch.Tensor, torch.Tensor], blk: _Fp8Block) -> tuple[torch.Tensor, torch.Tensor]:
        """The FFN's hidden layer ``gelu_tanh(h W1^T + b1)`` as e4m3 + per-token scales."""
        if self.ffn_fused:
            try:
                return ffn_in_gelu_fp8(*hq, blk.ff1.w, blk.ff1.s, blk.ff1.b, *blk.ff1_stats,
                                       fast_accum=self.fast_accum, impl=self.kernels, config=self.ffn_config)
            except Exception as e:  # noqa: BLE001 - a kernel this GPU's Triton cannot build: the unfused path serves
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise
                _log.warning("fused FFN-in GEMM unavailable here (%s: %s); using the unfused FFN", type(e).__name__, e)
                self.ffn_fused = False
        y1 = self._gemm(hq, blk.ff1, bias=False)  # GEMM (no bias) -> bias + GELU + e4m3 in one pass
        if self.per_tensor:
            return self._quant(F.gelu(y1.float() + blk.ff1.b.float(), approximate="tanh"))
        return bias_gelu_quant(y1, blk.ff1.b, impl=self.kernels)

    def _kv_projection(self, ctx: torch.Tensor) -> torch.Tensor:
        return self._linear(ctx, self.kv)

    @torch.no_grad()
    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap: Tap = None,
                image: torch.Tensor | None = None):
        if image is not None:  # the FP8 cards are text-to-video: no image cross-attention to quantize
            raise ValueError("the FP8 fast path has no image conditioning")
        cfg, impl = self.cfg, self.kernels
        # the patch embedding reads the activation dtype
        stage, temb = self._stage(latents.to(self.dtype), timestep, text, None)
        if tap:
            tap("patch_embed", stage.x.clone())
            tap("temb", temb)
        x, mod, final, k_all, v_all, rope = stage.x, stage.mod, stage.final, stage.k_all, stage.v_all, stage.rope
        b, n, d = x.shape
        eps, heads, hd = cfg.eps, self.heads, self.head_dim

        hq = self._norm_fp8(x, None, None, mod[0, :, 1], mod[0, :, 0], modulate=True)
        hidden = None
        # cross-attention outputs are bounded by the text values' amax: [layers, B] scales
        cross_scales = (v_all.abs().amax(dim=(2, 3, 4)).float() * _OUT_SLACK).clamp_min(1e-12) / 448.0 \
            if self.attn_out_bounded else None
        for i, blk in enumerate(self.blocks):
            m = mod[i]
            qkv = self._gemm(hq, blk.qkv)
            if self.fp8_attention:
                v_scales = None
                if self.v_bounded:  # [B, H]: from the largest input scale of each sample
                    sa = hq[1].view(b, -1).amax(dim=1)
                    v_scales = (sa[:, None] * blk.v_bound[0] + blk.v_bound[1]).clamp_min(1e-12) / E4M3_MAX
                qkv8, scales = qkv_fp8(qkv, blk.qk_norm, blk.qk_scales, heads=heads, eps=eps, rope=rope, impl=impl,
                                       scales=self.attention_scales, split=self.qkv_split,
                                       rows=self.qkv_launch[0], warps=self.qkv_launch[1], kernel=self.qkv_kernel,
                                       v_scales=v_scales)
                o = attention_fp8(qkv8, scales, heads)
                o_scale = scales[2].amax(dim=1) * _OUT_SLACK if self.attn_out_bounded else None  # [B]
            else:
                o_scale = None
                qk = qk_norm_rope(qkv, blk.qk_norm, parts=2, eps=eps, heads=heads, rope=rope, impl=impl)
                o = attention(qk[..., :d].view(b, n, heads, hd), qk[..., d:].view(b, n, heads, hd),
                              qkv[..., 2 * d:].view(b, n, heads, hd), self.attention)
            y = self._attn_out(o.reshape(b, n, d), o_scale, blk.out)
            if blk.norm2_w is not None:
                hq = self._norm_fp8(x, y, m[:, 2], blk.norm2_w, blk.norm2_b, modulate=False)
            else:
                x.copy_((x.float() + y.float() * m[:, 2].unsqueeze(1)).to(x.dtype))
                hq = self._quant(x)
            q = qk_norm_rope(self._gemm(hq, blk.q2), blk.q2_norm, parts=1, eps=eps, heads=heads, impl=impl)
            o = attention(q.view(b, n, heads, hd), k_all[i], v_all[i], self.cross_attention)
            y = self._attn_out(o.reshape(b, n, d), None if cross_scales is None else cross_scales[i], blk.out2)
            hq = self._norm_fp8(x, y, None, m[:, 4], m[:, 3], modulate=True)
            y = self._gemm(self._ffn_hidden(hq, blk), blk.ff2)
            if i + 1 < len(self.blocks):
                hq = self._norm_fp8(x, y, m[:, 5], mod[i + 1, :, 1], mod[i + 1, :, 0], modulate=True)
            else:  # the head reads bf16
                hidden = add_norm(x, y, m[:, 5], final[:, 1], final[:, 0], modulate=True, eps=eps, impl=impl)
            if tap:
                tap(f"block.{i}", x.clone())

        return self._project_out(hidden, stage.grid, tap)
