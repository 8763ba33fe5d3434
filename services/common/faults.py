"""Test-only fault injection for a pool: ``--inject-fault KIND:REQUEST_ID@N`` (repeatable).

Each fault hits one request id, so a test can break one request and watch its batch-mates.

Step faults (denoiser; ``N`` = the denoise step):

* ``nan``   the step's new latent becomes NaN: the pool's finiteness watch aborts the request
  (``ABORTED`` naming the step); batch-mates are untouched.
* ``oom``   the step raises ``torch.OutOfMemoryError``: that request fails ``RESOURCE_EXHAUSTED``.
* ``raise`` the step raises a plain exception: that request fails ``INTERNAL``.

Transfer faults (any pool that publishes; ``N`` is unused except by ``stall``):

* ``corrupt`` every buffer published for the request gets one byte flipped after its checksum
  was taken: the reader's verification fails (``DATA_LOSS``).
* ``drop``    every buffer published for the request is released at once: the reader finds
  nothing (``NOT_FOUND``).
* ``stall``   serving the request's buffers over the gRPC backend blocks for ``N`` seconds: the
  reader's fetch deadline passes (``DEADLINE_EXCEEDED``).

Nothing here runs unless the flag is given; the runtime never imports this module.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

from fastvideo3.errors import InvalidRequest

STEP_KINDS = ("nan", "oom", "raise")
TRANSFER_KINDS = ("corrupt", "drop", "stall")


@dataclass(frozen=True)
class Fault:
    kind: str
    request_id: str
    n: int = 0


def parse(specs: list[str] | tuple[str, ...]) -> list[Fault]:
    out = []
    for spec in specs or ():
        kind, sep, rest = spec.partition(":")
        rid, _, n = rest.partition("@")
        if not sep or kind not in STEP_KINDS + TRANSFER_KINDS or not rid or (n and not n.isdigit()):
            raise InvalidRequest(f"bad --inject-fault value {spec!r}", field="inject_fault",
                                 limit=f"KIND:REQUEST_ID@N with KIND in {', '.join(STEP_KINDS + TRANSFER_KINDS)}")
        out.append(Fault(kind, rid, int(n or 0)))
    return out


def install(executor, transport, faults: list[Fault]) -> None:
    """Arm ``faults`` on a pool's executor and transport."""
    step = [f for f in faults if f.kind in STEP_KINDS]
    if step:
        _arm_steps(executor, step)
    transfer = [f for f in faults if f.kind in TRANSFER_KINDS]
    if transfer:
        _arm_transfers(transport, transfer)


def _arm_steps(executor, faults: list[Fault]) -> None:
    import torch
    if not hasattr(executor, "fault_hook"):
        raise InvalidRequest("step faults need the real denoiser executor", field="inject_fault")

    def hook(unit, latent):
        for f in faults:
            if unit.request_id == f.request_id and int(unit.params.get("step", -1)) == f.n:
                if f.kind == "nan":
                    return latent * float("nan")
                if f.kind == "oom":
                    raise torch.OutOfMemoryError(f"injected out-of-memory at step {f.n}")
                raise RuntimeError(f"injected executor fault at step {f.n}")
        return latent

    executor.fault_hook = hook


def _arm_transfers(transport, faults: list[Fault]) -> None:
    from fastvideo3.transport.testing import corrupt
    by_request = {f.request_id: f for f in faults}
    publish = transport.publish

    def faulty_publish(request_id, name, tensor):
        ref = publish(request_id, name, tensor)
        f = by_request.get(request_id)
        if f is not None:
            backend = transport._backends[ref.backend]
            if f.kind == "corrupt":
                corrupt(backend, ref)
            elif f.kind == "drop":
                backend.release_ref(ref)
        return ref

    transport.publish = faulty_publish
    stalls = {f.request_id: f.n for f in faults if f.kind == "stall"}
    grpc_backend = getattr(transport, "_backends", {}).get("grpc")
    if stalls and grpc_backend is not None:
        def stall(request_id):
            if request_id in stalls:
                threading.Event().wait(stalls[request_id])  # a hung peer, as the reader sees it

        grpc_backend.serve_hook = stall
