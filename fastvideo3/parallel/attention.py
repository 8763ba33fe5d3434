"""Sequence-parallel self-attention: Ulysses all-to-all around ring attention with an online softmax.

Each rank holds ``Ls`` tokens of the (padded) sequence, all heads: ``q, k, v`` are
``[B, Ls, H, D]``. With Ulysses degree ``U`` an all-to-all trades sequence for heads (every
rank then holds ``U * Ls`` tokens of ``H / U`` heads: its ring chunk); with ring degree ``R`` the
ring chunks of K/V travel around the ring (send to the next rank, receive from the previous,
overlapped with the block in hand), each block's output merged by its log-sum-exp. A second
all-to-all gives every rank back its own tokens with all heads.

Padded keys (the sequence's tail beyond ``valid``) are cut from their block before it is used,
so they never take softmax mass; padded heads are zero and are dropped on the way back.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from fastvideo3.parallel.mesh import Mesh


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention on head-major ``[B, H, L, D]`` with its log-sum-exp ``[B, H, Lq]`` (fp32):
    PyTorch's flash kernels (CPU; CUDA half precision), its memory-efficient kernel (CUDA fp32),
    else a chunked fp32 computation."""
    try:
        if q.device.type == "cpu":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[:2]
            return out, lse.float()
        if q.dtype in (torch.float16, torch.bfloat16):
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, False)[:2]
            return out, lse.float()
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, None, True)[:2]
        return out, lse[..., : q.shape[2]].float()
    except (RuntimeError, NotImplementedError):  # a kernel that does not take this input
        return _attention_lse_math(q, k, v)


def _attention_lse_math(q, k, v, chunk: int = 4096):
    scale = q.shape[-1] ** -0.5
    outs, lses = [], []
    for i in range(0, q.shape[2], chunk):
        s = torch.matmul(q[:, :, i:i + chunk].float(), k.float().transpose(-1, -2)) * scale
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.float()).to(q.dtype))
        lses.append(lse)
    return torch.cat(outs, dim=2), torch.cat(lses, dim=2)


def _merge(acc: torch.Tensor | None, acc_lse: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor):
    """Online softmax: fold one block's (normalised output, lse) into the running pair (fp32)."""
    if acc is None:
        return out.float(), lse
    new = torch.logaddexp(acc_lse, lse)
    acc = acc * torch.exp(acc_lse - new).unsqueeze(-1) + out.float() * torch.exp(lse - new).unsqueeze(-1)
    return acc, new


class SequenceParallelAttention:
    """The attention hook a plan installs on the DiT's self-attention (see ``Attention.attend``).

    ``valid``: real tokens of the whole sequence; ``padded``: the sequence length every rank's
    shard is cut from (``padded / sp`` tokens per rank)."""

    def __init__(self, mesh: Mesh, valid: int, padded: int, heads: int):
        plan = mesh.plan
        self.mesh, self.valid, self.padded, self.heads = mesh, valid, padded, heads
        self.heads_padded = plan.padded_heads(heads)
        self.chunk = padded // plan.ring  # tokens of one ring chunk (U local shards)
        ring_ranks = mesh.ranks("ring")
        _, r, _ = mesh.coords
        self.ring_index = r
        self.ring_next = ring_ranks[(r + 1) % len(ring_ranks)]
        self.ring_prev = ring_ranks[(r - 1) % len(ring_ranks)]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        u = self.mesh.plan.ulysses
        b, ls, h, d = q.shape
        if self.heads_padded != h:
            pad = (0, 0, 0, self.heads_padded - h)
            q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
        if u > 1:
            q, k, v = (self._to_heads(t) for t in (q, k, v))
        o = self._ring(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        if u > 1:
            o = self._to_tokens(o)
        return o[:, :, :h].to(q.dtype)

    # -- Ulysses --------------------------------------------------------------------------
    def _to_heads(self, t: torch.Tensor) -> torch.Tensor:
        """[B, Ls, Hp, D] (my tokens, all heads) -> [B, U*Ls, Hp/U, D] (my ring chunk, my heads)."""
        u = self.mesh.plan.ulysses
        b, ls, hp, d = t.shape
        send = t.reshape(b, ls, u, hp // u, d).permute(2, 0, 1, 3, 4)
        recv = self.mesh.all_to_all(send, "ulysses")  # [U(source shard), B, Ls, Hp/U, D]
        return recv.permute(1, 0, 2, 3, 4).reshape(b, u * ls, hp // u, d)

    def _to_tokens(self, t: torch.Tensor) -> torch.Tensor:
        """[B, U*Ls, Hp/U, D] -> [B, Ls, Hp, D]."""
        u = self.mesh.plan.ulysses
        b, lu, hh, d = t.shape
        send = t.reshape(b, u, lu // u, hh, d).permute(1, 0, 2, 3, 4)
        recv = self.mesh.all_to_all(send, "ulysses")  # [U(source head group), B, Ls, Hp/U, D]
        return recv.permute(1, 2, 0, 3, 4).reshape(b, lu // u, u * hh, d)

    # -- ring -----------------------------------------------------------------------------
    def _valid_in(self, chunk_index: int) -> int:
        return max(0, min(self.chunk, self.valid - chunk_index * self.chunk))

    def _ring(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q, k, v head-major [B, Hh, C, D] (C = the ring chunk); attention over every chunk's K/V."""
        ring = self.mesh.plan.ring
        if ring == 1:
            n = self._valid_in(0)
            if n == k.shape[2]:
                return F.scaled_dot_product_attention(q, k, v)
            return F.scaled_dot_product_attention(q, k[:, :, :n], v[:, :, :n])
        kv = torch.stack([k, v]).contiguous()
        acc = acc_lse = None
        for step in range(ring):
            source = (self.ring_index - step) % ring  # whose chunk ``kv`` is
            pending = None
            if step + 1 < ring:  # pass the block on while this one is computed
                nxt = torch.empty_like(kv)
                group = self.mesh.group("ring")  # every rank of the ring takes part in each pass
                pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, self.ring_next, group),
                                                  dist.P2POp(dist.irecv, nxt, self.ring_prev, group)])
            n = self._valid_in(source)
            if n > 0:
                out, lse = attention_lse(q, kv[0][:, :, :n], kv[1][:, :, :n])
                acc, acc_lse = _merge(acc, acc_lse, out, lse)
            if pending is not None:
                for req in pending:
                    req.wait()
                kv = nxt
        return acc.to(q.dtype)
