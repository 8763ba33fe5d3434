"""The extension seam of the denoiser: interceptors around a request's step and around a range
of DiT blocks.

An interceptor is a policy object built per step from validated settings; it holds nothing
between calls. Everything it remembers lives with the request:

* ``RowView.state``: small JSON values (numbers, lists of numbers) kept in the request's
  LoopState (``plugin_state``), checkpointed with it and restored exactly;
* ``RowView.tensors``: tensors in the request's pool-resident region, snapshotted with its latent
  and restored bit-identical.

Trust boundary: an interceptor sees only its own request's rows (the probe tensors it is
handed) and its own state; it may write only its own ``state`` and ``tensors`` and its return
value. It never sees other requests in the batch, the model, the executor or the transport.
Decisions are per request, so requests batched together decide independently; the runner
(:mod:`fastvideo3.extend.runner`) gathers the rows that compute and scatters results back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass
class RowView:
    """One request's view of one forward pass (one CFG stream) inside a batch."""

    step: int                 # denoise step index, 0-based
    num_steps: int
    state: dict[str, Any]     # this interceptor's JSON state for this stream (mutable)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)  # its resident tensors (mutable)


@runtime_checkable
class StepInterceptor(Protocol):
    """Around a request's whole block stack for one step.

    ``reuse_step`` sees the first block's modulated input and decides whether this step reuses
    the residual of the whole stack (no block runs for this request). ``after_step`` sees the
    stack's input and output when it ran, to remember what the next reuse needs.
    """

    name: str

    def reuse_step(self, row: RowView, probe: torch.Tensor) -> bool: ...

    def reused_residual(self, row: RowView) -> torch.Tensor: ...

    def after_step(self, row: RowView, blocks_in: torch.Tensor, blocks_out: torch.Tensor) -> None: ...


@runtime_checkable
class BlockInterceptor(Protocol):
    """Around the middle range of blocks: the first ``front`` blocks and the last ``back``
    blocks always run; the middle ``[front, num_blocks - back)`` may be replaced by a residual.

    ``reuse_middle`` sees the residual of the front blocks (their output minus their input);
    ``middle_residual`` gives what replaces the middle when it reuses; ``after_middle`` sees the
    middle's fresh residual when it ran.
    """

    name: str

    def split(self, num_blocks: int) -> tuple[int, int]: ...

    def reuse_middle(self, row: RowView, front_residual: torch.Tensor) -> bool: ...

    def middle_residual(self, row: RowView) -> torch.Tensor: ...

    def after_middle(self, row: RowView, residual: torch.Tensor) -> None: ...
