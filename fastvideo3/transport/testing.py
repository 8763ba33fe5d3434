"""Fault injection for tests only. Nothing in the runtime imports this module.

These helpers reach into an owner's resident buffer (through the backend's
``_resident_bytes`` hook) to simulate what the checksum exists to catch: bytes that changed
between ``publish`` and ``fetch`` (a bad DIMM, a DMA into the wrong slab, a reuse bug).
"""
from __future__ import annotations

import torch

from fastvideo3.transport.ledger import TransportBase
from fastvideo3.transport.ref import TensorRef


def corrupt(transport: TransportBase, ref: TensorRef, *, index: int = 0) -> None:
    """Flip every bit of one byte of a published buffer, in place on the owner side."""
    data = transport._resident_bytes(ref)
    if data.numel() == 0:
        raise ValueError("an empty tensor has no byte to corrupt")
    i = index % data.numel()
    data[i:i + 1].bitwise_not_()
    if data.device.type == "cuda":
        torch.cuda.synchronize(data.device)
