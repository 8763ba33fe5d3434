"""Our HunyuanVideo-1.5 DiT: patch embedding, the Qwen token refiner, the ByT5 projection,
dual-stream blocks with joint video/text attention (QK RMSNorm, 3-D RoPE on the video stream),
time-conditioned modulation and the head, in one module.

The math follows the published HunyuanVideo-1.5 architecture as diffusers'
``HunyuanVideo15Transformer3DModel`` implements it, served as text-to-video: the image stream of
that class is masked out for a text-to-video request (its tokens are all padding), so it is never
computed here, and the conditioning latent and mask channels are zeros. The parameter names are
those of the diffusers-format checkpoint, so the key map in
:mod:`fastvideo3.models.hunyuan15.checkpoint` is an explicit, checked identity table.

Padding tokens never enter an attention here: each row's valid text tokens are moved to the front
(in the reference's order: valid ByT5, then valid Qwen) and each row attends over its own valid
length only, where the reference runs every token under a boolean mask. For valid tokens the two
are the same function; the video stream, the only output, depends on nothing else.

Text conditioning arrives packed in one tensor (what the encoder pool publishes per prompt, see
:func:`pack_text`): ``[B, text_len + text_len_2, max(text dims) + 1]``, the Qwen rows first, then
the ByT5 rows, each embedding in the leading channels and its attention mask in the last channel.

``forward`` takes an optional ``tap(name, tensor)`` observer, as the Wan DiT does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from fastvideo3.models.common import (DitConfigBase, FeedForward, Linear2, Tap, gelu_tanh, tapped,
                                      timestep_embedding)
from fastvideo3.vocab import Program


@dataclass(frozen=True)
class HunyuanDiTConfig(DitConfigBase):
    tuple_fields = ("rope_axes_dim",)

    in_channels: int = 65
    out_channels: int = 32
    num_attention_heads: int = 16
    attention_head_dim: int = 128
    num_layers: int = 54
    num_refiner_layers: int = 2
    mlp_ratio: float = 4.0
    patch_size: int = 1
    patch_size_t: int = 1
    qk_norm: str = "rms_norm"
    text_embed_dim: int = 3584
    text_embed_2_dim: int = 1472
    image_embed_dim: int = 1152
    rope_theta: float = 256.0
    rope_axes_dim: tuple[int, int, int] = (16, 56, 56)
    target_size: int = 640
    task_type: str = str(Program.T2V)  # diffusers' text-to-video task_type
    use_meanflow: bool = False
    #: rows of each encoder in the packed text conditioning (the pipeline's tokenizer lengths)
    text_len: int = 1000
    text_len_2: int = 256

    @property
    def ffn_dim(self) -> int:
        return int(self.inner_dim * self.mlp_ratio)

    @property
    def text_dim(self) -> int:
        """Channels of the packed text conditioning: the wider encoder's, plus the mask."""
        return max(self.text_embed_dim, self.text_embed_2_dim) + 1

    @property
    def packed_text_len(self) -> int:
        return self.text_len + self.text_len_2

    @property
    def num_blocks(self) -> int:
        return self.num_layers

    @property
    def image_to_video(self) -> bool:
        """Whether rows carry image conditioning (the pools ask): this DiT serves text-to-video only."""
        return False


def pack_text(embeds: torch.Tensor, mask: torch.Tensor, embeds_2: torch.Tensor, mask_2: torch.Tensor,
              width: int) -> torch.Tensor:
    """The packed conditioning ``[B, L1 + L2, width]`` of the two encoders' outputs and masks."""
    b, l1, d1 = embeds.shape
    l2, d2 = embeds_2.shape[1], embeds_2.shape[2]
    out = embeds.new_zeros(b, l1 + l2, width)
    out[:, :l1, :d1] = embeds
    out[:, l1:, :d2] = embeds_2.to(out.dtype)
    out[:, :l1, -1] = mask.to(out.dtype)
    out[:, l1:, -1] = mask_2.to(out.dtype)
    return out


def unpack_text(text: torch.Tensor, cfg: HunyuanDiTConfig):
    """(qwen [B, L1, D1], mask [B, L1] bool, byt5 [B, L2, D2], mask_2 [B, L2] bool)."""
    l1 = cfg.text_len
    mask = text[:, :l1, -1] > 0.5
    mask_2 = text[:, l1:, -1] > 0.5
    return text[:, :l1, : cfg.text_embed_dim], mask, text[:, l1:, : cfg.text_embed_2_dim], mask_2


