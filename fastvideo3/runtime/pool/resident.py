"""Snapshots of a request's pool-resident regions, bound to the pool's runtime fingerprint.

A denoiser keeps two things per request that no LoopState holds: the latent and the sampler
history. :func:`snapshot_regions` writes them as an :class:`fastvideo3.export.Snapshot` whose
fingerprint covers the pool's identity (weights digest, precision, library versions, device
architecture) *and* the request's ordered region layout; :func:`restore_regions` rebuilds them
only on a pool whose identity is the same, else it raises
:class:`~fastvideo3.export.FingerprintMismatch` (FAILED_PRECONDITION at the service edge) before
anything is written. A snapshot moves a request between replicas of one deployment, or back to
an earlier step after a scheduler restart; it never crosses a change of weights or precision.

Region order (contractual, fingerprinted): ``latent``, ``history.meta`` (int64:
``[step, order, lower_order_nums, this_order, has_last, present_0 .. present_{order-1}]``), then
``history.model_output.<i>`` for each present output and ``history.last_sample`` if present, then
the request's interceptor tensors (``plugin/<policy>/<stream>/<name>``, sorted).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fastvideo3.export.errors import RegionLayoutError
from fastvideo3.export.identity import RuntimeIdentity, default_libraries, detect_device_arch, fingerprint_hex
from fastvideo3.export.regions import Snapshot, StateRegion, pack_regions, restore, snapshot
from fastvideo3.loop.samplers import SamplerHistory

META = "history.meta"
PLUGIN = "plugin"
_META_FIXED = 5  # step, order, lower_order_nums, this_order, has_last


def pool_identity(weights_digest: str, precision: str, device: str | torch.device | None = None) -> RuntimeIdentity:
    """The identity a pool's snapshots are bound to (no region layout: that is per request)."""
    return RuntimeIdentity(weights_digest=weights_digest or "none", precision=precision or "none",
                           libraries=default_libraries(), device_arch=detect_device_arch(device))


def pool_fingerprint(identity: RuntimeIdentity) -> str:
    """The text form a pool advertises (Describe, Snapshot/Restore RPCs)."""
    return "fnv1a64:" + identity.fingerprint_hex


@dataclass(frozen=True)
class _Binding:
    """What :func:`fastvideo3.export.snapshot` / ``restore`` read of a runtime: fingerprint + layout."""

    fingerprint: int
    regions: tuple[StateRegion, ...]


def _bind(identity: RuntimeIdentity, regions: tuple[StateRegion, ...]) -> _Binding:
    return _Binding(identity.with_layout(regions=regions).fingerprint, regions)


def snapshot_tensors(identity: RuntimeIdentity, named: list[tuple[str, torch.Tensor]]) -> bytes:
    """Serialize ``(name, tensor)`` pairs, in order, bound to ``identity`` plus their layout."""
    tensors = [t.detach().to("cpu").contiguous() for _, t in named]
    regions = pack_regions([(n, t.dtype, tuple(t.shape)) for (n, _), t in zip(named, tensors)])
    return snapshot(tensors, _bind(identity, regions)).to_bytes()


def restore_tensors(identity: RuntimeIdentity, blob: bytes) -> dict[str, torch.Tensor]:
    """Tensors of a snapshot written by a pool with the same identity (else FingerprintMismatch)."""
    snap = Snapshot.from_bytes(blob)
    return restore(snap, _bind(identity, tuple(snap.regions)))


def snapshot_fingerprint(blob: bytes) -> str:
    """The fingerprint a snapshot is bound to (identity + layout), for messages."""
    return fingerprint_hex(Snapshot.from_bytes(blob).fingerprint)


# -- the denoiser's regions -----------------------------------------------------------------

def snapshot_regions(identity: RuntimeIdentity, latent: torch.Tensor, history: SamplerHistory, step: int,
                     plugin: dict[str, dict[str, torch.Tensor]] | None = None) -> bytes:
    meta = history.meta()
    head = [int(step), int(meta["order"]), int(meta["lower_order_nums"]), int(meta["this_order"]),
            int(meta["has_last"])] + [int(p) for p in meta["present"]]
    named = [("latent", latent), (META, torch.tensor(head, dtype=torch.int64))]
    named += [(f"history.{k}", v) for k, v in history.tensors().items() if k.startswith("model_output.")]
    if history.last_sample is not None:
        named.append(("history.last_sample", history.last_sample))
    for key in sorted(plugin or {}):  # interceptor tensors: plugin/<policy>/<stream>/<name>
        named += [(f"{PLUGIN}/{key}/{name}", t) for name, t in sorted(plugin[key].items())]
    return snapshot_tensors(identity, named)


def restore_regions(identity: RuntimeIdentity, blob: bytes, device: str | torch.device = "cpu", *,
                    with_plugin: bool = False):
    """``(latent, history, step)`` from a denoiser snapshot (``with_plugin``: and the interceptor
    tensors, ``{"policy/stream": {name: tensor}}``); refuses another identity or layout."""
    tensors = restore_tensors(identity, blob)
    plugin: dict[str, dict[str, torch.Tensor]] = {}
    for name in [n for n in tensors if n.startswith(PLUGIN + "/")]:
        parts = name.split("/")
        if len(parts) != 4:
            raise RegionLayoutError(f"malformed interceptor region {name!r}", field="regions")
        plugin.setdefault(f"{parts[1]}/{parts[2]}", {})[parts[3]] = tensors.pop(name).to(device)
    if "latent" not in tensors or META not in tensors:
        raise RegionLayoutError("not a denoiser snapshot (needs 'latent' and 'history.meta')", field="regions")
    head = [int(x) for x in tensors[META].tolist()]
    if len(head) < _META_FIXED or len(head) != _META_FIXED + head[1]:
        raise RegionLayoutError(f"malformed {META} of {len(head)} values", field=f"regions.{META}")
    step, order, lower, this_order, has_last = head[:_META_FIXED]
    present = [bool(p) for p in head[_META_FIXED:]]
    hist = {k.removeprefix("history."): v.to(device) for k, v in tensors.items() if k.startswith("history.")
            and k != META}
    history = SamplerHistory.rebuild({"order": order, "lower_order_nums": lower, "this_order": this_order,
                                      "present": present, "has_last": bool(has_last)}, hist)
    if sum(present) != sum(k.startswith("model_output.") for k in hist) or bool(has_last) != ("last_sample" in hist):
        raise RegionLayoutError("history regions disagree with history.meta", field="regions")
    if with_plugin:
        return tensors["latent"].to(device), history, step, plugin
    return tensors["latent"].to(device), history, step
