"""In-process transport: zero-copy hand-off between pools that share one process.

This is the embedded mode's transport. ``publish`` keeps the tensor itself (made contiguous
if needed, never copied otherwise); ``fetch`` returns that same storage. Pools find each
other through an :class:`InprocHub` the engine creates and hands to each of them; a ref from
another process (or another hub) is rejected with ``Unavailable``.
"""
from __future__ import annotations

import os
import threading
import uuid
import weakref

import torch

from fastvideo3.errors import Unavailable
from fastvideo3.transport.ledger import Deadline, TransportBase
from fastvideo3.transport.ref import TensorRef


class InprocHub:
    """Directory of the in-process transports of one engine (owner name -> transport)."""

    def __init__(self) -> None:
        self.hub_id = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self._owners: "weakref.WeakValueDictionary[str, InprocTransport]" = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def join(self, transport: "InprocTransport") -> None:
        with self._lock:
            current = self._owners.get(transport.owner)
            if current is not None and current is not transport:
                raise Unavailable(f"owner {transport.owner!r} already joined this hub",
                                  field="transport.owner")
            self._owners[transport.owner] = transport

    def leave(self, transport: "InprocTransport") -> None:
        with self._lock:
            if self._owners.get(transport.owner) is transport:
                del self._owners[transport.owner]

    def find(self, owner: str) -> "InprocTransport | None":
        with self._lock:
            return self._owners.get(owner)


class InprocTransport(TransportBase):
    """Zero-copy transport inside one process (see module docstring).

    ``device=None`` (the default) returns tensors where the owner keeps them.
    """

    backend = "inproc"

    def __init__(self, owner: str, *, hub: InprocHub | None = None,
                 device: str | torch.device | None = None, checksum: str = "auto") -> None:
        super().__init__(owner, device=device, checksum=checksum)
        self.hub = hub if hub is not None else InprocHub()
        self.hub.join(self)

    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str):
        from fastvideo3.transport.checksum import compute

        stored = tensor.contiguous()
        csum = compute(stored, csum_algo)
        return stored, csum, {"hub": self.hub.hub_id}

    def _free(self, payload) -> None:
        pass  # the ledger dropped its reference; the storage dies with its last user

    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool,
               out: torch.Tensor | None) -> torch.Tensor:
        if ref.descriptor.get("hub") != self.hub.hub_id:
            raise Unavailable(f"ref from hub {ref.descriptor.get('hub')!r} is not reachable in-process",
                              field="descriptor.hub")
        owner = self.hub.find(ref.owner)
        if owner is None:
            raise Unavailable(f"in-process owner {ref.owner!r} is gone", field="owner")
        entry = owner._lookup(ref)
        owner._count("served")
        owner._count("served_bytes", ref.nbytes)
        tensor = entry.payload
        if out is not None:
            return out.copy_(tensor)
        return tensor.clone() if copy else tensor

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        return self._lookup(ref).payload.reshape(-1).view(torch.uint8)

    def _close_backend(self) -> None:
        self.hub.leave(self)
