"""RuntimeExport (what a deployed model *is*) and ModelRuntime (how a host drives it).

:class:`RuntimeExport` is the one hand-off struct between the producer that built a model
(loaded weights, captured graphs, allocated buffers) and a consumer (a pool executor): identity
and fingerprint, a discovery manifest, ordered state regions, graph handles by name, buffers,
and an owner callback. It carries no scheduling policy.

:class:`ModelRuntime` adds the tickable face on top of one export: ports (how inputs enter and
outputs leave), stages (a small DAG of graph names, declared in a valid firing order) and four
verbs -- ``set_input``, ``get_output``, ``prepare`` (warm phase: capture or warm up a shape
bucket) and ``step`` (hot phase: fire the stages in declared order). It is driven by one host
thread; ``retain``/``release`` may be called from any thread.

One construction path, validated fail-closed before anything is built: :class:`RuntimeBuilder`,
whose ``finish()`` assembles export, ports and stages under ONE identity (changing the port
schema or stage DAG changes the fingerprint). The model runtime adopts the export's creator
reference, so a consumer retains and releases only the runtime.

Lifetime: every constructor hands its caller one reference. ``retain()`` adds one, ``release()``
drops one; at zero an export calls its owner callback exactly once and drops its graphs and
buffers, and a model runtime releases the reference it holds on its base. Any use after the
final release raises :class:`ExportReleased`.
"""
from __future__ import annotations

import copy
import threading
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

import torch

from fastvideo3.export.errors import (
    BucketNotPrepared,
    BufferMismatch,
    ExportReleased,
    PortDeclarationError,
    UnknownPort,
    VerbUnavailable,
)
from fastvideo3.export.graphs import GraphRunner
from fastvideo3.export.identity import RuntimeIdentity, default_libraries, detect_device_arch
from fastvideo3.export.ports import (
    Direction,
    PortSpec,
    UpdateClass,
    Verbs,
    swap_window,
    validate_ports,
)
from fastvideo3.export.regions import StateRegion, dtype_of, validate_layout


@dataclass(frozen=True)
class Stage:
    """One node of the stage DAG: fire graph ``graph`` after the stages named in ``after``."""

    graph: str
    after: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "after", tuple(self.after))

    def identity_fields(self) -> tuple[str | tuple[str, ...], ...]:
        return (self.graph, self.after)


def validate_stages(stages: Iterable[Stage], graphs: Mapping[str, Any]) -> tuple[Stage, ...]:
    """Each stage fires a known graph once; dependencies point only at earlier stages.

    Requiring the declared order to be a topological order is what lets ``step`` fire stages
    in declared order, and rules out cycles by construction.
    """
    stages, seen = tuple(stages), set()
    for s in stages:
        if not isinstance(s, Stage):
            raise PortDeclarationError(f"{s!r} is not a Stage", field="stages")
        where = f"stages.{s.graph}"
        if s.graph not in graphs:
            raise PortDeclarationError(f"stage fires unknown graph {s.graph!r}", field=where)
        if s.graph in seen:
            raise PortDeclarationError(f"graph {s.graph!r} is staged twice", field=where)
        for dep in s.after:
            if dep not in seen:
                raise PortDeclarationError(
                    f"stage {s.graph!r} depends on {dep!r}, which is not declared before it",
                    field=where,
                )
        seen.add(s.graph)
    return stages


class _Lifetime:
    """A thread-safe reference count whose drop to zero runs ``on_zero`` exactly once."""

    def __init__(self, what: str, on_zero: Callable[[], None]) -> None:
        self._what, self._on_zero = what, on_zero
        self._lock = threading.Lock()
        self._count = 1  # the creator's reference

    @property
    def count(self) -> int:
        return self._count

    def check(self) -> None:
        if self._count == 0:
            raise ExportReleased(f"{self._what} was used after its final release")

    def retain(self) -> None:
        with self._lock:
            self.check()
            self._count += 1

    def release(self) -> bool:
        with self._lock:
            self.check()
            self._count -= 1
            last = self._count == 0
        if last:  # outside the lock: the callback may take its own locks
            self._on_zero()
        return last


class _RefCounted:
    """The reference-count face of an object whose ``_life`` is a :class:`_Lifetime`."""

    _life: _Lifetime

    def retain(self) -> None:
        self._life.retain()

    def release(self) -> bool:
        """Drop one reference; returns True if it was the last one."""
        return self._life.release()

    @property
    def refcount(self) -> int:
        return self._life.count

    @property
    def released(self) -> bool:
        return self._life.count == 0