def valid_first(x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Each row's valid tokens moved to the front (their order kept), trimmed to the longest row:
    ``(x [B, n, D], mask [B, n], valid counts)``."""
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    counts = mask.sum(dim=1).tolist()
    n = max(max(counts), 1)
    order = order[:, :n]
    x = torch.gather(x, 1, order.unsqueeze(-1).expand(-1, -1, x.shape[-1]))
    return x, torch.gather(mask, 1, order), [int(c) for c in counts]


def rope_grid(cfg: HunyuanDiTConfig, f: int, h: int, w: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[1, f*h*w, 1, head_dim]`` for the (t, h, w) token grid, each frequency twice, fp32."""
    cos, sin = [], []
    axes = torch.meshgrid(*[torch.arange(n, device=device, dtype=torch.float32) for n in (f, h, w)], indexing="ij")
    for dim, pos in zip(cfg.rope_axes_dim, axes):
        exps = torch.arange(0, dim, 2, device=device, dtype=torch.float64)[: dim // 2] / dim
        freqs = 1.0 / (cfg.rope_theta ** exps)
        ang = torch.outer(pos.reshape(-1).double(), freqs)
        cos.append(ang.cos().float().repeat_interleave(2, dim=1))
        sin.append(ang.sin().float().repeat_interleave(2, dim=1))
    return torch.cat(cos, dim=1)[None, :, None], torch.cat(sin, dim=1)[None, :, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, L, H, D] (interleaved pairs), cos/sin: [1, L, 1, D]."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    rotated = torch.stack([-x2, x1], dim=-1).flatten(-2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: list[int], attend=None) -> torch.Tensor:
    """Softmax attention per row over its first ``keys[i]`` keys; q/k/v ``[B, L, H, D]``. One
    call when every row uses all its keys. ``attend(q, k, v)`` is the kernel (SDPA by default)."""
    run = attend or _sdpa
    if all(n == k.shape[1] for n in keys):
        return run(q, k, v)
    return torch.cat([run(q[i : i + 1], k[i : i + 1, :n], v[i : i + 1, :n]) for i, n in enumerate(keys)])


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


class RefinerAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.to_q, self.to_k, self.to_v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])

    def forward(self, x: torch.Tensor, keys: list[int], attend=None) -> torch.Tensor:
        q, k, v = (p(x).unflatten(2, (self.heads, -1)) for p in (self.to_q, self.to_k, self.to_v))
        return self.to_out[0](attend_rows(q, k, v, keys, attend).flatten(2, 3).type_as(x))


class RefinerBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = RefinerAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.ff = FeedForward(dim, 4 * dim, F.silu)
        self.norm_out = nn.Module()
        self.norm_out.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x: torch.Tensor, temb: torch.Tensor, keys: list[int], attend=None) -> torch.Tensor:
        gate_msa, gate_mlp = self.norm_out.linear(F.silu(temb)).unsqueeze(1).chunk(2, dim=-1)
        x = x + self.attn(self.norm1(x), keys, attend) * gate_msa
        return x + self.ff(self.norm2(x)) * gate_mlp


class TokenRefiner(nn.Module):
    """The Qwen stream's refiner: timestep + pooled-text conditioning, then self-attention blocks."""

    def __init__(self, cfg: HunyuanDiTConfig):
        super().__init__()
        d = cfg.inner_dim
        self.time_text_embed = nn.Module()
        self.time_text_embed.timestep_embedder = Linear2(256, d, d, nn.SiLU())
        self.time_text_embed.text_embedder = Linear2(cfg.text_embed_dim, d, d, nn.SiLU())
        self.proj_in = nn.Linear(cfg.text_embed_dim, d)
        self.token_refiner = nn.Module()
        self.token_refiner.refiner_blocks = nn.ModuleList(
            [RefinerBlock(d, cfg.num_attention_heads) for _ in range(cfg.num_refiner_layers)])

    def forward(self, x: torch.Tensor, mask: torch.Tensor, keys: list[int], timestep: torch.Tensor,
                attend=None) -> torch.Tensor:
        m = mask.float().unsqueeze(-1)
        pooled = ((x * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)).to(x.dtype)
        tproj = timestep_embedding(timestep).to(x.dtype)
        temb = self.time_text_embed.timestep_embedder(tproj) + self.time_text_embed.text_embedder(pooled)
        h = self.proj_in(x)
        for block in self.token_refiner.refiner_blocks:
            h = block(h, temb, keys, attend)
        return h


