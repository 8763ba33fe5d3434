"""Ports: how inputs enter a model runtime and outputs leave it, typed by update class.

The update class is the load-bearing field; it splits the hot path in two speeds:

* ``SWAP`` -- the port is a window onto a device buffer of the export. ``set_input`` copies the
  caller's tensor straight into that window (``get_output`` returns the window itself); no model
  code runs. Used for latents, noise, timesteps: anything already in its final layout.
* ``STAGED`` -- the runtime's own ``set_input`` / ``get_output`` verb transforms the value
  (tokenize, resize, embed, decode) into or out of bound buffers.
* ``SETUP`` -- legal only outside a ``step``: configuration that may re-plan buffers.

For both hot classes: nothing is recaptured, allocated or rebound during a step -- only buffer
contents change. A port's shape is fixed, or keyed by shape bucket (the bucket chosen by
``prepare``).

Construction is fail-closed (:func:`validate_ports`): a STAGED input without a ``set_input``
verb, or a STAGED output without ``get_output``, is refused with an error naming the port. The
same check runs on every construction path, before anything is retained.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import torch

from fastvideo3.export.errors import PortDeclarationError
from fastvideo3.export.regions import dtype_name, dtype_of


class UpdateClass(enum.Enum):
    SWAP = "swap"
    STAGED = "staged"
    SETUP = "setup"


class Direction(enum.Enum):
    IN = "in"
    OUT = "out"


def _dims(shape: Iterable[int], port: str) -> tuple[int, ...]:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise PortDeclarationError(f"negative dimension in {dims}", field=f"ports.{port}")
    return dims


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


@dataclass(frozen=True)
class PortSpec:
    """One port. Exactly one of ``shape`` (fixed) or ``buckets`` (bucket key -> shape) is set.

    ``buckets`` may be given as a mapping; it is stored as sorted ``(key, shape)`` pairs so the
    spec stays an immutable, hashable value.

    ``buffer`` names the export buffer a SWAP port is a window onto (required for SWAP,
    optional for SETUP, unused for STAGED, whose verbs own the binding).
    """

    name: str
    direction: Direction
    dtype: str
    shape: tuple[int, ...] | None = None
    buckets: Mapping[str, tuple[int, ...]] | tuple[tuple[str, tuple[int, ...]], ...] | None = None
    update: UpdateClass = UpdateClass.STAGED
    buffer: str | None = None

    def __post_init__(self) -> None:
        where = f"ports.{self.name}"
        if not self.name:
            raise PortDeclarationError("port name must not be empty", field="ports")
        try:
            object.__setattr__(self, "direction", Direction(self.direction))
            object.__setattr__(self, "update", UpdateClass(self.update))
        except ValueError as exc:
            raise PortDeclarationError(str(exc), field=where) from exc
        object.__setattr__(self, "dtype", dtype_name(self.dtype))
        if (self.shape is None) == (self.buckets is None):
            raise PortDeclarationError("give exactly one of shape or buckets", field=where)
        if self.shape is not None:
            object.__setattr__(self, "shape", _dims(self.shape, self.name))
        else:
            pairs = self.buckets.items() if isinstance(self.buckets, Mapping) else self.buckets
            pairs = tuple(sorted((str(k), _dims(v, self.name)) for k, v in pairs))
            keys = [k for k, _ in pairs]
            if not pairs or any(not k for k in keys) or len(set(keys)) != len(keys):
                raise PortDeclarationError("buckets need unique, non-empty keys", field=where)
            object.__setattr__(self, "buckets", pairs)
        if self.update is UpdateClass.SWAP and not self.buffer:
            raise PortDeclarationError("a SWAP port must name the buffer it windows", field=where)
        if self.update is UpdateClass.STAGED and self.buffer:
            raise PortDeclarationError("a STAGED port binds buffers through its verbs", field=where)

    @property
    def bucketed(self) -> bool:
        return self.buckets is not None

    @property
    def bucket_shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self.buckets or ())

    def shape_for(self, bucket: str | None) -> tuple[int, ...]:
        """The port's shape in ``bucket`` (ignored for fixed-shape ports)."""
        if self.shape is not None:
            return self.shape
        shapes = self.bucket_shapes
        if bucket not in shapes:
            raise PortDeclarationError(
                f"no shape for bucket {bucket!r}", field=f"ports.{self.name}",
                limit=", ".join(shapes),
            )
        return shapes[bucket]

    def max_numel(self) -> int:
        shapes = [self.shape] if self.shape is not None else [s for _, s in self.buckets]
        return max(math.prod(s) for s in shapes)

    def identity_fields(self) -> tuple[str | tuple[str, ...], ...]:
        if self.shape is not None:
            kind, shapes = "fixed", (_shape_text(self.shape),)
        else:
            kind, shapes = "bucketed", tuple(f"{k}:{_shape_text(v)}" for k, v in self.buckets)
        return (
            self.name, self.direction.value, self.update.value, self.dtype, kind, shapes,
            self.buffer or "",
        )