class _Identified(_RefCounted):
    """A reference-counted object carrying a :class:`RuntimeIdentity` in ``_identity`` (readable
    until its final release)."""

    _identity: RuntimeIdentity

    @property
    def identity(self) -> RuntimeIdentity:
        self._life.check()
        return self._identity

    @property
    def fingerprint(self) -> int:
        return self.identity.fingerprint

    @property
    def fingerprint_hex(self) -> str:
        return self.identity.fingerprint_hex


class RuntimeExport(_Identified):
    """The hand-off struct. Built by :class:`RuntimeBuilder` (or directly, from a full identity).

    ``identity.graph_names`` must name exactly the graphs given, and ``identity.regions`` is the
    region layout. ``owner`` is called with no arguments when the last reference is released.
    """

    def __init__(
        self,
        *,
        identity: RuntimeIdentity,
        graphs: Mapping[str, Any],
        buffers: Mapping[str, torch.Tensor] | None = None,
        manifest: Mapping[str, Any] | None = None,
        owner: Callable[[], None] | None = None,
        streams: Mapping[str, Any] | None = None,
    ) -> None:
        if tuple(sorted(graphs)) != identity.graph_names:
            raise PortDeclarationError(
                f"identity names graphs {list(identity.graph_names)}, export has {sorted(graphs)}",
                field="graphs",
            )
        regions = validate_layout(identity.regions)
        for name, buf in (buffers or {}).items():
            if not isinstance(buf, torch.Tensor):
                raise BufferMismatch(f"buffer {name!r} is not a tensor", field=f"buffers.{name}")
        self._identity = identity
        self._regions: tuple[StateRegion, ...] = regions
        self._graphs = dict(graphs)
        self._buffers = dict(buffers or {})
        self._streams = dict(streams or {})  # CUDA streams the graphs replay on (not identity)
        self._manifest = copy.deepcopy(dict(manifest or {}))
        self._owner = owner
        self._life = _Lifetime("runtime export", self._free)

    def _free(self) -> None:
        try:
            if self._owner is not None:
                self._owner()
        finally:
            self._graphs.clear()
            self._buffers.clear()
            self._streams.clear()
            self._owner = None

    # -- contents (all raise ExportReleased after the final release) -----------------------
    @property
    def manifest(self) -> dict[str, Any]:
        """Discovery data. Free to edit: it is not part of the identity."""
        self._life.check()
        return self._manifest

    @property
    def regions(self) -> tuple[StateRegion, ...]:
        self._life.check()
        return self._regions

    @property
    def graphs(self) -> Mapping[str, Any]:
        self._life.check()
        return MappingProxyType(self._graphs)

    @property
    def buffers(self) -> Mapping[str, torch.Tensor]:
        self._life.check()
        return MappingProxyType(self._buffers)

    @property
    def streams(self) -> Mapping[str, Any]:
        """CUDA streams by name; graphs are replayed on the first. Empty on a CPU."""
        self._life.check()
        return MappingProxyType(self._streams)

    def __repr__(self) -> str:
        if self.released:
            return "RuntimeExport(<released>)"
        return f"RuntimeExport(fingerprint={self.fingerprint_hex}, graphs={sorted(self._graphs)})"


