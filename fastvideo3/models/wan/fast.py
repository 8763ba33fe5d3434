"""The fast path of our Wan2.1 DiT: the same function as :class:`WanDiT`, fewer and fatter kernels.

:class:`FastWanDiT` wraps a loaded :class:`WanDiT` and runs its forward with

* one fused QKV projection per self-attention (weights concatenated once, at construction),
  and every block's cross-attention K/V computed by one GEMM over the text before the blocks;
* QK RMSNorm + 3-D RoPE in one kernel reading the fused projection (:func:`qk_norm_rope`);
* every residual update fused with the LayerNorm that follows it (:func:`add_norm`): gated
  residual + modulated norm, gated residual + affine cross-attention norm, and the FFN's gated
  residual + the *next* block's (or the head's) modulated norm;
* the FFN's bias + tanh-GELU in the GEMM epilogue (cuBLASLt) on CUDA;
* the patch embedding as one GEMM (its stride equals its kernel);
* attention through a chosen backend (:mod:`fastvideo3.kernels.attention`);
* on an I2V DiT, every block's image K/V computed by one GEMM over the image tokens before the
  blocks (like the text K/V), and each block's image attention added to its text attention.

Precision follows the reference: activations in the model dtype, fp32 for norms, modulation,
the timestep embedding and RoPE, with rounding at the same points. Nothing here keeps state
between calls: the RoPE angles are gathered per token from the model's small tables and the
text K/V are recomputed per forward, so the forward is capturable in a CUDA graph (no host
sync, no host-to-device copy) and one instance serves any request.

With ``share_weights`` the source model's Q/K/V (and cross K/V) weights are re-pointed to views
of the fused tensors, so the pair holds each weight once and the source model keeps working.
Build the fast model after the source model is on its device and in its dtype. A model whose
block Linears are FP8 (:mod:`fastvideo3.models.wan.fp8`) gets
:class:`~fastvideo3.models.wan.fast_fp8.Fp8FastWanDiT`, the same forward on the e4m3 path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fastvideo3.kernels import add_norm, attention, attention_available, qk_norm_rope, triton_available
from fastvideo3.kernels.fused import RopeGrid
from fastvideo3.models.wan.dit import Tap, WanDiT, latent_grid, unpatchify
from fastvideo3.models.wan.lora import cross_kv, self_attn_qkv

# The backends "auto" picks for bf16/fp16 on CUDA, in order of preference, from the H200
# measurements in bench/results/denoiser_h200.json (Wan shapes, TFLOP/s over two machines):
# self-attention over 32,760 tokens FA3 653-728 > SDPA's own choice (cuDNN there) 556-574 >
# flash 353-359; cross-attention over 512 text tokens SDPA 460-558 >= FA3 351-536. FA3 is used
# only where its optional wheel (fa3_fwd) imports; without it the fast path is SDPA throughout.
PREFERRED_SELF_ATTENTION = ("fa3", "sdpa")
PREFERRED_CROSS_ATTENTION = ("sdpa",)


@dataclass
class _Block:
    qkv_w: torch.Tensor
    qkv_b: torch.Tensor
    qk_norm: torch.Tensor  # [2, D]: norm_q, norm_k weights
    out_w: torch.Tensor
    out_b: torch.Tensor
    q2_w: torch.Tensor
    q2_b: torch.Tensor
    q2_norm: torch.Tensor  # [1, D]
    out2_w: torch.Tensor
    out2_b: torch.Tensor
    norm2_w: torch.Tensor | None
    norm2_b: torch.Tensor | None
    ff1_w: torch.Tensor
    ff1_b: torch.Tensor
    ff2_w: torch.Tensor
    ff2_b: torch.Tensor


def _fuse(linears: list[torch.nn.Linear], share: bool) -> tuple[torch.Tensor, torch.Tensor]:
    w = torch.cat([lin.weight.detach() for lin in linears])
    b = torch.cat([lin.bias.detach() for lin in linears])
    if share:
        row = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight.data, lin.bias.data = w[row:row + n], b[row:row + n]
            row += n
    return w, b


@functools.lru_cache(maxsize=None)
def _gelu_epilogue_is_tanh(device: str) -> bool:
    """True if ``torch._addmm_activation(..., use_gelu=True)`` computes the tanh GELU here (the
    cuBLASLt epilogue does; CPU builds compute the erf GELU). Probed once per device."""
    x = torch.linspace(-4, 4, 256, device=device, dtype=torch.float32).view(16, 16)
    eye, zero = torch.eye(16, device=device), torch.zeros(16, device=device)
    got = torch._addmm_activation(zero, x, eye, use_gelu=True)
    tanh, erf = F.gelu(x, approximate="tanh"), F.gelu(x)
    return bool((got - tanh).abs().max() < (got - erf).abs().max())


def default_attention(device: torch.device, dtype: torch.dtype, cross: bool = False) -> str:
    if device.type != "cuda" or dtype not in (torch.bfloat16, torch.float16):
        return "sdpa"
    preferred = PREFERRED_CROSS_ATTENTION if cross else PREFERRED_SELF_ATTENTION
    return next((b for b in preferred if attention_available(b, device)), "sdpa")


class FastWanDiT:
    """``forward(latents [B,C,F,H,W], timestep [B], text [B,T,text_dim], tap=None) -> [B,C,F,H,W]``,
    the same signature and function as :meth:`WanDiT.forward`.

    ``attention`` / ``cross_attention``: backend names (see :mod:`fastvideo3.kernels.attention`),
    ``"auto"`` for the measured default. ``kernels``: ``"triton"``, ``"torch"`` or ``"auto"``
    (Triton on CUDA, PyTorch elsewhere). ``gelu_epilogue``: fuse bias + GELU into the FFN's first
    GEMM where the library's epilogue is the tanh GELU the model uses.
    """

    def __new__(cls, dit: WanDiT, **kw):
        if cls is FastWanDiT:  # an FP8 model gets the FP8 forward (its weights are not Linear)
            from fastvideo3.models.wan.fp8 import is_fp8
            if is_fp8(dit):
                from fastvideo3.models.wan.fast_fp8 import Fp8FastWanDiT
                return super().__new__(Fp8FastWanDiT)
        return super().__new__(cls)

    def __init__(self, dit: WanDiT, *, attention: str = "auto", cross_attention: str | None = None,
                 kernels: str = "auto", gelu_epilogue: bool = True, share_weights: bool = True):
        cfg = dit.cfg
        self.base, self.cfg = dit, cfg
        ref = dit.proj_out.weight  # in the activation dtype at every precision (never FP8)
        self.device, self.dtype = ref.device, ref.dtype
        if kernels == "auto":
            kernels = "triton" if self.device.type == "cuda" and triton_available() else "torch"
        if kernels not in ("triton", "torch"):
            raise ValueError(f"kernels must be 'triton', 'torch' or 'auto', got {kernels!r}")
        self.kernels = kernels
        self.attention = default_attention(self.device, self.dtype) if attention == "auto" else attention
        cross = cross_attention or attention
        self.cross_attention = default_attention(self.device, self.dtype, cross=True) if cross == "auto" else cross
        self.gelu_epilogue = (gelu_epilogue and self.device.type == "cuda"
                              and _gelu_epilogue_is_tanh(str(self.device)))
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.attention_head_dim
        #: per-row LoRA deltas (an AdapterStore; fastvideo3.runtime.pool.adapters), None for none
        self.lora = None
        hw = 2 * (self.head_dim // 6)
        self.rope_split = (self.head_dim - 2 * hw, hw)
        with torch.no_grad():
            self._build(dit, share_weights)

    def _build(self, dit: WanDiT, share: bool) -> None:
        d = self.cfg.inner_dim
        self.patch_w = dit.patch_embedding.weight.detach().reshape(d, -1)
        self.patch_b = dit.patch_embedding.bias.detach()
        self.blocks: list[_Block] = []
        for blk in dit.blocks:
            a1, a2 = blk.attn1, blk.attn2
            qkv_w, qkv_b = _fuse([a1.to_q, a1.to_k, a1.to_v], share)
            self.blocks.append(_Block(
                qkv_w, qkv_b, torch.stack([a1.norm_q.weight.detach(), a1.norm_k.weight.detach()]),
                a1.to_out[0].weight.detach(), a1.to_out[0].bias.detach(),
                a2.to_q.weight.detach(), a2.to_q.bias.detach(), a2.norm_q.weight.detach().view(1, d),
                a2.to_out[0].weight.detach(), a2.to_out[0].bias.detach(),
                blk.norm2.weight.detach() if blk.norm2 is not None else None,
                blk.norm2.bias.detach() if blk.norm2 is not None else None,
                blk.ffn.net[0].proj.weight.detach(), blk.ffn.net[0].proj.bias.detach(),
                blk.ffn.net[2].weight.detach(), blk.ffn.net[2].bias.detach(),
            ))
        # every block's cross-attention K and V, interleaved per block: [k_0; v_0; k_1; v_1; ...]
        self.kv_w, self.kv_b = _fuse([lin for blk in dit.blocks for lin in (blk.attn2.to_k, blk.attn2.to_v)], share)
        self.k_norm = torch.stack([blk.attn2.norm_k.weight.detach().float() for blk in dit.blocks])
        self.ikv_w = self.ikv_b = self.ik_norm = None
        if self.cfg.image_to_video:  # the image tokens' K and V, interleaved per block like the text's
            self.ikv_w, self.ikv_b = _fuse([lin for blk in dit.blocks
                                            for lin in (blk.attn2.add_k_proj, blk.attn2.add_v_proj)], share)
            self.ik_norm = torch.stack([blk.attn2.norm_added_k.weight.detach().float() for blk in dit.blocks])
        self.mod_table = torch.stack([blk.scale_shift_table.detach().float() for blk in dit.blocks])  # [n,1,6,D]

    # -----------------------------------------------------------------------------------
    def __call__(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap: Tap = None,
                 image: torch.Tensor | None = None):
        return self.forward(latents, timestep, text, tap, image=image)

    @torch.no_grad()
    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap: Tap = None,
                image: torch.Tensor | None = None):
        lora, seg = self._adapters(latent_grid(self.cfg, latents))  # seg: the adapters inside the GEMMs
        stage, temb = self._stage(latents, timestep, text, image, seg=seg)
        if tap:
            tap("patch_embed", stage.x.clone())
            tap("temb", temb)
        # the fresh residual stream is updated in place; the last norm's output feeds the head
        _, hidden = self._blocks(stage, stage.x, 0, len(self.blocks), lora, tap, seg=seg)
        return self._project_out(hidden, stage.grid, tap)

    # -- the forward in stages (block-range interceptors run between them) ----------------
    # The same math as ``forward``; a range starts by norming its input again (the fused
    # residual+norm rounds the residual first, so the recomputed norm is the same value).
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @torch.no_grad()
    def embed(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
              image: torch.Tensor | None = None) -> "FastStage":
        _, seg = self._adapters(latent_grid(self.cfg, latents))
        return self._stage(latents, timestep, text, image, seg=seg)[0]

    @torch.no_grad()
    def run_blocks(self, stage: "FastStage", x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Blocks ``[start, end)`` of ``x``'s rows (the open adapter batch's rows, or its
        ``subset``); the residual stream is updated in place, so the caller's input is copied."""
        lora, seg = self._adapters(stage.grid)
        return self._blocks(stage, x.clone(), start, end, lora, seg=seg)[0]

    def _adapters(self, grid: tuple[int, int, int]):
        """``(lora, seg)`` for a forward at ``grid``: the store adding low-rank deltas, or the merged
        segments holding them (one of the two, or neither outside an adapter batch)."""
        lora = self.lora if self.lora is not None and self.lora.active else None
        if lora is None or not hasattr(lora, "segments"):
            return lora, None
        seg = lora.segments(self, grid[0] * grid[1] * grid[2])
        return (None, seg) if seg is not None else (lora, None)

    @torch.no_grad()
    def modulated_input(self, stage: "FastStage", x: torch.Tensor) -> torch.Tensor:
        m = stage.mod[0]
        return F.layer_norm(x.float(), (x.shape[-1],), eps=self.cfg.eps) * (1 + m[:, 1].unsqueeze(1)) + m[:, 0].unsqueeze(1)

    @torch.no_grad()
    def head(self, stage: "FastStage", x: torch.Tensor) -> torch.Tensor:
        hidden = add_norm(x, None, None, stage.final[:, 1], stage.final[:, 0], modulate=True, eps=self.cfg.eps,
                          impl=self.kernels)
        return self._project_out(hidden, stage.grid)

    # -- the pieces both the forward and its stages run ---------------------------------
    def _stage(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
               image: torch.Tensor | None, seg=None) -> tuple["FastStage", torch.Tensor]:
        """The block inputs of one forward, and ``temb`` (the forward taps it)."""
        dit, cfg = self.base, self.cfg
        b, c = latents.shape[:2]
        ff, hh, ww = latent_grid(cfg, latents)
        pt, ph, pw = cfg.patch_size
        n, d = ff * hh * ww, cfg.inner_dim
        patches = latents.reshape(b, c, ff, pt, hh, ph, ww, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        x = F.linear(patches.reshape(b, n, -1), self.patch_w, self.patch_b)
        temb, temb6, ctx = dit.condition_embedder(timestep, text)
        mod = self.mod_table + temb6.float().view(1, b, 6, d)  # [layers, B, 6, D]: shift, scale, gate, c_*
        final = dit.scale_shift_table.float() + temb.float().unsqueeze(1)  # [B, 2, D]: shift, scale
        k_all, v_all = self._cross_kv(ctx, seg)
        rope = RopeGrid(dit.rope_cos, dit.rope_sin, (ff, hh, ww), *self.rope_split)
        return FastStage(x, mod, final, k_all, v_all, rope, (ff, hh, ww), *self._image_kv(image)), temb

    def _blocks(self, stage: "FastStage", x: torch.Tensor, start: int, end: int, lora=None,
                tap: Tap = None, seg=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks ``[start, end)`` on the residual stream ``x`` (updated in place): ``(x, hidden)``,
        ``hidden`` the last block's fused norm (the next block's input, or the head's). ``lora``: an
        AdapterStore adding per-row low-rank deltas; ``seg``: a SegmentPlan whose merged weights
        hold them instead (its GEMMs per segment of rows)."""
        impl, eps, d = self.kernels, self.cfg.eps, self.cfg.inner_dim
        heads, hd = self.heads, self.head_dim
        b, n, _ = x.shape
        mod, final = stage.mod, stage.final
        hidden = add_norm(x, None, None, mod[start, :, 1], mod[start, :, 0], modulate=True, eps=eps, impl=impl)
        for i in range(start, end):
            blk, m = self.blocks[i], mod[i]
            # self-attention: fused QKV, QK-norm + RoPE, attention on strided views
            qkv = self._lin(seg, f"blocks.{i}.attn1.qkv", hidden, blk.qkv_w, blk.qkv_b)
            if lora:
                lora.delta_group_(f"blocks.{i}.attn1.qkv", self_attn_qkv(i), hidden, qkv)
            qk = qk_norm_rope(qkv, blk.qk_norm, parts=2, eps=eps, heads=heads, rope=stage.rope, impl=impl)
            o = attention(qk[..., :d].view(b, n, heads, hd), qk[..., d:].view(b, n, heads, hd),
                          qkv[..., 2 * d:].view(b, n, heads, hd), self.attention)
            # the LoRA delta of a layer feeding a residual + norm goes into that pass (delta_add_norm)
            y = self._lin(seg, f"blocks.{i}.attn1.to_out.0", o.reshape(b, n, d), blk.out_w, blk.out_b)
            # gated residual + the cross-attention norm
            if lora and blk.norm2_w is not None:
                hidden = lora.delta_add_norm(f"blocks.{i}.attn1.to_out.0", o.reshape(b, n, d), y, x, m[:, 2],
                                             blk.norm2_w, blk.norm2_b, modulate=False, eps=eps, norm_impl=impl,
                                             next=f"blocks.{i}.attn2.to_q")
            elif blk.norm2_w is not None:
                hidden = add_norm(x, y, m[:, 2], blk.norm2_w, blk.norm2_b, modulate=False, eps=eps, impl=impl)
            else:
                if lora:
                    lora.delta_(f"blocks.{i}.attn1.to_out.0", o.reshape(b, n, d), y)
                x.copy_((x.float() + y.float() * m[:, 2].unsqueeze(1)).to(x.dtype))
                hidden = x.clone()
            # cross-attention on the precomputed text K/V
            if lora:
                q = lora.linear(f"blocks.{i}.attn2.to_q", hidden, blk.q2_w, blk.q2_b)
            else:
                q = self._lin(seg, f"blocks.{i}.attn2.to_q", hidden, blk.q2_w, blk.q2_b)
            q = qk_norm_rope(q, blk.q2_norm, parts=1, eps=eps, heads=heads, impl=impl)
            o = attention(q.view(b, n, heads, hd), stage.k_all[i], stage.v_all[i], self.cross_attention)
            if stage.ki_all is not None:
                o = o + attention(q.view(b, n, heads, hd), stage.ki_all[i], stage.vi_all[i], self.cross_attention)
            y = self._lin(seg, f"blocks.{i}.attn2.to_out.0", o.reshape(b, n, d), blk.out2_w, blk.out2_b)
            if lora:
                hidden = lora.delta_add_norm(f"blocks.{i}.attn2.to_out.0", o.reshape(b, n, d), y, x, None, m[:, 4],
                                             m[:, 3], modulate=True, eps=eps, norm_impl=impl,
                                             next=f"blocks.{i}.ffn.net.0.proj")
            else:
                hidden = add_norm(x, y, None, m[:, 4], m[:, 3], modulate=True, eps=eps, impl=impl)
            # FFN; its gated residual is fused with the next norm (the next block's, or the head's)
            if lora:  # the delta goes in before the GELU: inside the widened GEMM (its GELU epilogue
                # kept), or in the LoRA pass, which then applies the GELU
                f1 = lora.linear(f"blocks.{i}.ffn.net.0.proj", hidden, blk.ff1_w, blk.ff1_b, gemm=self._gelu_linear,
                                 act="gelu_tanh")
                y = F.linear(f1, blk.ff2_w, blk.ff2_b)
            elif seg is not None:
                f1 = seg.linear(f"blocks.{i}.ffn.net.0.proj", hidden, blk.ff1_w, blk.ff1_b,
                                gelu="epilogue" if self.gelu_epilogue else "tanh")
                y = seg.linear(f"blocks.{i}.ffn.net.2", f1, blk.ff2_w, blk.ff2_b)
            else:
                y = F.linear(self._gelu_linear(hidden, blk.ff1_w, blk.ff1_b), blk.ff2_w, blk.ff2_b)
            scale, shift = (mod[i + 1, :, 1], mod[i + 1, :, 0]) if i + 1 < len(self.blocks) else (
                final[:, 1], final[:, 0])
            if lora:
                hidden = lora.delta_add_norm(f"blocks.{i}.ffn.net.2", f1, y, x, m[:, 5], scale, shift, modulate=True,
                                             eps=eps, norm_impl=impl,
                                             next=f"blocks.{i + 1}.attn1.qkv" if i + 1 < len(self.blocks) else None)
            else:
                hidden = add_norm(x, y, m[:, 5], scale, shift, modulate=True, eps=eps, impl=impl)
            if tap:
                tap(f"block.{i}", x.clone())
        return x, hidden

    def _project_out(self, hidden: torch.Tensor, grid: tuple[int, int, int], tap: Tap = None) -> torch.Tensor:
        """The head's projection of the final norm's output, unpatchified to latents."""
        out = unpatchify(F.linear(hidden, self.base.proj_out.weight, self.base.proj_out.bias), grid,
                         self.cfg.patch_size)
        if tap:
            tap("output", out)
        return out

    def _cross_kv(self, ctx: torch.Tensor, seg=None) -> tuple[torch.Tensor, torch.Tensor]:
        """Every block's normed cross-attention K and its V: two [layers, B, T, H, head_dim] tensors."""
        b, t, d = ctx.shape
        layers = len(self.blocks)
        if seg is not None:
            kv = seg.linear("cross_kv", ctx, self.kv_w, self.kv_b).view(b, t, layers, 2, d)
            return self._split_kv(kv, self.k_norm, ctx.dtype)
        kv = self._kv_projection(ctx).view(b, t, layers, 2, d)
        if self.lora is not None and self.lora.active:
            self.lora.delta_group_("cross_kv", cross_kv(layers), ctx, kv.view(b, t, layers * 2 * d))
        return self._split_kv(kv, self.k_norm, ctx.dtype)

    def _image_kv(self, image: torch.Tensor | None):
        """Every block's normed image K and its V ([layers, B, T_img, H, head_dim] each), or
        (None, None) without an image; an I2V DiT refuses to run without one."""
        if self.ikv_w is None:
            if image is not None:
                raise ValueError("this DiT has no image cross-attention (image_dim is unset)")
            return None, None
        if image is None:
            raise ValueError("an image-to-video DiT needs the image's hidden states (image=)")
        ctx = self.base.condition_embedder.embed_image(image.to(self.dtype))
        b, t, d = ctx.shape
        layers = len(self.blocks)
        kv = F.linear(ctx, self.ikv_w, self.ikv_b).view(b, t, layers, 2, d)
        return self._split_kv(kv, self.ik_norm, ctx.dtype)

    def _split_kv(self, kv: torch.Tensor, k_norm: torch.Tensor, dtype: torch.dtype):
        """``kv [B, T, layers, 2, D]`` -> every block's RMS-normed K and its V, [layers, B, T, H, head_dim] each."""
        b, t, layers, _, d = kv.shape
        k = F.rms_norm(kv[:, :, :, 0].float(), (d,), eps=self.cfg.eps) * k_norm
        k = k.to(dtype).permute(2, 0, 1, 3).contiguous().view(layers, b, t, self.heads, self.head_dim)
        v = kv[:, :, :, 1].permute(2, 0, 1, 3).contiguous().view(layers, b, t, self.heads, self.head_dim)
        return k, v

    def _kv_projection(self, ctx: torch.Tensor) -> torch.Tensor:
        return F.linear(ctx, self.kv_w, self.kv_b)

    @staticmethod
    def _lin(seg, unit: str, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """An adapted GEMM: per merged segment under ``seg``, else ``F.linear``."""
        return F.linear(x, w, b) if seg is None else seg.linear(unit, x, w, b)

    def lora_units(self) -> dict[str, tuple[torch.Tensor, list[tuple[str, int]]]]:
        """The adapted GEMMs as merged segments see them: unit -> (its weight ``[out, in]``, the
        adapted layers in it with their first output row): each block's fused QKV, O, cross Q, cross
        O, FFN in and out, and every block's cross K/V as one (built once: the weights are fixed)."""
        if getattr(self, "_units", None) is None:
            d, units = self.cfg.inner_dim, {}
            for i, blk in enumerate(self.blocks):
                units[f"blocks.{i}.attn1.qkv"] = (blk.qkv_w, [(m, j * d) for j, m in enumerate(self_attn_qkv(i))])
                for name, w in (("attn1.to_out.0", blk.out_w), ("attn2.to_q", blk.q2_w),
                                ("attn2.to_out.0", blk.out2_w), ("ffn.net.0.proj", blk.ff1_w),
                                ("ffn.net.2", blk.ff2_w)):
                    units[f"blocks.{i}.{name}"] = (w, [(f"blocks.{i}.{name}", 0)])
            units["cross_kv"] = (self.kv_w, [(m, j * d) for j, m in enumerate(cross_kv(len(self.blocks)))])
            self._units = units
        return self._units

    def _gelu_linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.gelu_epilogue:
            return torch._addmm_activation(b, x.reshape(-1, x.shape[-1]), w.t(), use_gelu=True).view(
                *x.shape[:-1], w.shape[0])
        return F.gelu(F.linear(x, w, b), approximate="tanh")



@dataclass
class FastStage:
    """One forward's block inputs on the fast path; ``select`` keeps some rows."""

    x: torch.Tensor       # [B, N, D]
    mod: torch.Tensor     # [layers, B, 6, D]
    final: torch.Tensor   # [B, 2, D]
    k_all: torch.Tensor   # [layers, B, T, H, hd]
    v_all: torch.Tensor
    rope: RopeGrid
    grid: tuple[int, int, int]
    ki_all: torch.Tensor | None = None  # [layers, B, T_img, H, hd] on an I2V DiT
    vi_all: torch.Tensor | None = None

    def select(self, rows: torch.Tensor) -> "FastStage":
        img = (None, None) if self.ki_all is None else (self.ki_all[:, rows], self.vi_all[:, rows])
        return FastStage(self.x[rows], self.mod[:, rows], self.final[rows], self.k_all[:, rows],
                         self.v_all[:, rows], self.rope, self.grid, *img)