@dataclass(frozen=True)
class Verbs:
    """The callable face of a model runtime. Any verb may be absent (``None``).

    * ``set_input(port_name, value)`` -- STAGED (and verb-backed SETUP) inputs.
    * ``get_output(port_name) -> value`` -- STAGED outputs.
    * ``prepare(bucket)`` -- capture or warm up for a shape bucket; called outside any step.
    * ``step()`` -- replaces the default "fire stages in declared order".
    """

    set_input: Callable[[str, Any], None] | None = None
    get_output: Callable[[str], Any] | None = None
    prepare: Callable[[str | None], None] | None = None
    step: Callable[[], None] | None = None


def swap_window(buffer: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The leading ``prod(shape)`` elements of a contiguous buffer, viewed as ``shape``."""
    return buffer.view(-1)[: math.prod(shape)].view(shape)


def validate_ports(
    ports: Iterable[PortSpec], verbs: Verbs, buffers: Mapping[str, torch.Tensor]
) -> tuple[PortSpec, ...]:
    """Check a port declaration against the verbs and buffers that must back it.

    Pure: it raises :class:`PortDeclarationError` (``field`` = ``ports.<name>``) or returns the
    ports unchanged, and never retains, allocates or mutates anything.
    """
    ports = tuple(ports)
    seen: set[str] = set()
    for p in ports:
        if not isinstance(p, PortSpec):
            raise PortDeclarationError(f"{p!r} is not a PortSpec", field="ports")
        where = f"ports.{p.name}"
        if p.name in seen:
            raise PortDeclarationError(f"duplicate port {p.name!r}", field=where)
        seen.add(p.name)
        if p.update is UpdateClass.STAGED:
            if p.direction is Direction.IN and verbs.set_input is None:
                raise PortDeclarationError(
                    f"STAGED input port {p.name!r} needs a set_input verb", field=where
                )
            if p.direction is Direction.OUT and verbs.get_output is None:
                raise PortDeclarationError(
                    f"STAGED output port {p.name!r} needs a get_output verb", field=where
                )
        if p.buffer is not None:
            buf = buffers.get(p.buffer)
            if buf is None:
                raise PortDeclarationError(f"unknown buffer {p.buffer!r}", field=where)
            if buf.dtype != dtype_of(p.dtype):
                raise PortDeclarationError(
                    f"buffer {p.buffer!r} is {buf.dtype}, port is {p.dtype}", field=where
                )
            if not buf.is_contiguous():
                raise PortDeclarationError(f"buffer {p.buffer!r} is not contiguous", field=where)
            if buf.numel() < p.max_numel():
                raise PortDeclarationError(
                    f"buffer {p.buffer!r} holds {buf.numel()} elements, port needs "
                    f"{p.max_numel()}", field=where,
                )
    return ports