class ModelRuntime(_Identified):
    """The tickable face of one export. Construct it with :class:`RuntimeBuilder`, never directly."""

    def __init__(
        self,
        *,
        export: RuntimeExport,
        identity: RuntimeIdentity,
        ports: tuple[PortSpec, ...],
        stages: tuple[Stage, ...],
        verbs: Verbs,
        release_base: Callable[[], Any],
    ) -> None:
        self._export = export
        self._identity = identity
        self._ports = {p.name: p for p in ports}
        self._stages = stages
        self._verbs = verbs
        self._release_base = release_base
        self._bucket: str | None = None
        self._prepared: set[str | None] = set()
        self._stepping = False
        self._life = _Lifetime("model runtime", self._free)

    def _free(self) -> None:
        self._release_base()

    # -- lifetime (retain, release, refcount, released: _RefCounted) ------------------------
    # -- declaration (identity, fingerprint, fingerprint_hex: _Identified) -------------------
    @property
    def export(self) -> RuntimeExport:
        self._life.check()
        return self._export

    @property
    def regions(self) -> tuple[StateRegion, ...]:
        return self.export.regions

    @property
    def ports(self) -> Mapping[str, PortSpec]:
        self._life.check()
        return MappingProxyType(self._ports)

    @property
    def stages(self) -> tuple[Stage, ...]:
        self._life.check()
        return self._stages

    @property
    def verbs(self) -> Verbs:
        self._life.check()
        return self._verbs

    @property
    def bucket(self) -> str | None:
        """The shape bucket selected by the last ``prepare``."""
        return self._bucket

    # -- verbs -----------------------------------------------------------------------------
    def _port(self, name: str, direction: Direction) -> PortSpec:
        self._life.check()
        spec = self._ports.get(name)
        if spec is None:
            raise UnknownPort(f"no port {name!r}", field="port", limit=", ".join(self._ports))
        if spec.direction is not direction:
            raise VerbUnavailable(f"port {name!r} is an {spec.direction.value} port", field=name)
        if spec.update is UpdateClass.SETUP and self._stepping:
            raise VerbUnavailable(f"SETUP port {name!r} is not legal inside step", field=name)
        return spec

    def _window(self, spec: PortSpec) -> torch.Tensor:
        if spec.bucketed and self._bucket is None:
            raise BucketNotPrepared(
                f"port {spec.name!r} is bucket-keyed; call prepare(bucket) first", field=spec.name
            )
        return swap_window(self._export.buffers[spec.buffer], spec.shape_for(self._bucket))

    def set_input(self, port: str, value: Any) -> None:
        """SWAP: copy ``value`` into the port's buffer window. STAGED/SETUP: the set_input verb."""
        spec = self._port(port, Direction.IN)
        use_buffer = spec.update is UpdateClass.SWAP or (
            spec.update is UpdateClass.SETUP and self._verbs.set_input is None and spec.buffer
        )
        if use_buffer:
            window = self._window(spec)
            fits = isinstance(value, torch.Tensor) and value.shape == window.shape
            if not fits or value.dtype != dtype_of(spec.dtype):
                got = repr(value) if not isinstance(value, torch.Tensor) else (
                    f"{value.dtype}{tuple(value.shape)}"
                )
                raise BufferMismatch(
                    f"port {port!r} takes {spec.dtype}{tuple(window.shape)}, got {got}", field=port
                )
            window.copy_(value)  # contents only: the window's storage is what graphs read
        elif self._verbs.set_input is not None:
            self._verbs.set_input(port, value)
        else:
            raise VerbUnavailable(f"port {port!r} has no set_input verb", field=port)

    def get_output(self, port: str) -> Any:
        """SWAP: the live buffer window (valid until the next step). STAGED/SETUP: the verb."""
        spec = self._port(port, Direction.OUT)
        if spec.update is UpdateClass.SWAP or (
            spec.update is UpdateClass.SETUP and self._verbs.get_output is None and spec.buffer
        ):
            return self._window(spec)
        if self._verbs.get_output is not None:
            return self._verbs.get_output(port)
        raise VerbUnavailable(f"port {port!r} has no get_output verb", field=port)

    def prepare(self, bucket: str | None = None) -> None:
        """Warm phase: select ``bucket``, capturing or warming it up the first time it is seen.

        Never legal inside ``step``. Re-preparing a prepared bucket only selects it.
        """
        self._life.check()
        if self._stepping:
            raise VerbUnavailable("prepare is not legal inside step", field="prepare")
        for spec in self._ports.values():
            if spec.bucketed:
                spec.shape_for(bucket)  # raises, naming the port and its buckets, on a miss
        if bucket not in self._prepared:
            if self._verbs.prepare is not None:
                self._verbs.prepare(bucket)
            self._prepared.add(bucket)
        self._bucket = bucket

    def _needs_prepare(self) -> bool:
        return self._verbs.prepare is not None or any(p.bucketed for p in self._ports.values())

    def step(self) -> None:
        """Hot phase: fire the stages in declared order (or the step verb, if one was given)."""
        self._life.check()
        if self._stepping:
            raise VerbUnavailable("step is not re-entrant", field="step")
        if self._needs_prepare() and self._bucket not in self._prepared:
            raise BucketNotPrepared("no prepared bucket; call prepare(bucket) first", field="bucket")
        self._stepping = True
        try:
            if self._verbs.step is not None:
                self._verbs.step()
            else:
                graphs = self._export.graphs
                for stage in self._stages:
                    self._fire(graphs[stage.graph])
        finally:
            self._stepping = False

    def fire(self, graph: str) -> None:
        """Fire one stage's graph for the selected bucket: how a host that schedules stages
        itself (rather than calling ``step``) drives the DAG. Same legality rules as ``step``."""
        self._life.check()
        if self._stepping:
            raise VerbUnavailable("fire is not legal inside step", field="fire")
        if not any(s.graph == graph for s in self._stages):
            raise UnknownPort(f"no stage fires graph {graph!r}", field="graph",
                              limit=", ".join(s.graph for s in self._stages))
        if self._needs_prepare() and self._bucket not in self._prepared:
            raise BucketNotPrepared("no prepared bucket; call prepare(bucket) first", field="bucket")
        self._stepping = True
        try:
            self._fire(self._export.graphs[graph])
        finally:
            self._stepping = False

    def _fire(self, handle: Any) -> None:
        if isinstance(handle, GraphRunner):
            handle.replay(self._bucket)
        elif hasattr(handle, "replay"):  # e.g. a bare torch.cuda.CUDAGraph
            handle.replay()
        else:
            handle()

    def __repr__(self) -> str:
        if self.released:
            return "ModelRuntime(<released>)"
        return f"ModelRuntime(fingerprint={self.fingerprint_hex}, ports={list(self._ports)})"


