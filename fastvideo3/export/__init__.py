"""The runtime-export contract: how a built model is handed to the pool that serves it.

A pool executor never reaches into a model. The producer (whatever loaded the weights,
allocated the buffers and captured the graphs) hands over one :class:`RuntimeExport`, and the
tickable :class:`ModelRuntime` on top of it. The contract has five rules.

1. **One struct.** Everything a consumer needs about a deployed model -- identity, fingerprint,
   manifest, state regions, graphs, buffers, owner -- travels in one ``RuntimeExport``. Today
   the denoiser fills it in-process from Python; any later producer (another language, a
   prebuilt engine) fills the same struct and consumers do not change.
2. **Handles, not internals.** Consumers see graph handles, buffers, port specs and strings.
   They never import model code, and they drive a runtime only through its verbs:
   ``set_input``, ``get_output``, ``prepare`` (warm phase) and ``step`` (hot phase).
3. **Identity is split from discovery.** The identity covers what gives stored state its
   meaning: weights digest, precision, library versions, device arch, graph names, the region
   layout and, for an integrated runtime, the port schema and stage DAG. Its fingerprint is
   FNV-1a 64 of one canonical string, computed in exactly one function
   (:func:`fnv1a_64`). The manifest is free-form discovery data; editing it never changes the
   fingerprint and never invalidates a snapshot.
4. **Region order is contractual.** Restorable state regions are matched by position, so their
   order, names, dtypes, shapes, offsets and sizes are all fingerprinted, and a snapshot
   restores only onto a runtime with the same fingerprint.
5. **Lifetime is explicit.** Every constructor hands out one reference; ``retain()`` and
   ``release()`` move the count from any thread. While a reference is held every handle stays
   valid; the last ``release()`` calls the owner exactly once to free graphs and buffers, and
   any later use raises :class:`ExportReleased`.

Native hosts see the same contract as plain C structs (``include/fastvideo3/runtime.h``): the
ctypes mirror is :mod:`fastvideo3.export.cabi` and :class:`fastvideo3.export.native.NativeModelRuntime`
fills it from a ``ModelRuntime`` (docs/native-host.md).

Hot-path rule for ports (SWAP and STAGED): a step never recaptures, allocates or rebinds;
only buffer contents change. Shape buckets are captured by ``prepare`` in the warm phase; a
bucket miss inside ``step`` is an error, not a lazy capture.
"""
from fastvideo3.export.errors import (
    BucketNotPrepared,
    BufferMismatch,
    ExportReleased,
    FingerprintMismatch,
    PortDeclarationError,
    RegionLayoutError,
    SnapshotCorrupt,
    UnknownPort,
    VerbUnavailable,
)
from fastvideo3.export.graphs import GraphRunner
from fastvideo3.export.identity import (
    RuntimeIdentity,
    default_libraries,
    detect_device_arch,
    fingerprint_hex,
    fnv1a_64,
)
from fastvideo3.export.ports import Direction, PortSpec, UpdateClass, Verbs, validate_ports
from fastvideo3.export.regions import (
    Snapshot,
    StateRegion,
    arena_size,
    arena_views,
    pack_regions,
    restore,
    snapshot,
    validate_layout,
)
from fastvideo3.export.model_runtime import (
    ModelRuntime,
    RuntimeBuilder,
    RuntimeExport,
    Stage,
    validate_stages,
)

__all__ = [
    "BucketNotPrepared",
    "BufferMismatch",
    "Direction",
    "ExportReleased",
    "FingerprintMismatch",
    "GraphRunner",
    "ModelRuntime",
    "PortDeclarationError",
    "PortSpec",
    "RegionLayoutError",
    "RuntimeBuilder",
    "RuntimeExport",
    "RuntimeIdentity",
    "Snapshot",
    "SnapshotCorrupt",
    "Stage",
    "StateRegion",
    "UnknownPort",
    "UpdateClass",
    "VerbUnavailable",
    "Verbs",
    "arena_size",
    "arena_views",
    "default_libraries",
    "detect_device_arch",
    "fingerprint_hex",
    "fnv1a_64",
    "pack_regions",
    "restore",
    "snapshot",
    "validate_layout",
    "validate_ports",
    "validate_stages",
]
