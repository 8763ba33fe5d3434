"""Our Wan2.1 DiT: patch embedding, 3-D RoPE, self/cross attention with QK-norm,
time-conditioned modulation, FFN and head, in one small module.

The math follows the published Wan2.1 architecture (as diffusers' ``WanTransformer3DModel``
implements it), and the parameter names are those of the diffusers-format checkpoint, so the
key map in :mod:`fastvideo3.models.wan.checkpoint` is an explicit, checked identity table.
Where the reference keeps fp32 (norms, modulation, timestep embedding, RoPE tables) so do we.

The image-to-video layout (Wan2.1 I2V: ``image_dim`` and ``added_kv_proj_dim`` set) adds an image
embedder for the CLIP hidden states and, in every block's cross-attention, a second attention of
the same queries over the image tokens (their own K/V projections, K RMS-normed), summed with the
text attention before the output projection; the latent input then carries the conditioning
channels (noisy latent, 4-channel first-frame mask, image latent: ``in_channels`` 36).

``forward`` takes an optional ``tap(name, tensor)`` observer: the parity tooling records named
taps per block without the model knowing about it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fastvideo3.models.common import (DitConfigBase, FeedForward, Linear2, Tap, gelu_tanh, tapped,
                                      timestep_embedding)


@dataclass(frozen=True)
class WanDiTConfig(DitConfigBase):
    tuple_fields = ("patch_size",)

    patch_size: tuple[int, int, int] = (1, 2, 2)
    num_attention_heads: int = 12
    attention_head_dim: int = 128
    in_channels: int = 16
    out_channels: int = 16
    text_dim: int = 4096
    freq_dim: int = 256
    ffn_dim: int = 8960
    num_layers: int = 30
    cross_attn_norm: bool = True
    qk_norm: str | None = "rms_norm_across_heads"
    eps: float = 1e-6
    rope_max_seq_len: int = 1024
    #: the image encoder's hidden width (I2V) and the image K/V projections' input width; None for T2V
    image_dim: int | None = None
    added_kv_proj_dim: int | None = None

    @property
    def image_to_video(self) -> bool:
        return self.image_dim is not None


def _layer_norm_fp32(x: torch.Tensor, eps: float, weight=None, bias=None) -> torch.Tensor:
    w = weight.float() if weight is not None else None
    b = bias.float() if bias is not None else None
    return F.layer_norm(x.float(), (x.shape[-1],), w, b, eps)


def rope_tables(head_dim: int, max_len: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for the (t, h, w) split of one head, each [max_len, head_dim], fp32."""
    h_dim = w_dim = 2 * (head_dim // 6)
    t_dim = head_dim - h_dim - w_dim
    cos, sin = [], []
    pos = torch.arange(max_len)
    for d in (t_dim, h_dim, w_dim):
        freqs = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        ang = torch.outer(pos, freqs)
        cos.append(ang.cos().repeat_interleave(2, dim=1).float())
        sin.append(ang.sin().repeat_interleave(2, dim=1).float())
    return torch.cat(cos, dim=1), torch.cat(sin, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, L, H, D]; cos/sin: [1, L, 1, D] with each frequency repeated twice."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out.type_as(x)


class ConditionEmbedder(nn.Module):
    def __init__(self, cfg: WanDiTConfig):
        super().__init__()
        dim = cfg.inner_dim
        self.freq_dim = cfg.freq_dim
        self.time_embedder = Linear2(cfg.freq_dim, dim, dim, nn.SiLU())
        self.time_proj = nn.Linear(dim, dim * 6)
        self.text_embedder = Linear2(cfg.text_dim, dim, dim, nn.GELU(approximate="tanh"))
        self.image_embedder = ImageEmbedder(cfg.image_dim, dim) if cfg.image_dim is not None else None

    def forward(self, timestep: torch.Tensor, text: torch.Tensor):
        t = timestep_embedding(timestep, self.freq_dim).to(self.time_embedder.linear_1.weight.dtype)
        temb = self.time_embedder(t).type_as(text)
        return temb, self.time_proj(F.silu(temb)), self.text_embedder(text)

    def embed_image(self, image: torch.Tensor | None) -> torch.Tensor | None:
        """CLIP hidden states [B, T_img, image_dim] -> image context [B, T_img, D] (None: none)."""
        if image is None:
            return None
        if self.image_embedder is None:
            raise ValueError("this DiT has no image cross-attention (image_dim is unset)")
        return self.image_embedder(image)


class ImageEmbedder(nn.Module):
    """fp32 LayerNorm -> Linear -> GELU (erf) -> Linear -> fp32 LayerNorm, as the reference's
    image embedding (names match the checkpoint: norm1, ff.net.0.proj, ff.net.2, norm2)."""

    def __init__(self, image_dim: int, dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(image_dim, eps=1e-5)
        self.ff = FeedForward(image_dim, image_dim, F.gelu, out=dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = _layer_norm_fp32(x, self.norm1.eps, self.norm1.weight, self.norm1.bias).to(x.dtype)
        h = self.ff(h)
        return _layer_norm_fp32(h, self.norm2.eps, self.norm2.weight, self.norm2.bias).to(x.dtype)


class Attention(nn.Module):
    #: the attention hook: ``attend(q, k, v) -> o``, all ``[B, L, H, D]``. None runs SDPA here; a
    #: parallel plan sets it on the self-attention (fastvideo3.parallel) and nothing else changes.
    attend = None

    def __init__(self, dim: int, heads: int, eps: float, added_kv_dim: int | None = None):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        self.norm_q = nn.RMSNorm(dim, eps=eps)
        self.norm_k = nn.RMSNorm(dim, eps=eps)
        # the image tokens' K/V (I2V cross-attention only)
        self.add_k_proj = self.add_v_proj = self.norm_added_k = None
        if added_kv_dim is not None:
            self.add_k_proj = nn.Linear(added_kv_dim, dim)
            self.add_v_proj = nn.Linear(added_kv_dim, dim)
            self.norm_added_k = nn.RMSNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor, ctx: torch.Tensor | None = None, rope=None,
                img: torch.Tensor | None = None) -> torch.Tensor:
        src = x if ctx is None else ctx
        q = self.norm_q(self.to_q(x)).unflatten(2, (self.heads, -1))
        k = self.norm_k(self.to_k(src)).unflatten(2, (self.heads, -1))
        v = self.to_v(src).unflatten(2, (self.heads, -1))
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if self.attend is not None:
            o = self.attend(q, k, v).flatten(2, 3).type_as(q)
        else:
            o = _sdpa(q, k, v)
        if img is not None:  # a second softmax over the image tokens, summed (not one joint softmax)
            ki = self.norm_added_k(self.add_k_proj(img)).unflatten(2, (self.heads, -1))
            vi = self.add_v_proj(img).unflatten(2, (self.heads, -1))
            o = o + _sdpa(q, ki, vi)
        return self.to_out[0](o)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, L, H, D] attention -> [B, L, H*D] in q's dtype."""
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return o.transpose(1, 2).flatten(2, 3).type_as(q)


class _AffineNorm(nn.Module):
    """fp32 LayerNorm with affine parameters (the cross-attention norm)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _layer_norm_fp32(x, self.eps, self.weight, self.bias)


class Block(nn.Module):
    def __init__(self, cfg: WanDiTConfig):
        super().__init__()
        dim = cfg.inner_dim
        self.eps = cfg.eps
        self.attn1 = Attention(dim, cfg.num_attention_heads, cfg.eps)
        self.attn2 = Attention(dim, cfg.num_attention_heads, cfg.eps, cfg.added_kv_proj_dim)
        self.norm2 = _AffineNorm(dim, cfg.eps) if cfg.cross_attn_norm else None
        self.ffn = FeedForward(dim, cfg.ffn_dim, gelu_tanh)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 6, dim) / dim**0.5)

    def forward(self, x, text, temb6, rope, img=None):
        shift, scale, gate, c_shift, c_scale, c_gate = (self.scale_shift_table + temb6.float()).chunk(6, dim=1)
        h = (_layer_norm_fp32(x, self.eps) * (1 + scale) + shift).type_as(x)
        x = (x.float() + self.attn1(h, None, rope) * gate).type_as(x)
        h = (self.norm2(x) if self.norm2 is not None else x.float()).type_as(x)
        x = x + self.attn2(h, text, None, img)
        h = (_layer_norm_fp32(x, self.eps) * (1 + c_scale) + c_shift).type_as(x)
        return (x.float() + self.ffn(h).float() * c_gate).type_as(x)


class PatchEmbedding(nn.Conv3d):
    """The patch embedding: a Conv3d whose stride equals its kernel, i.e. one GEMM over each
    token's (C, pt, ph, pw) patch.

    On a CPU at bf16 it runs as that GEMM instead of the convolution: there PyTorch dispatches
    the convolution to oneDNN, whose AMX bf16 kernel (``brg_conv_fwd:avx10_1_512_amx``, oneDNN
    3.12 as shipped in torch 2.13) returns wrong values for strided shapes -- the tiny cards'
    (1, 4, 4) patch comes out at relative error ~0.75, and one-patch inputs (the sequence-parallel
    path's) are hit as well (pytorch/pytorch#169688). Its GEMM is correct. Everywhere else (fp32,
    fp16, CUDA) the convolution runs as before, so those results are unchanged. The parameter
    names and shapes are Conv3d's (the checkpoint's).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.device.type != "cpu" or x.dtype != torch.bfloat16 or x.dim() != 5
                or self.stride != self.kernel_size or self.padding != (0, 0, 0)
                or self.dilation != (1, 1, 1) or self.groups != 1):
            return super().forward(x)
        b, c, f, h, w = x.shape
        pt, ph, pw = self.kernel_size
        ff, hh, ww = f // pt, h // ph, w // pw
        x = x[:, :, :ff * pt, :hh * ph, :ww * pw]  # what the convolution reads (it drops a remainder)
        patches = x.reshape(b, c, ff, pt, hh, ph, ww, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
        y = F.linear(patches.reshape(b, ff * hh * ww, -1), self.weight.reshape(self.out_channels, -1), self.bias)
        return y.view(b, ff, hh, ww, -1).permute(0, 4, 1, 2, 3).contiguous()


class WanDiT(nn.Module):
    """Wan2.1 DiT. ``forward(latents [B,C,F,H,W], timestep [B], text [B,T,text_dim]) -> [B,C_out,F,H,W]``;
    an I2V DiT also takes ``image`` (CLIP hidden states [B, T_img, image_dim]), and its ``latents``
    are the noisy latent concatenated with the conditioning channels."""

    def __init__(self, cfg: WanDiTConfig):
        super().__init__()
        self.cfg = cfg
        dim = cfg.inner_dim
        self.patch_embedding = PatchEmbedding(cfg.in_channels, dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.condition_embedder = ConditionEmbedder(cfg)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.proj_out = nn.Linear(dim, cfg.out_channels * math.prod(cfg.patch_size))
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, dim) / dim**0.5)
        cos, sin = rope_tables(cfg.attention_head_dim, cfg.rope_max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def rope(self, f: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.cfg.attention_head_dim
        hw = 2 * (d // 6)
        splits = [d - 2 * hw, hw, hw]

        def grid(table: torch.Tensor) -> torch.Tensor:
            t, hh, ww = table.split(splits, dim=1)
            parts = [
                t[:f].view(f, 1, 1, -1).expand(f, h, w, -1),
                hh[:h].view(1, h, 1, -1).expand(f, h, w, -1),
                ww[:w].view(1, 1, w, -1).expand(f, h, w, -1),
            ]
            return torch.cat(parts, dim=-1).reshape(1, f * h * w, 1, -1)

        return grid(self.rope_cos), grid(self.rope_sin)

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap: Tap = None,
                image: torch.Tensor | None = None):
        stage = self.embed(latents, timestep, text, image)
        x = tapped(tap, "patch_embed", stage.x)
        tapped(tap, "temb", stage.temb)
        for i, block in enumerate(self.blocks):
            x = tapped(tap, f"block.{i}", block(x, stage.ctx, stage.temb6, stage.rope, stage.img))
        return tapped(tap, "output", self.head(stage, x))

    # -- the forward in stages (block-range interceptors run between them) ----------------
    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def embed(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
              image: torch.Tensor | None = None) -> "DitStage":
        """Patch embedding, condition embedding and RoPE: what every block range needs."""
        ff, hh, ww = latent_grid(self.cfg, latents)
        x = self.patch_embedding(latents).flatten(2).transpose(1, 2).contiguous()
        if self.cfg.image_to_video and image is None:
            raise ValueError("an image-to-video DiT needs the image's hidden states (image=)")
        temb, temb6, ctx = self.condition_embedder(timestep, text)
        return DitStage(x=x, ctx=ctx, temb=temb, temb6=temb6.unflatten(1, (6, -1)), rope=self.rope(ff, hh, ww),
                        grid=(ff, hh, ww), img=self.condition_embedder.embed_image(image))

    def run_blocks(self, stage: "DitStage", x: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Blocks ``[start, end)`` on the hidden states ``x`` of the stage's rows."""
        for block in self.blocks[start:end]:
            x = block(x, stage.ctx, stage.temb6, stage.rope, stage.img)
        return x

    def modulated_input(self, stage: "DitStage", x: torch.Tensor) -> torch.Tensor:
        """The first block's time-modulated, normed input (the step-reuse probe)."""
        blk = self.blocks[0]
        shift, scale = (blk.scale_shift_table + stage.temb6.float()).chunk(6, dim=1)[:2]
        return _layer_norm_fp32(x, blk.eps) * (1 + scale) + shift

    def head(self, stage: "DitStage", x: torch.Tensor) -> torch.Tensor:
        shift, scale = (self.scale_shift_table + stage.temb.unsqueeze(1)).chunk(2, dim=1)
        x = (_layer_norm_fp32(x, self.cfg.eps) * (1 + scale) + shift).type_as(x)
        return unpatchify(self.proj_out(x), stage.grid, self.cfg.patch_size)


def latent_grid(cfg: WanDiTConfig, latents: torch.Tensor) -> tuple[int, int, int]:
    """The token grid ``(F/pt, H/ph, W/pw)`` of ``latents [B, C, F, H, W]``; one past the RoPE tables is refused."""
    _, _, f, h, w = latents.shape
    pt, ph, pw = cfg.patch_size
    ff, hh, ww = f // pt, h // ph, w // pw
    if max(ff, hh, ww) > cfg.rope_max_seq_len:
        raise ValueError(f"latent grid {ff}x{hh}x{ww} exceeds rope_max_seq_len {cfg.rope_max_seq_len}")
    return ff, hh, ww


def unpatchify(x: torch.Tensor, grid: tuple[int, int, int], patch_size: tuple[int, int, int]) -> torch.Tensor:
    """The head's tokens ``[B, N, C*pt*ph*pw]`` back to latents ``[B, C, F, H, W]``."""
    ff, hh, ww = grid
    pt, ph, pw = patch_size
    x = x.reshape(x.shape[0], ff, hh, ww, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)


@dataclass
class DitStage:
    """One forward's block inputs: per-row tensors (``select`` keeps some rows) and shared RoPE."""

    x: torch.Tensor       # [B, N, D] hidden states entering block 0
    ctx: torch.Tensor     # [B, T, D] projected text
    temb: torch.Tensor    # [B, D]
    temb6: torch.Tensor   # [B, 6, D]
    rope: tuple[torch.Tensor, torch.Tensor]
    grid: tuple[int, int, int]
    img: torch.Tensor | None = None  # [B, T_img, D] projected image tokens (I2V), None for T2V

    def select(self, rows: torch.Tensor) -> "DitStage":
        return DitStage(self.x[rows], self.ctx[rows], self.temb[rows], self.temb6[rows], self.rope, self.grid,
                        None if self.img is None else self.img[rows])