class RuntimeBuilder:
    """Integrated construction. Producer fields go in the constructor; graphs, buffers, regions,
    ports, stages, verbs, manifest and owner are added; ``finish()`` validates everything and
    only then builds. A failed finish changes nothing, so the caller can correct and retry.
    """

    def __init__(
        self,
        *,
        weights_digest: str,
        precision: str,
        libraries: Mapping[str, str] | None = None,
        device_arch: str | None = None,
    ) -> None:
        self._base = RuntimeIdentity(
            weights_digest=weights_digest,
            precision=precision,
            libraries=default_libraries() if libraries is None else libraries,
            device_arch=detect_device_arch() if device_arch is None else device_arch,
        )
        self._graphs: dict[str, Any] = {}
        self._buffers: dict[str, torch.Tensor] = {}
        self._regions: list[StateRegion] = []
        self._ports: list[PortSpec] = []
        self._stages: list[Stage] = []
        self._verbs = Verbs()
        self._manifest: dict[str, Any] = {}
        self._owner: Callable[[], None] | None = None
        self._streams: dict[str, Any] = {}
        self._finished = False

    def _open(self) -> None:
        if self._finished:
            raise VerbUnavailable("this builder already produced a runtime", field="builder")

    def _add_named(self, table: dict[str, Any], kind: str, name: str, value: Any) -> "RuntimeBuilder":
        """Put ``value`` in ``table`` under a new, non-empty ``name`` (``kind``: "graph", ...)."""
        self._open()
        if not name or name in table:
            raise PortDeclarationError(f"{kind} name {name!r} is empty or taken", field=f"{kind}s")
        table[name] = value
        return self

    def add_graph(self, name: str, handle: Any) -> "RuntimeBuilder":
        return self._add_named(self._graphs, "graph", name, handle)

    def add_buffer(self, name: str, tensor: torch.Tensor) -> "RuntimeBuilder":
        return self._add_named(self._buffers, "buffer", name, tensor)

    def add_stream(self, name: str, stream: Any) -> "RuntimeBuilder":
        """A CUDA stream the graphs are replayed on (the first one added is the replay stream)."""
        return self._add_named(self._streams, "stream", name, stream)

    def set_regions(self, regions: Iterable[StateRegion]) -> "RuntimeBuilder":
        self._open()
        self._regions = list(validate_layout(regions))
        return self

    def add_port(self, spec: PortSpec) -> "RuntimeBuilder":
        self._open()
        self._ports.append(spec)
        return self

    def add_stage(self, graph: str, after: Iterable[str] = ()) -> "RuntimeBuilder":
        self._open()
        self._stages.append(Stage(graph, tuple(after)))
        return self

    def set_verbs(self, verbs: Verbs) -> "RuntimeBuilder":
        self._open()
        self._verbs = verbs
        return self

    def set_manifest(self, manifest: Mapping[str, Any]) -> "RuntimeBuilder":
        self._open()
        self._manifest = dict(manifest)
        return self

    def set_owner(self, owner: Callable[[], None] | None) -> "RuntimeBuilder":
        self._open()
        self._owner = owner
        return self

    def _export_identity(self) -> RuntimeIdentity:
        return self._base.with_layout(graph_names=self._graphs, regions=self._regions)

    def finish(self) -> ModelRuntime:
        """Export + ports + stages under one identity. Validation runs before anything is built."""
        self._open()
        ports = validate_ports(self._ports, self._verbs, self._buffers)
        stages = validate_stages(self._stages, self._graphs)
        identity = self._export_identity().with_layout(ports=ports, stages=stages)
        export = RuntimeExport(
            identity=identity, graphs=self._graphs, buffers=self._buffers,
            manifest=self._manifest, owner=self._owner, streams=self._streams,
        )
        self._finished = True
        # The runtime adopts the export's creator reference: consumers retain/release only it.
        return ModelRuntime(
            export=export, identity=identity, ports=ports, stages=stages, verbs=self._verbs,
            release_base=export.release,
        )