class ByT5Projection(nn.Module):
    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.norm = nn.LayerNorm(d_in)
        self.linear_1, self.linear_2 = nn.Linear(d_in, 2048), nn.Linear(2048, 2048)
        self.linear_3 = nn.Linear(2048, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_3(F.gelu(self.linear_2(F.gelu(self.linear_1(self.norm(x))))))


class ImageProjection(nn.Module):
    """Held for the checkpoint's keys; a text-to-video request has no image tokens to project."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.norm_in = nn.LayerNorm(d_in)
        self.linear_1, self.linear_2 = nn.Linear(d_in, d_in), nn.Linear(d_in, d_out)
        self.norm_out = nn.LayerNorm(d_out)


class JointAttention(nn.Module):
    #: the attention kernel ``attend(q, k, v) -> o`` on ``[B, L, H, D]``; None: SDPA
    attend = None

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        hd = dim // heads
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"):
            setattr(self, name, nn.Linear(dim, dim))
        self.to_out = nn.ModuleList([nn.Linear(dim, dim)])
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            setattr(self, name, nn.RMSNorm(hd, eps=1e-6))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor, rope, keys: list[int]):
        n = x.shape[1]
        q = apply_rope(self.norm_q(self.to_q(x).unflatten(2, (self.heads, -1))), *rope)
        k = apply_rope(self.norm_k(self.to_k(x).unflatten(2, (self.heads, -1))), *rope)
        v = self.to_v(x).unflatten(2, (self.heads, -1))
        cq = self.norm_added_q(self.add_q_proj(ctx).unflatten(2, (self.heads, -1)))
        ck = self.norm_added_k(self.add_k_proj(ctx).unflatten(2, (self.heads, -1)))
        cv = self.add_v_proj(ctx).unflatten(2, (self.heads, -1))
        o = attend_rows(torch.cat([q, cq], 1), torch.cat([k, ck], 1), torch.cat([v, cv], 1),
                        [n + c for c in keys], self.attend).flatten(2, 3).type_as(x)
        return self.to_out[0](o[:, :n]), self.to_add_out(o[:, n:])


def _ada(linear: nn.Linear, temb: torch.Tensor) -> list[torch.Tensor]:
    return [t.unsqueeze(1) for t in linear(F.silu(temb)).chunk(6, dim=1)]


def _norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6)


class Block(nn.Module):
    def __init__(self, cfg: HunyuanDiTConfig):
        super().__init__()
        d = cfg.inner_dim
        self.norm1, self.norm1_context = nn.Module(), nn.Module()
        self.norm1.linear, self.norm1_context.linear = nn.Linear(d, 6 * d), nn.Linear(d, 6 * d)
        self.attn = JointAttention(d, cfg.num_attention_heads)
        self.ff = FeedForward(d, cfg.ffn_dim, gelu_tanh)
        self.ff_context = FeedForward(d, cfg.ffn_dim, gelu_tanh)

    def forward(self, x, ctx, temb, rope, keys):
        shift, scale, gate, m_shift, m_scale, m_gate = _ada(self.norm1.linear, temb)
        c_shift, c_scale, c_gate, cm_shift, cm_scale, cm_gate = _ada(self.norm1_context.linear, temb)
        a, ca = self.attn(_norm(x) * (1 + scale) + shift, _norm(ctx) * (1 + c_scale) + c_shift, rope, keys)
        x = x + a * gate
        ctx = ctx + ca * c_gate
        x = x + m_gate * self.ff(_norm(x) * (1 + m_scale) + m_shift)
        ctx = ctx + cm_gate * self.ff_context(_norm(ctx) * (1 + cm_scale) + cm_shift)
        return x, ctx


@dataclass
class DitStage:
    """One forward's block inputs."""

    x: torch.Tensor        # [B, N, D] video tokens entering block 0
    ctx: torch.Tensor      # [B, T, D] text tokens (valid first), T = the longest row's
    keys: list[int]        # valid text tokens per row
    temb: torch.Tensor     # [B, D]
    rope: tuple[torch.Tensor, torch.Tensor]
    grid: tuple[int, int, int]


class HunyuanDiT(nn.Module):
    """HunyuanVideo-1.5 DiT, text-to-video. ``forward(latents [B,C,F,H,W], timestep [B],
    text [B, L1+L2, text_dim] packed) -> [B,C,F,H,W]``."""

    def __init__(self, cfg: HunyuanDiTConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.inner_dim
        p = (cfg.patch_size_t, cfg.patch_size, cfg.patch_size)
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Conv3d(cfg.in_channels, d, kernel_size=p, stride=p)
        self.image_embedder = ImageProjection(cfg.image_embed_dim, d)
        self.context_embedder = TokenRefiner(cfg)
        self.context_embedder_2 = ByT5Projection(cfg.text_embed_2_dim, d)
        self.time_embed = nn.Module()
        self.time_embed.timestep_embedder = Linear2(256, d, d, nn.SiLU())
        self.cond_type_embed = nn.Embedding(3, d)
        self.transformer_blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.norm_out = nn.Module()
        self.norm_out.linear = nn.Linear(d, 2 * d)
        self.proj_out = nn.Linear(d, math.prod(p) * cfg.out_channels)

    @property
    def num_blocks(self) -> int:
        return len(self.transformer_blocks)

    def forward(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor, tap: Tap = None):
        stage = self.embed(latents, timestep, text)
        x = tapped(tap, "patch_embed", stage.x)
        tapped(tap, "temb", stage.temb)
        ctx = tapped(tap, "context", stage.ctx)
        for i, block in enumerate(self.transformer_blocks):
            x, ctx = block(x, ctx, stage.temb, stage.rope, stage.keys)
            tapped(tap, f"block.{i}", x)
        return tapped(tap, "output", self.head(stage, x))

    def embed(self, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor) -> DitStage:
        cfg = self.cfg
        b, c, f, h, w = latents.shape
        dtype = self.proj_out.weight.dtype
        if c != cfg.out_channels:
            raise ValueError(f"latents have {c} channels; the DiT denoises {cfg.out_channels}")
        if text.shape[1] != cfg.packed_text_len or text.shape[2] != cfg.text_dim:
            raise ValueError(f"text conditioning is {list(text.shape[1:])}, the DiT expects "
                             f"[{cfg.packed_text_len}, {cfg.text_dim}] (packed Qwen + ByT5 rows and masks)")
        # text-to-video: the conditioning latent and its mask channel are zeros
        x = torch.cat([latents.to(dtype), latents.new_zeros(b, cfg.in_channels - c, f, h, w, dtype=dtype)], dim=1)
        t = timestep.to(dtype)  # the reference casts the step's timestep to the model dtype
        temb = self.time_embed.timestep_embedder(timestep_embedding(t).to(dtype))
        x = self.x_embedder.proj(x).flatten(2).transpose(1, 2)
        qwen, mask, byt5, mask_2 = unpack_text(text.to(dtype), cfg)
        qwen, mask, keys_1 = valid_first(qwen, mask)
        q_ctx = self.context_embedder(qwen, mask, keys_1, t, self.transformer_blocks[0].attn.attend)
        q_ctx = q_ctx + self.cond_type_embed.weight[0]
        byt5, mask_2, _ = valid_first(byt5, mask_2)  # padding rows are never projected
        b_ctx = self.context_embedder_2(byt5) + self.cond_type_embed.weight[1]
        # the reference's token order: valid ByT5, then valid Qwen (then padding, dropped)
        ctx, cmask, keys = valid_first(torch.cat([b_ctx, q_ctx], 1), torch.cat([mask_2, mask], 1))
        ff, hh, ww = f // cfg.patch_size_t, h // cfg.patch_size, w // cfg.patch_size
        return DitStage(x=x, ctx=ctx, keys=keys, temb=temb, rope=rope_grid(cfg, ff, hh, ww, x.device),
                        grid=(ff, hh, ww))

    def head(self, stage: DitStage, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        b = x.shape[0]
        ff, hh, ww = stage.grid
        scale, shift = self.norm_out.linear(F.silu(stage.temb).to(x.dtype)).chunk(2, dim=1)
        x = _norm(x) * (1 + scale)[:, None] + shift[:, None]
        x = self.proj_out(x)
        pt, p = cfg.patch_size_t, cfg.patch_size
        x = x.reshape(b, ff, hh, ww, -1, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return x.flatten(6, 7).flatten(4, 5).flatten(2, 3)
