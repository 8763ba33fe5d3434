"""Typed errors of the runtime-export contract.

Each one subclasses a class of :mod:`fastvideo3.errors`, so the service edge maps it to a gRPC
status without knowing this package exists. Declaration mistakes by a producer (a bad port, a
malformed region layout, a tensor that does not fit its buffer) are ``INVALID_ARGUMENT``; using
the contract in the wrong state (wrong fingerprint, released export, unprepared bucket) is
``FAILED_PRECONDITION``.
"""
from __future__ import annotations

from fastvideo3.errors import DataLoss, FailedPrecondition, InvalidRequest, NotFound


class FingerprintMismatch(FailedPrecondition):
    """Stored state was bound to another runtime identity; restoring it would be silent corruption."""


class ExportReleased(FailedPrecondition):
    """The export (or model runtime) was used after its final ``release()``."""


class BucketNotPrepared(FailedPrecondition):
    """A shape bucket was stepped before ``prepare(bucket)`` captured or warmed it up."""


class VerbUnavailable(FailedPrecondition):
    """A verb was called that this runtime does not implement, or at a moment it is not legal."""


class PortDeclarationError(InvalidRequest):
    """A port (or stage) declaration breaks the contract; ``field`` names the offending port."""


class RegionLayoutError(InvalidRequest):
    """A state-region layout is malformed: duplicate names, overlap, or a size that does not add up."""


class BufferMismatch(InvalidRequest):
    """A tensor's dtype or shape does not match the buffer, region or static input it targets."""


class UnknownPort(NotFound):
    """A verb named a port this runtime does not declare."""


class SnapshotCorrupt(DataLoss):
    """Serialized snapshot bytes are truncated, malformed or fail their checksum."""
