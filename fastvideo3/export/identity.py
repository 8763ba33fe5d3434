"""Runtime identity: the canonical string that stored state is bound to, and its fingerprint.

The identity names everything that can change what a byte of pool-resident state *means*:
the weights, the precision, the kernel/library versions, the device architecture, the graph
names, the ordered state-region layout and (for an integrated model runtime) the port schema
and stage DAG. Two runtimes with equal identities may exchange snapshots; any difference makes
a restore fail closed.

Rules kept here and nowhere else:

* :func:`fnv1a_64` is the only implementation of the fingerprint hash in the project.
* :meth:`RuntimeIdentity.canonical` is the only place the identity string is built. It has one
  escaping rule (:func:`escape`) applied to every key and value, a fixed field order, and sorted
  order for fields that are sets (libraries, graph names, ports). Region and stage order is
  kept as declared because it is contractual.

The discovery manifest (free-form metadata) lives on the export, never in this module: editing
it must never invalidate stored state.
"""
from __future__ import annotations

import importlib.metadata
import platform
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable, Mapping, Protocol, runtime_checkable

import torch

from fastvideo3 import __version__ as _FASTVIDEO3_VERSION
from fastvideo3.errors import InvalidRequest

FNV64_OFFSET_BASIS = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
_MASK64 = 0xFFFFFFFFFFFFFFFF

# Version tag of the canonical form. Bump it whenever the string layout changes, so old and new
# fingerprints can never collide by accident.
IDENTITY_FORMAT = "fastvideo3-runtime-identity/1"

# The single escaping rule: each reserved character is prefixed by a backslash (newline and
# carriage return are written as \n and \r). Applied to every key, field and list item alike.
_RESERVED = {"\\": "\\\\", "=": "\\=", "|": "\\|", ",": "\\,", "\n": "\\n", "\r": "\\r"}


def fnv1a_64(data: bytes) -> int:
    """FNV-1a, 64-bit, over ``data``. The project's one fingerprint hash."""
    h = FNV64_OFFSET_BASIS
    for byte in data:
        h ^= byte
        h = (h * FNV64_PRIME) & _MASK64
    return h


def fingerprint_hex(fingerprint: int) -> str:
    """The fixed-width (16 hex digit) text form of a 64-bit fingerprint."""
    return format(fingerprint, "016x")


def escape(text: str) -> str:
    """Escape one key, field or list item for the canonical identity string."""
    return "".join(_RESERVED.get(ch, ch) for ch in text)


@runtime_checkable
class IdentityPart(Protocol):
    """Something that contributes one record to the identity (a region, a port, a stage).

    ``identity_fields`` returns raw (unescaped) fields; a field may be a tuple of strings, which
    is written as a comma-separated list. Escaping is done by the identity, not by the part.
    """

    def identity_fields(self) -> tuple[str | tuple[str, ...], ...]: ...


def _record(key: str, fields: Iterable[str | tuple[str, ...]]) -> str:
    parts = []
    for f in fields:
        parts.append(",".join(escape(x) for x in f) if isinstance(f, tuple) else escape(f))
    return f"{escape(key)}={'|'.join(parts)}"


def default_libraries() -> dict[str, str]:
    """Versions of the libraries whose kernels shape the runtime: torch, triton (if any), ours."""
    libs = {"torch": torch.__version__, "fastvideo3": _FASTVIDEO3_VERSION}
    for dist in ("triton", "pytorch-triton"):
        try:
            libs["triton"] = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return libs


def detect_device_arch(device: torch.device | str | None = None) -> str:
    """A short architecture tag: ``cuda:sm_90`` for a CUDA device, ``cpu:x86_64`` otherwise."""
    dev = torch.device(device) if device is not None else None
    if dev is None and torch.cuda.is_available():
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev is not None and dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        return f"cuda:sm_{major}{minor}"
    return f"cpu:{platform.machine() or 'unknown'}"


@dataclass(frozen=True)
class RuntimeIdentity:
    """Everything a fingerprint covers. Immutable; build a new one to change a field.

    ``libraries`` may be given as a mapping; it is stored as sorted ``(name, version)`` pairs.
    ``graph_names`` are stored sorted (graphs are looked up by name). ``regions`` and ``stages``
    keep their declared order; ``ports`` are stored sorted by name.
    """

    weights_digest: str
    precision: str
    libraries: tuple[tuple[str, str], ...] | Mapping[str, str]
    device_arch: str
    graph_names: tuple[str, ...] = ()
    regions: tuple[IdentityPart, ...] = ()
    ports: tuple[IdentityPart, ...] = ()
    stages: tuple[IdentityPart, ...] = ()

    def __post_init__(self) -> None:
        libs = self.libraries.items() if isinstance(self.libraries, Mapping) else self.libraries
        libs = tuple(sorted((str(k), str(v)) for k, v in libs))
        object.__setattr__(self, "libraries", libs)
        object.__setattr__(self, "graph_names", tuple(sorted(str(g) for g in self.graph_names)))
        object.__setattr__(self, "regions", tuple(self.regions))
        object.__setattr__(self, "stages", tuple(self.stages))
        for part in (*self.regions, *self.ports, *self.stages):
            if not isinstance(part, IdentityPart):
                raise InvalidRequest(f"{part!r} has no identity_fields()", field="identity")
        ports = sorted(self.ports, key=lambda p: _record("port", p.identity_fields()))
        object.__setattr__(self, "ports", tuple(ports))
        for name in ("weights_digest", "precision", "device_arch"):
            if not str(getattr(self, name)):
                raise InvalidRequest("identity field must not be empty", field=name)
        names = [n for n, _ in libs]
        if len(set(names)) != len(names):
            raise InvalidRequest("duplicate library name", field="libraries")
        if len(set(self.graph_names)) != len(self.graph_names):
            raise InvalidRequest("duplicate graph name", field="graph_names")

    def canonical(self) -> str:
        """The canonical identity string: one ``key=fields`` record per line, fixed order."""
        lines = [
            IDENTITY_FORMAT,
            _record("weights_digest", [self.weights_digest]),
            _record("precision", [self.precision]),
            _record("device_arch", [self.device_arch]),
        ]
        lines += [_record("library", [n, v]) for n, v in self.libraries]
        lines += [_record("graph", [g]) for g in self.graph_names]
        lines += [_record("region", r.identity_fields()) for r in self.regions]
        lines += [_record("port", p.identity_fields()) for p in self.ports]
        lines += [_record("stage", s.identity_fields()) for s in self.stages]
        return "\n".join(lines) + "\n"

    @cached_property
    def fingerprint(self) -> int:
        """FNV-1a 64 of the UTF-8 canonical string."""
        return fnv1a_64(self.canonical().encode("utf-8"))

    @property
    def fingerprint_hex(self) -> str:
        return fingerprint_hex(self.fingerprint)

    def with_layout(
        self,
        *,
        graph_names: Iterable[str] | None = None,
        regions: Iterable[IdentityPart] | None = None,
        ports: Iterable[IdentityPart] | None = None,
        stages: Iterable[IdentityPart] | None = None,
    ) -> "RuntimeIdentity":
        """A copy with the builder-appended parts replaced (producer-supplied fields are kept)."""
        return RuntimeIdentity(
            weights_digest=self.weights_digest,
            precision=self.precision,
            libraries=self.libraries,
            device_arch=self.device_arch,
            graph_names=tuple(self.graph_names if graph_names is None else graph_names),
            regions=tuple(self.regions if regions is None else regions),
            ports=tuple(self.ports if ports is None else ports),
            stages=tuple(self.stages if stages is None else stages),
        )
