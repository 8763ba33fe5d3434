"""The DiT forward on one rank's shard: tokens in, tokens out, the model's own modules throughout.

Sequence-parallel state lives in **token layout**: a latent ``[B, C, F, H, W]`` is cut into
patches, one token per patch, each token's values ordered ``(pt, ph, pw, C)`` (the order the
DiT's output projection writes), so the model's prediction comes out in the same layout as the
latent that went in and the sampler's elementwise update runs on a shard with no gather. A
rank holds the contiguous shard ``sp_index`` of the padded sequence (:mod:`.plan`).

:class:`ShardedDiT` runs :class:`~fastvideo3.models.wan.dit.WanDiT`'s modules on that shard:
the patch embedding per token, RoPE tables and the
per-token modulation on the local tokens only, and the plan's attention installed through the
one hook the model has (``Attention.attend``) for the duration of a call. Cross-attention needs
no communication (every rank holds the whole text). With a CFG degree the batch rows are dealt
round-robin over the CFG group (cond on one rank, uncond on the other) and the predictions are
all-gathered back into row order.
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F

from fastvideo3.models.wan.dit import WanDiT, _layer_norm_fp32
from fastvideo3.parallel.attention import SequenceParallelAttention
from fastvideo3.parallel.mesh import Mesh


def grid_of(latent_shape, patch) -> tuple[int, int, int]:
    _, f, h, w = latent_shape
    pt, ph, pw = patch
    if f % pt or h % ph or w % pw:
        raise ValueError(f"latent {tuple(latent_shape)} does not divide by the patch {tuple(patch)}")
    return f // pt, h // ph, w // pw


def to_tokens(latent: torch.Tensor, patch) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, N, pt*ph*pw*C] (token values ordered pt, ph, pw, C)."""
    b, c, f, h, w = latent.shape
    pt, ph, pw = patch
    x = latent.reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw).permute(0, 2, 4, 6, 3, 5, 7, 1)
    return x.reshape(b, (f // pt) * (h // ph) * (w // pw), pt * ph * pw * c)


def from_tokens(tokens: torch.Tensor, latent_shape, patch) -> torch.Tensor:
    """Inverse of :func:`to_tokens` for a latent of shape ``[C, F, H, W]``."""
    c, f, h, w = latent_shape
    pt, ph, pw = patch
    b = tokens.shape[0]
    x = tokens.reshape(b, f // pt, h // ph, w // pw, pt, ph, pw, c).permute(0, 7, 1, 4, 2, 5, 3, 6)
    return x.reshape(b, c, f, h, w)


def shard_tokens(tokens: torch.Tensor, mesh: Mesh) -> torch.Tensor:
    """This rank's shard of a full token sequence (padded with zeros at the end)."""
    n = tokens.shape[1]
    padded = mesh.plan.padded_tokens(n)
    if padded != n:
        tokens = F.pad(tokens, (0, 0, 0, padded - n))
    per = padded // mesh.plan.sp
    i = mesh.sp_index
    return tokens[:, i * per:(i + 1) * per].contiguous()


def gather_tokens(local: torch.Tensor, mesh: Mesh, valid: int) -> torch.Tensor:
    """The full token sequence from every rank's shard (padding dropped)."""
    return mesh.all_gather(local, "sp", dim=1)[:, :valid]


def shard_latent(latent: torch.Tensor, mesh: Mesh, patch) -> torch.Tensor:
    return shard_tokens(to_tokens(latent, patch), mesh)


def gather_latent(local: torch.Tensor, mesh: Mesh, latent_shape, patch) -> torch.Tensor:
    n = math.prod(grid_of(latent_shape, patch))
    return from_tokens(gather_tokens(local, mesh, n), latent_shape, patch)


class ShardedDiT:
    """``(tokens [B, Ls, P*C], timestep [B], text [B, T, text_dim], grid) -> [B, Ls, P*C]`` on this
    rank's shard, equal to the matching rows/tokens of :meth:`WanDiT.forward`."""

    def __init__(self, dit: WanDiT, mesh: Mesh):
        cfg = dit.cfg
        if cfg.in_channels != cfg.out_channels:
            raise ValueError(f"sequence-parallel state needs in_channels == out_channels "
                             f"({cfg.in_channels} != {cfg.out_channels})")
        self.dit, self.mesh, self.cfg = dit, mesh, cfg
        mesh.plan.padded_heads(cfg.num_attention_heads)  # refuse early with pad=False
        self.patch = tuple(cfg.patch_size)
        self.patch_volume = math.prod(cfg.patch_size)

    @contextlib.contextmanager
    def _hooked(self, valid: int, padded: int):
        if self.mesh.plan.sp == 1:
            yield
            return
        hook = SequenceParallelAttention(self.mesh, valid, padded, self.cfg.num_attention_heads)
        blocks = list(self.dit.blocks)
        for blk in blocks:
            blk.attn1.attend = hook
        try:
            yield
        finally:
            for blk in blocks:
                blk.attn1.attend = None

    @torch.no_grad()
    def __call__(self, tokens: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
                 grid: tuple[int, int, int]) -> torch.Tensor:
        c = self.mesh.plan.cfg
        if c == 1:
            return self._forward(tokens, timestep, text, grid)
        rows = tokens.shape[0]
        padded_rows = -(-rows // c) * c
        if padded_rows != rows:  # an odd batch: the last row runs twice, its copy is dropped
            extra = padded_rows - rows
            tokens, timestep, text = (torch.cat([t, t[-1:].expand(extra, *t.shape[1:])])
                                      for t in (tokens, timestep, text))
        mine = self.mesh.coords[0]
        out = self._forward(tokens[mine::c], timestep[mine::c], text[mine::c], grid)
        parts = self.mesh.all_gather(out, "cfg", dim=0).chunk(c, dim=0)
        full = torch.empty((padded_rows, *out.shape[1:]), dtype=out.dtype, device=out.device)
        for j, part in enumerate(parts):
            full[j::c] = part
        return full[:rows]

    def _forward(self, tokens, timestep, text, grid):
        dit, cfg, mesh = self.dit, self.cfg, self.mesh
        b, ls, pc = tokens.shape
        ff, hh, ww = grid
        if max(ff, hh, ww) > cfg.rope_max_seq_len:
            raise ValueError(f"latent grid {ff}x{hh}x{ww} exceeds rope_max_seq_len {cfg.rope_max_seq_len}")
        valid = ff * hh * ww
        padded = mesh.plan.padded_tokens(valid)
        if ls * mesh.plan.sp != padded:
            raise ValueError(f"shard of {ls} tokens does not match a {valid}-token sequence on {mesh.plan.sp} ranks")
        p = self.patch_volume
        # token values are (pt, ph, pw, C); the patch embedding reads one (C, pt, ph, pw) patch per
        # token. On a CPU: the model's own convolution batched over tokens (the very sums of the
        # full grid, so fp32 results match the one-device path exactly); on CUDA: its GEMM.
        conv = dit.patch_embedding
        x = tokens.reshape(b * ls, p, pc // p).transpose(1, 2).to(conv.weight.dtype)
        if x.device.type == "cuda":
            x = F.linear(x.reshape(b, ls, pc), conv.weight.reshape(cfg.inner_dim, -1), conv.bias)
        else:
            x = conv(x.reshape(b * ls, pc // p, *self.patch)).view(b, ls, cfg.inner_dim)
        temb, temb6, ctx = dit.condition_embedder(timestep, text)
        temb6 = temb6.unflatten(1, (6, -1))
        start = mesh.sp_index * ls
        rope = tuple(self._local(t, start, ls, padded) for t in dit.rope(ff, hh, ww))
        with self._hooked(valid, padded):
            for block in dit.blocks:
                x = block(x, ctx, temb6, rope)
        shift, scale = (dit.scale_shift_table + temb.unsqueeze(1)).chunk(2, dim=1)
        x = (_layer_norm_fp32(x, cfg.eps) * (1 + scale) + shift).type_as(x)
        return dit.proj_out(x)

    @staticmethod
    def _local(table: torch.Tensor, start: int, length: int, padded: int) -> torch.Tensor:
        """This shard's rows of a [1, N, 1, D] RoPE table (zeros for padded tokens)."""
        n = table.shape[1]
        if padded != n:
            table = F.pad(table, (0, 0, 0, 0, 0, padded - n))
        return table[:, start:start + length]
