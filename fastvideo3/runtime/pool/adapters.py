"""The denoiser pool's LoRA adapters: loaded and unloaded while serving, several per batch.

:class:`AdapterStore` holds every loaded adapter version on the host and a fixed number of device
*slots* (the memory budget): per adapted layer one stacked ``down`` tensor ``[slots, R, in]`` and
one ``up`` tensor ``[slots, out, R]``, rank zero-padded to ``R``. A batch that mixes adapters is
then one segmented low-rank launch per layer (:func:`fastvideo3.kernels.lora.lora_delta_`), rows
pointing at their slot (or at none).

Versions and lifetimes:

* an adapter is named ``(id, version)``; the version is its content digest. Loading a new
  version of an id makes it the *current* one; older versions stay loaded for the requests that
  were admitted with them (never yanked mid-request) until no request uses them and the host
  budget needs the room, or until the id is unloaded;
* a request pins the versions it names at its first step (:meth:`acquire`) and unpins them
  when the pool releases it; a pinned adapter keeps its slot;
* when every slot is taken, placing an adapter evicts the least recently used unpinned one
  (its host copy stays, so it comes back on demand); if all slots are pinned the request is
  refused with RESOURCE_EXHAUSTED and a retry hint;
* :meth:`unload` removes every version of an id, waiting (up to a deadline) for the requests
  that use it, and refusing (FAILED_PRECONDITION) if they are still running at the deadline.

A pool dedicated to one adapter may instead *merge* it into the weights (:meth:`merge`): no
per-row delta at all; such a pool serves only requests naming exactly that adapter and scale.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from fastvideo3.errors import FailedPrecondition, InvalidRequest, NotFound, ResourceExhausted
from fastvideo3.runtime.pool.adapter_segments import (DEFAULT_MERGE_HEADROOM_BYTES, DEFAULT_MIN_SEGMENT_TOKENS,
                                                      MAX_STREAMS, MergedSets, SegmentPlan, merge_units, runs,
                                                      units_bytes)

DEFAULT_SLOTS = 8
DEFAULT_MAX_RANK = 64
DEFAULT_HOST_BYTES = 4 << 30
#: device bytes for widened weights kept between steps (``[W | up blocks]`` per layer and slot count)
DEFAULT_WIDEN_CACHE_BYTES = 2 << 30
MAX_ADAPTERS_PER_REQUEST = 4


@dataclass
class _Entry:
    adapter: object  # LoraAdapter (host, fp32)
    source: str
    users: set[str] = field(default_factory=set)
    slot: int | None = None
    last_used: float = 0.0


def adapter_refs(value) -> list[tuple[str, str, float]]:
    """Unit params ``adapters`` -> ``[(id, version, scale)]`` (validated)."""
    out = []
    for item in value or []:
        aid, ver, scale = item["id"], item["version"], float(item["scale"])
        out.append((str(aid), str(ver), scale))
    return out


class AdapterStore:
    def __init__(self, shapes: dict[str, tuple[int, int]], device: str, dtype: torch.dtype, *,
                 slots: int = DEFAULT_SLOTS, max_rank: int = DEFAULT_MAX_RANK,
                 host_max_bytes: int = DEFAULT_HOST_BYTES, impl: str | None = None,
                 groups: dict[str, list[str]] | None = None):
        if slots < 1:
            raise InvalidRequest(f"{slots} adapter slots", field="lora_slots", limit=">= 1")
        if max_rank < 16 or max_rank & (max_rank - 1):
            raise InvalidRequest(f"{max_rank}", field="lora_max_rank", limit="a power of two >= 16")
        self.shapes, self.device, self.dtype = shapes, device, dtype
        self.n_slots, self.max_rank, self.host_max_bytes = slots, max_rank, host_max_bytes
        self.impl = impl or ("triton" if str(device).startswith("cuda") else "torch")
        self.entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()
        self.current: dict[str, str] = {}
        self.down: dict[str, torch.Tensor] = {}
        self.up: dict[str, torch.Tensor] = {}
        #: layer groups that share one input (a fused QKV; every block's cross-attention K and
        #: V): their slots live in one stacked down ``[S, G*R, in]`` / up ``[S, sum(out), R]``
        #: tensor (the members' ``down``/``up`` are views of it), so :meth:`delta_group_` runs
        #: the whole group as one shrink and one expand
        self.groups = {name: list(members) for name, members in (groups or {}).items()}
        for name, members in self.groups.items():
            if not members or len({shapes[m][0] for m in members}) != 1:
                raise ValueError(f"the members of layer group {name!r} must share one input width")
        self.group_down: dict[str, torch.Tensor] = {}
        self.group_up: dict[str, torch.Tensor] = {}
        #: the two-pass grouped kernels and widened GEMMs (True) or one one-pass launch per layer (False)
        self.grouped = True
        #: widened weights by (layer, slot blocks), valid while no slot changes; filled up to the
        #: budget in the order the forward asks (then built per call: a cyclic pass defeats LRU)
        self.widen_cache_bytes = DEFAULT_WIDEN_CACHE_BYTES
        self.widen = True  # the delta inside the layer's GEMM where widen_pays
        self.fuse_norm = True  # the expand inside the residual + norm pass
        #: that pass in two sweeps over the row tile, also running the next layer's shrink on the
        #: activations it writes (the next QKV's, or the widened input of cross-attention Q / FFN in)
        self.fuse_shrink = True
        #: split-K shrinks (fp32 partials summed in the norm pass) where a long input has few tiles
        self.split_k = True
        #: CUDA-graph safe: the batch plan and the kept widened weights are updated in place (a
        #: placement rewrites its slot's columns instead of dropping them), so one captured forward
        #: serves any adapter assignment whose slots are below the captured :attr:`blocks`
        self.static = False
        #: the number of slot blocks a widened GEMM carries; None: the highest slot in the batch + 1
        self.fixed_blocks: int | None = None
        self._plan_bufs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._pre: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._widened: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self._widened_bytes = 0
        self.merged: tuple[str, str, float] | None = None
        #: merged segments (fastvideo3.runtime.pool.adapter_segments): each adapter combination a
        #: batch names folded into a copy of the weights, each run of rows with the same adapters one
        #: GEMM per layer; the low-rank path where a segment is short or the sets do not fit
        self.merge_segments = self.impl == "triton"
        self.merged_sets = MergedSets()
        self.min_segment_tokens = DEFAULT_MIN_SEGMENT_TOKENS
        #: on CUDA each segment's GEMM on its own stream (off: on one H100 at 17x256x256 the eager
        #: step was 5.1% over no LoRA on one stream, 6.9% on four; bench/lora.py)
        self.segment_streams = False
        #: device bytes merged sets leave free for the forward's activations
        self.merge_headroom_bytes = DEFAULT_MERGE_HEADROOM_BYTES
        self._streams: list | None = None
        self._row_refs: list | None = None
        self.counters = {"loads": 0, "unloads": 0, "evictions": 0, "placements": 0}
        self._cond = threading.Condition()
        self._plan: tuple[torch.Tensor, torch.Tensor] | None = None
        self._blocks = 0  # slots 0 .. _blocks-1 cover every row of the current batch

    # -- sizes ----------------------------------------------------------------------------
    @property
    def slot_bytes(self) -> int:
        el = torch.empty(0, dtype=self.dtype).element_size()
        return sum(self.max_rank * (i + o) * el for i, o in self.shapes.values())

    @property
    def device_bytes(self) -> int:
        return self.slot_bytes * self.n_slots if self.down else 0

    def _host_bytes(self) -> int:
        return sum(e.adapter.nbytes for e in self.entries.values())

    # -- load / unload ----------------------------------------------------------------------
    def load(self, adapter, source: str = "") -> dict:
        """Add a version (idempotent); it becomes the id's current version."""
        if adapter.rank > self.max_rank:
            raise InvalidRequest(f"adapter {adapter.adapter_id} has rank {adapter.rank}", field="adapter",
                                 limit=f"rank <= {self.max_rank}")
        if self.merged is not None:
            raise FailedPrecondition("this pool serves one merged adapter; it loads no others", field="adapter")
        key = (adapter.adapter_id, adapter.version)
        with self._cond:
            if key not in self.entries:
                self._make_host_room(adapter.nbytes)
                self.entries[key] = _Entry(adapter, source, last_used=time.monotonic())
                self.counters["loads"] += 1
            self.current[adapter.adapter_id] = adapter.version
            self.entries.move_to_end(key)
            return {"id": key[0], "version": key[1], "rank": adapter.rank, "bytes": adapter.nbytes}

    def _make_host_room(self, need: int) -> None:
        while self._host_bytes() + need > self.host_max_bytes:
            victim = next((k for k, e in self.entries.items()
                           if not e.users and self.current.get(k[0]) != k[1]), None)
            victim = victim or next((k for k, e in self.entries.items() if not e.users), None)
            if victim is None:
                raise ResourceExhausted("every loaded adapter is in use", field="adapter",
                                        limit=f"{self.host_max_bytes} host bytes", retry_after_s=5.0)
            self._drop(victim)

    def _drop(self, key) -> None:
        e = self.entries.pop(key)
        self.merged_sets.drop(lambda k: any((a, v) == key for a, v, _ in k))
        if self.current.get(key[0]) == key[1]:
            del self.current[key[0]]
        if e.slot is not None:
            self._clear_slot(e.slot)

    def unload(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        """Remove every version of ``adapter_id``; waits up to ``wait_s`` for requests using it.
        Returns the versions removed."""
        if not 0.0 <= wait_s <= 3600.0:
            raise InvalidRequest(f"{wait_s}", field="wait_s", limit="[0, 3600]")
        with self._cond:
            keys = [k for k in self.entries if k[0] == adapter_id]
            if not keys:
                raise NotFound(f"adapter {adapter_id!r} is not loaded", field="adapter_id")
            if self.merged is not None and self.merged[0] == adapter_id:
                raise FailedPrecondition(f"adapter {adapter_id!r} is merged into the weights; restart the pool "
                                         "to remove it", field="adapter_id")
            deadline = time.monotonic() + wait_s
            while any(self.entries[k].users for k in keys if k in self.entries):
                left = deadline - time.monotonic()
                if left <= 0:
                    users = sorted({u for k in keys if k in self.entries for u in self.entries[k].users})
                    raise FailedPrecondition(f"adapter {adapter_id!r} is in use by {len(users)} request(s)",
                                             field="adapter_id", details={"requests": users[:8]})
                self._cond.wait(left)
            removed = [k[1] for k in keys if k in self.entries]
            for k in keys:
                if k in self.entries:
                    self._drop(k)
            self.counters["unloads"] += 1
            return removed

    # -- requests -------------------------------------------------------------------------
    def check(self, refs: list[tuple[str, str, float]]) -> None:
        """Refuse (before anything steps) a request naming an adapter not loaded here."""
        if len(refs) > MAX_ADAPTERS_PER_REQUEST:
            raise InvalidRequest(f"{len(refs)} adapters", field="adapters", limit=f"<= {MAX_ADAPTERS_PER_REQUEST}")
        if self.merged is not None:
            want = [self.merged]
            if [(a, v, round(s, 6)) for a, v, s in refs] != [(a, v, round(s, 6)) for a, v, s in want]:
                raise FailedPrecondition(f"this pool has adapter {self.merged[0]}@{self.merged[1]} (scale "
                                         f"{self.merged[2]}) merged into its weights and serves only it",
                                         field="adapters")
            return
        for aid, ver, _ in refs:
            if (aid, ver) not in self.entries:
                known = self.current.get(aid)
                hint = f" (loaded version: {known})" if known else ""
                raise NotFound(f"adapter {aid}@{ver} is not loaded{hint}", field="adapters",
                               details={"adapter": aid, "version": ver})

    def acquire(self, request_id: str, refs: list[tuple[str, str, float]]) -> None:
        """Pin the request's adapters and make them device resident."""
        self.check(refs)
        if self.merged is not None:
            return
        with self._cond:
            for aid, ver, _ in refs:
                e = self.entries[(aid, ver)]
                e.users.add(request_id)
                e.last_used = time.monotonic()
                self.entries.move_to_end((aid, ver))
                if e.slot is None:
                    self._place(e)

    def release(self, request_id: str) -> None:
        with self._cond:
            for e in self.entries.values():
                e.users.discard(request_id)
            self._cond.notify_all()

    def users(self, adapter_id: str) -> int:
        with self._cond:
            return len({u for k, e in self.entries.items() if k[0] == adapter_id for u in e.users})

    # -- device slots ---------------------------------------------------------------------
    def _alloc(self) -> None:
        s, r = self.n_slots, self.max_rank
        for group, members in self.groups.items():
            k_in = self.shapes[members[0]][0]
            outs = [self.shapes[m][1] for m in members]
            down = torch.zeros(s, r * len(members), k_in, device=self.device, dtype=self.dtype)
            up = torch.zeros(s, sum(outs), r, device=self.device, dtype=self.dtype)
            self.group_down[group], self.group_up[group] = down, up
            off = 0
            for j, (m, o) in enumerate(zip(members, outs)):
                self.down[m] = down[:, j * r:(j + 1) * r]
                self.up[m] = up[:, off:off + o]
                off += o
        for name, (k_in, k_out) in self.shapes.items():
            if name in self.down:
                continue
            self.down[name] = torch.zeros(s, r, k_in, device=self.device, dtype=self.dtype)
            self.up[name] = torch.zeros(s, k_out, r, device=self.device, dtype=self.dtype)

    def _drop_widened(self) -> None:
        self._widened.clear()
        self._widened_bytes = 0

    def _widened_weight(self, layer: str, w: torch.Tensor, blocks: int) -> torch.Tensor:
        from fastvideo3.kernels.lora_grouped import widen_weight
        hit = self._widened.get((layer, blocks))
        if hit is not None and hit[0] is w:
            return hit[1]
        ww = widen_weight(w, self.up[layer], blocks)
        nbytes = ww.numel() * ww.element_size()
        if hit is None and self._widened_bytes + nbytes <= self.widen_cache_bytes:
            self._widened[(layer, blocks)] = (w, ww)
            self._widened_bytes += nbytes
        return ww

    def _clear_slot(self, slot: int) -> None:
        for name in self.down:
            self.down[name][slot].zero_()
            self.up[name][slot].zero_()
        self._sync_widened(slot) if self.static else self._drop_widened()

    def _sync_widened(self, slot: int) -> None:
        """Static mode: rewrite ``slot``'s up columns of every kept widened weight in place."""
        r = self.max_rank
        for (layer, blocks), (w, ww) in self._widened.items():
            if slot < blocks:
                k = w.shape[1]
                ww[:, k + slot * r:k + (slot + 1) * r].copy_(self.up[layer][slot])

    def _place(self, e: _Entry) -> None:
        if not self.down:
            self._alloc()
        used = {x.slot for x in self.entries.values() if x.slot is not None}
        free = [s for s in range(self.n_slots) if s not in used]
        if not free:
            victims = sorted((x for x in self.entries.values() if x.slot is not None and not x.users),
                             key=lambda x: x.last_used)
            if not victims:
                raise ResourceExhausted("every adapter slot is held by running requests", field="adapters",
                                        limit=f"{self.n_slots} slots", retry_after_s=2.0)
            free = [victims[0].slot]
            victims[0].slot = None
            self.counters["evictions"] += 1
        slot = free[0]
        self._clear_slot(slot)
        for name, (down, up) in e.adapter.layers.items():
            r = down.shape[0]
            self.down[name][slot, :r].copy_(down)
            self.up[name][slot, :, :r].copy_(up)
        e.slot = slot
        self._sync_widened(slot) if self.static else self._drop_widened()
        self.counters["placements"] += 1

    # -- the per-row delta -----------------------------------------------------------------
    @contextmanager
    def batch(self, row_refs: list[list[tuple[str, str, float]]]):
        """Within the block, the adapted layers add each row's delta (rows as in the forward)."""
        if self.merged is not None or not any(row_refs):
            yield
            return
        width = max(len(r) for r in row_refs)
        slots = torch.full((width, len(row_refs)), -1, dtype=torch.int32)
        scales = torch.zeros((width, len(row_refs)), dtype=torch.float32)
        for row, refs in enumerate(row_refs):
            for j, (aid, ver, scale) in enumerate(refs):
                e = self.entries[(aid, ver)]  # pinned by acquire: resident and slotted
                slots[j, row], scales[j, row] = e.slot, scale
        blocks = int(slots.max()) + 1  # host tensors: no device sync
        if self.fixed_blocks is not None:
            if blocks > self.fixed_blocks:
                raise InvalidRequest(f"slot {blocks - 1}", field="adapters",
                                     limit=f"slots < fixed_blocks {self.fixed_blocks}")
            blocks = self.fixed_blocks
        # one device buffer per plan shape, rewritten per batch: a captured forward reads the
        # assignment of the batch it replays
        bufs = self._plan_bufs.get(tuple(slots.shape))
        if bufs is None:
            bufs = (torch.empty_like(slots, device=self.device), torch.empty_like(scales, device=self.device))
            self._plan_bufs[tuple(slots.shape)] = bufs
        bufs[0].copy_(slots)
        bufs[1].copy_(scales)
        self._plan, self._blocks, self._row_refs = bufs, blocks, row_refs
        try:
            yield
        finally:
            self._plan = self._row_refs = None
            self._pre.clear()

    @contextmanager
    def subset(self, rows: list[int] | None):
        """Within an open batch: the plan of only ``rows`` of it, for a forward over those rows alone
        (a staged forward running some requests' blocks); the batch's plan comes back after. ``None``
        or outside a batch: nothing changes."""
        if rows is None or self._row_refs is None:
            yield
            return
        saved = (self._plan, self._blocks, self._row_refs, dict(self._pre))
        sub = [saved[2][r] for r in rows]
        try:
            if any(sub):
                with self.batch(sub):
                    yield
            else:
                self._plan = self._row_refs = None
                yield
        finally:
            self._plan, self._blocks, self._row_refs = saved[:3]
            self._pre = saved[3]

    @property
    def blocks(self) -> int:
        """The slot blocks of the current batch's widened GEMMs (part of a captured graph's shape)."""
        return self._blocks

    @property
    def active(self) -> bool:
        return self._plan is not None

    def segments(self, model, tokens: int) -> SegmentPlan | None:
        """The current batch as merged segments for ``model`` (whose ``lora_units()`` are its adapted
        GEMMs) at ``tokens`` per row, or None for the low-rank path (why: ``merged_sets.last_fallback``).
        Builds the sets the batch lacks, evicting unused ones past ``merged_sets.budget``."""
        if not (self.merge_segments and self._plan is not None and self._row_refs):
            return None
        sets, segs = self.merged_sets, runs(self._row_refs)
        units = model.lora_units()
        need = units_bytes(units)
        keys = {k for _, _, k in segs if k}
        why = None
        if self.static:
            why = "static (CUDA-graph) mode: a captured forward serves any assignment"
        elif min((e - s) * tokens for s, e, _ in segs) < self.min_segment_tokens:
            why = f"a segment of under {self.min_segment_tokens} tokens"
        else:
            ref = (id(model), next(iter(units.values()))[0].data_ptr())
            if sets.model_ref != ref:
                sets.drop()
                sets.model_ref = ref
            missing = [k for k in keys if k not in sets.sets]
            if not sets.make_room(need * len(missing), keep=keys):
                why = f"{len(keys)} merged sets of {need} bytes exceed merge_cache_bytes {sets.budget}"
            elif missing and self._device_room() < need * len(missing) + self.merge_headroom_bytes:
                why = (f"{len(missing)} new merged sets of {need} bytes do not fit the device's free memory "
                       f"with {self.merge_headroom_bytes} bytes to spare")
        plan = None
        if why is None:
            build = lambda key: merge_units(units, key, self._layer_delta, self.dtype)  # noqa: E731
            try:
                plan = [(s, e, sets.get(k, need, build) if k else None) for s, e, k in segs]
            except torch.OutOfMemoryError:
                sets.drop(lambda k: k in missing)
                why = "out of device memory while merging"
        if why is not None:
            sets.counters["fallbacks"] += 1
            sets.last_fallback = why
            return None
        sets.counters["segment_forwards"] += 1
        return SegmentPlan(plan, self._segment_streams(len(plan)))

    def _device_room(self) -> int:
        """Bytes the device can still give: free memory plus what the caching allocator holds unused."""
        if not str(self.device).startswith("cuda"):
            return 1 << 62
        free, _ = torch.cuda.mem_get_info(self.device)
        return free + torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)

    def _layer_delta(self, ref: tuple[str, str, float], layer: str) -> torch.Tensor | None:
        """``up @ down`` of ``layer`` for the adapter of ``ref`` (from its device slot, fp32), or None."""
        e = self.entries[(ref[0], ref[1])]
        if layer not in e.adapter.layers or e.slot is None:
            return None
        return self.up[layer][e.slot].float() @ self.down[layer][e.slot].float()

    def _segment_streams(self, n: int) -> list | None:
        if not (self.segment_streams and str(self.device).startswith("cuda") and n > 1):
            return None
        if self._streams is None:
            self._streams = [torch.cuda.Stream(device=self.device) for _ in range(MAX_STREAMS)]
        return self._streams[:min(n, MAX_STREAMS)]

    def delta_(self, layer: str, x: torch.Tensor, y: torch.Tensor, act: str | None = None) -> None:
        """Add the current batch's per-row delta of ``layer`` to ``y``; with ``act`` apply that
        activation to all of ``y`` afterwards, in the same pass (must be inside a batch)."""
        if self._plan is None:
            raise RuntimeError("delta_ outside AdapterStore.batch()")
        from fastvideo3.kernels.lora import lora_delta_
        slots, scales = self._plan
        last = slots.shape[0] - 1
        if self.grouped and self.impl == "triton":  # two passes: the input is read once
            from fastvideo3.kernels.lora_grouped import lora_group_delta_
            for j in range(slots.shape[0]):
                lora_group_delta_(x, y, self.down[layer], self.up[layer], slots[j], scales[j], impl="triton",
                                  act=act if j == last else None)
            return
        for j in range(slots.shape[0]):
            lora_delta_(x, y, self.down[layer], self.up[layer], slots[j], scales[j], impl=self.impl,
                        act=act if j == last else None)

    def linear(self, layer: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor, gemm=None,
               act: str | None = None) -> torch.Tensor:
        """``layer``'s output with the current batch's per-row delta (and then ``act``):
        ``gemm(x, w, bias)`` is the layer's GEMM (with ``act`` fused, when given; default
        ``F.linear``). On the Triton path, where :func:`~fastvideo3.kernels.lora_grouped.widen_pays`,
        the delta goes *inside* that GEMM: its input widened by each row's down projection in
        its slot's block, its weight by the up weights (one GEMM, the epilogue kept); otherwise
        the plain GEMM and :meth:`delta_`."""
        import torch.nn.functional as F
        from fastvideo3.kernels import lora_grouped as lg
        if self._plan is None:
            raise RuntimeError("linear outside AdapterStore.batch()")
        slots, scales = self._plan
        k, out = self.shapes[layer]
        if self._widens(layer):
            pre = self._pre.pop(layer, None)
            if pre is not None and pre[0] is x:  # the norm pass wrote it (delta_add_norm's next)
                xw = pre[1]
            else:
                xw = lg.lora_widen(x, self.down[layer], slots[0], scales[0], self._blocks, impl="triton")
            return (gemm or F.linear)(xw, self._widened_weight(layer, w, self._blocks), bias)
        y = F.linear(x, w, bias)
        self.delta_(layer, x, y, act=act)
        return y

    def _widens(self, layer: str) -> bool:
        """Whether :meth:`linear` puts ``layer``'s delta inside its (widened) GEMM."""
        from fastvideo3.kernels import lora_grouped as lg
        if not (self.grouped and self.widen and self.impl == "triton" and self._plan is not None
                and self._plan[0].shape[0] == 1 and layer in self.shapes):
            return False
        k, out = self.shapes[layer]
        return lg.widen_pays(k, out, self._blocks * self.max_rank, torch.empty(0, dtype=self.dtype).element_size())

    @property
    def fuses_norm(self) -> bool:
        """Whether :meth:`delta_add_norm` fuses (the Triton path, one adapter per row)."""
        return (self._plan is not None and self.grouped and self.fuse_norm and self.impl == "triton"
                and self._plan[0].shape[0] == 1)

    def delta_add_norm(self, layer: str, x_in: torch.Tensor, y: torch.Tensor, x: torch.Tensor, gate, a, b, *,
                       modulate: bool, eps: float, norm_impl: str = "torch", next: str | None = None) -> torch.Tensor:
        """``layer``'s delta added to its output ``y`` (input ``x_in``), then ``add_norm(x, y, gate,
        a, b)`` (``x`` updated in place; the normed activations returned). Where
        :attr:`fuses_norm`: one shrink, and the expand inside the residual + norm pass
        (:mod:`fastvideo3.kernels.lora_norm`), so ``y`` is never written back.

        ``next``: the adapted layer (or layer group) that reads the returned activations next.
        With :attr:`fuse_shrink` the norm pass also runs its shrink (a widened GEMM's input, or
        a group's stacked down projection), which :meth:`linear` / :meth:`delta_group_` then use
        when they get this very tensor."""
        from fastvideo3.kernels.fused import add_norm
        if self._plan is None:
            raise RuntimeError("delta_add_norm outside AdapterStore.batch()")
        if self.fuses_norm and self.fuse_shrink:
            return self._delta_add_norm_next(layer, x_in, y, x, gate, a, b, modulate=modulate, eps=eps, next=next)
        if self.fuses_norm:
            from fastvideo3.kernels.lora_grouped import lora_shrink
            from fastvideo3.kernels.lora_norm import lora_add_norm
            slots, scales = self._plan
            xa = lora_shrink(x_in, self.down[layer], slots[0], scales[0])
            return lora_add_norm(xa, self.up[layer], slots[0], x, y, gate, a, b, modulate=modulate, eps=eps,
                                 impl="triton")
        self.delta_(layer, x_in, y)
        return add_norm(x, y, gate, a, b, modulate=modulate, eps=eps, impl=norm_impl)

    def _delta_add_norm_next(self, layer, x_in, y, x, gate, a, b, *, modulate, eps, next):
        from fastvideo3.kernels.lora_norm import lora_add_norm_next
        from fastvideo3.kernels.lora_shrink import choose_split, lora_shrink_split
        slots, scales = self._plan
        bsz, n, k = x_in.shape
        split = choose_split(n, bsz, 1, k) if self.split_k else 1
        xa = lora_shrink_split(x_in, self.down[layer], slots[0], scales[0], split=split)
        src = {"xa": xa} if split == 1 else {"xa": None, "xa_parts": xa}
        nd, wide = None, 0
        if next is not None and self._widens(next):
            nd, wide = self.down[next], self._blocks
        elif next is not None and next in self.groups:
            nd = self.group_down[next]
        out = lora_add_norm_next(scales=scales[0], up=self.up[layer], slots=slots[0], x=x, y=y, gate=gate, a=a, b=b,
                                 modulate=modulate, eps=eps, next_down=nd, wide=wide, impl="triton", **src)
        if nd is None:
            return out
        self._pre[next] = out  # (h, the widened input [h | E] or the group's stacked down projection)
        return out[0]

    def delta_group_(self, group: str, members: list[str], x: torch.Tensor, y: torch.Tensor) -> None:
        """Add the current batch's per-row deltas of ``members`` (layers sharing the input ``x``)
        to ``y``, their outputs side by side in that order. When the store holds ``group`` with
        these members (and the grouped kernels are on): one shrink and one expand for all of
        them; otherwise one :meth:`delta_` per member on its slice of ``y``."""
        if self._plan is None:
            raise RuntimeError("delta_group_ outside AdapterStore.batch()")
        pre = self._pre.pop(group, None)
        if self.grouped and self.groups.get(group) == list(members):
            from fastvideo3.kernels.lora_grouped import lora_expand_, lora_group_delta_
            slots, scales = self._plan
            down, up = self.group_down[group], self.group_up[group]
            if self.impl == "triton" and slots.shape[0] == 1 and self.fuse_shrink:
                if pre is not None and pre[0] is x:  # the norm pass ran the shrink
                    xa = pre[1]
                else:
                    from fastvideo3.kernels.lora_shrink import lora_shrink_split
                    xa = lora_shrink_split(x, down, slots[0], scales[0], groups=len(members))
                lora_expand_(xa, y, up, slots[0], groups=len(members))
                return
            for j in range(slots.shape[0]):
                lora_group_delta_(x, y, down, up, slots[j], scales[j], groups=len(members), impl=self.impl)
            return
        off = 0
        for m in members:
            o = self.shapes[m][1]
            self.delta_(m, x, y[..., off:off + o])
            off += o

    def hook(self, model: torch.nn.Module, linears: dict[str, torch.nn.Module]) -> list:
        """Forward hooks on the reference model's adapted layers; returns their handles."""
        handles = []
        for name, mod in linears.items():
            def fn(_mod, args, out, _name=name):
                if self._plan is not None:
                    self.delta_(_name, args[0], out)
                return out
            handles.append(mod.register_forward_hook(fn))
        return handles

    def describe(self) -> dict:
        with self._cond:
            return {
                "mode": "merged" if self.merged else "per_row",
                "merged": ({"id": self.merged[0], "version": self.merged[1], "scale": self.merged[2]}
                           if self.merged else None),
                "slots": self.n_slots, "max_rank": self.max_rank, "kernel": self.impl,
                "device_bytes": self.device_bytes, "host_bytes": self._host_bytes(),
                "host_max_bytes": self.host_max_bytes,
                "widened_weight_bytes": self._widened_bytes, "widen_cache_bytes": self.widen_cache_bytes,
                "adapters": [{"id": k[0], "version": k[1], "current": self.current.get(k[0]) == k[1],
                              "rank": e.adapter.rank, "bytes": e.adapter.nbytes, "slot": e.slot,
                              "in_use": len(e.users), "source": e.source}
                             for k, e in self.entries.items()],
                "counters": dict(self.counters),
                "merged_segments": {"enabled": self.merge_segments, "min_segment_tokens": self.min_segment_tokens,
                                    **self.merged_sets.describe()},
            }
