"""NIXL transport: one-sided READs through the NIXL library's UCX backend.

Owner: every slab (a uint8 tensor in host memory, or in VRAM for CUDA tensors) is registered
with the owner's NIXL agent once, when the slab is created, and deregistered only when the slab
is evicted; released buffers go back to the slab pool. ``publish`` copies the tensor into a
slab and writes the generation trailer. The ref's descriptor carries the agent name, the
region (``addr``, ``len``, ``dev``, ``mem``), the generation and, unless
``inline_metadata=False``, that slab's partial agent metadata (base64, a few hundred bytes:
connection info plus the slab's remote key). Without inline metadata a reader must have loaded
the owner's metadata through the fleet's side channel: ``owner.agent_metadata()`` is carried in
the pool's Describe reply and fed to ``reader.add_peer(...)``.

Reader: its own agent loads the owner's metadata when it first needs a region, takes a
destination buffer, posts a READ, and polls ``check_xfer_state`` with a short backoff until
DONE or ERR or the deadline. One READ carries two regions: the data and the trailer (into a
small registered scratch slab). Data destinations (``recv=``): ``"direct"`` registers the
tensor handed back (fresh, or the caller's ``out=``) for this one transfer (no copy; cheap for
host memory); ``"slab"`` reads into a registered, reused slab and copies out (registering VRAM
is costly, a device copy is not); ``"auto"`` picks direct for host memory and slab for VRAM.
A transfer that cannot be cancelled after a deadline keeps its buffers quarantined (never
reused or deregistered) until ``close``.

UCX settings that matter for VRAM (:data:`UCX_DEFAULTS`, applied unless the environment sets
them): UCX's CUDA IPC transport turns one-sided GETs off on GPUs without NVLink (a single GPU
included), and a READ of GPU memory then falls back to "software emulation" through host
memory at host-copy speed; ``CUDA_IPC_ENABLE_GET_ZCOPY=y`` keeps the zero-copy GET. NIXL's UCX
backend also defaults to ``peer`` error handling, which admits only transports that detect a
dead peer; ``ucx_error_handling="none"`` admits shared memory as well. UCX also sets up its CUDA
transports only if the process has a CUDA context when the agent is created: a transport whose
``device`` is a GPU makes sure it has one (on an H200, NIXL READs of VRAM went from 0.7 to over
100 GB/s at 64 MiB with the zero-copy GET and a context present).

On hosts without a GPU, UCX moves host memory between processes with CMA or TCP on loopback.
"""
from __future__ import annotations

import base64
import importlib
import logging
import os
import re
import threading
import time
import uuid

import torch

from fastvideo3.errors import DeadlineExceeded, InvalidRequest, NotFound, Unavailable
from fastvideo3.transport import checksum as _checksum
from fastvideo3.transport.ledger import (
    TRAILER_BYTES, TRAILER_MAGIC, Deadline, TransportBase, pack_trailer, slab_bytes_needed,
    trailer_offset, unpack_trailer,
)
from fastvideo3.transport.ref import TensorRef
from fastvideo3.transport.slab import SlabPool

NIXL_MODULES = ("nixl", "nixl_cu13", "nixl_cu12")
#: UCX settings this transport asks for (see the module docstring); ``UCX_<name>`` in the
#: environment wins. UCX reads them when an agent creates its UCX context.
UCX_DEFAULTS = {"CUDA_IPC_ENABLE_GET_ZCOPY": "y"}
_POLL_MIN_S = 20e-6
_POLL_MAX_S = 1e-3


def _load_nixl():
    api, errors = None, []
    # The `nixl` meta package picks the build for the CUDA it finds; a build alone (what the
    # `transport` extra installs: nixl-cu13) is importable under its own name.
    for module in NIXL_MODULES:
        try:
            api = importlib.import_module(f"{module}._api")
            break
        except Exception as exc:  # ImportError, or a broken native library
            errors.append(f"{module}: {type(exc).__name__}: {exc}")
    if api is None:
        raise Unavailable(f"the nixl package cannot be loaded ({'; '.join(errors)}); "
                          "install the transport extra (nixl-cu13==1.5.1) or choose another transport",
                          field="transport.backend")
    nixl_agent, nixl_agent_config, nixl_thread_sync_t = api.nixl_agent, api.nixl_agent_config, api.nixl_thread_sync_t
    if "NIXL_LOG_LEVEL" not in os.environ:  # its INFO lines on stdout would drown pool logs
        logging.getLogger("nixl").setLevel(logging.WARNING)
    return nixl_agent, nixl_agent_config, nixl_thread_sync_t


# UCX transport names as they appear in UCX's protocol-selection report (UCX_PROTO_INFO=y).
UCX_TRANSPORTS = ("cuda_ipc", "cuda_copy", "gdr_copy", "rc_mlx5", "dc_mlx5", "ud_mlx5", "rc_verbs",
                  "ud_verbs", "rc_gda", "tcp", "posix", "sysv", "cma", "knem", "xpmem", "self")
_TL_RE = re.compile(r"(?<![\w])(" + "|".join(UCX_TRANSPORTS) + r")/[\w:.\-]+")


def parse_ucx_transports(text: str) -> list[str]:
    """UCX transport names found in UCX log text (``tl/device`` pairs of its protocol report)."""
    return sorted({m.group(1) for m in _TL_RE.finditer(text)})


_OP_RE = re.compile(r"\|\s*(remote memory (?:read|write) by ucp_(?:get|put)\S*) (.*?)\s*\|\s*$")
_ROW_RE = re.compile(r"\|\s*[0-9.]+(?:\.\.|\s)[^|]*\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|\s*$")


def parse_ucx_data_protocols(text: str) -> list[dict]:
    """The protocols UCX chose for one-sided reads/writes, from its report (``UCX_PROTO_INFO=y``):
    ``[{"op": "read ... into cuda/GPU0 from cuda", "how": "zero-copy", "via": ["cuda_ipc"]}]``,
    one entry per distinct (operation, description, transports)."""
    found, op = [], None
    for line in text.splitlines():
        m = _OP_RE.search(line)
        if m:
            op = (m.group(1).replace("remote memory ", "") + " " + m.group(2)).strip()
            continue
        m = _ROW_RE.search(line) if op else None
        if m and m.group(1) not in ("Description", ""):
            entry = {"op": op, "how": m.group(1), "via": parse_ucx_transports(m.group(2))}
            if entry["via"] and entry not in found:
                found.append(entry)
    return found


def vram_data_transports(text: str) -> list[str]:
    """Transports that carry one-sided reads/writes of GPU memory (``cuda`` on either side);
    what the NIXL VRAM path actually runs on."""
    names = {tl for p in parse_ucx_data_protocols(text) if "cuda" in p["op"] for tl in p["via"]}
    return sorted(names)


def ucx_transport_log(log_dir: str) -> str:
    """Ask UCX (read once, when this process creates its first UCX context) to report the
    protocols it selects into ``log_dir``; returns the log path prefix. An operator's own
    ``UCX_LOG_FILE`` / ``UCX_PROTO_INFO`` are left alone."""
    os.makedirs(log_dir, exist_ok=True)
    os.environ.setdefault("UCX_PROTO_INFO", "y")
    os.environ.setdefault("UCX_LOG_LEVEL", "info")  # the report is logged at info level
    prefix = os.path.join(log_dir, "ucx")
    os.environ.setdefault("UCX_LOG_FILE", prefix + ".%p.log")
    return os.environ["UCX_LOG_FILE"].split("%p")[0]


def _read_logs(prefix: str) -> str:
    folder, stem = os.path.split(prefix)
    text = []
    try:
        for name in sorted(os.listdir(folder or ".")):
            if name.startswith(stem):
                with open(os.path.join(folder, name), errors="replace") as fh:
                    text.append(fh.read(1 << 20))
    except OSError:
        return ""
    return "\n".join(text)


def _mem_type(device: torch.device) -> str:
    return "DRAM" if device.type == "cpu" else "VRAM"


def _dev_index(device: torch.device) -> int:
    return 0 if device.type == "cpu" else (device.index if device.index is not None else torch.cuda.current_device())


def _sync(device: torch.device) -> None:
    # Remote reads are not ordered with our CUDA stream: finish the copies first.
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class _Region:
    """A registered buffer: the tensor, its registration and (owner side) its metadata."""

    __slots__ = ("buf", "reg", "md_b64")

    def __init__(self, buf: torch.Tensor, reg, md_b64: str = "") -> None:
        self.buf = buf
        self.reg = reg
        self.md_b64 = md_b64


class NixlTransport(TransportBase):
    """NIXL/UCX transport (see module docstring)."""

    backend = "nixl"

    def __init__(self, owner: str, *, device: str | torch.device | None = "cpu",
                 checksum: str = "auto", max_cached_bytes: int = 1 << 30,
                 inline_metadata: bool = True, recv: str = "auto",
                 agent_name: str | None = None, backends: tuple[str, ...] = ("UCX",),
                 ucx_error_handling: str | None = None, ucx_log_dir: str | None = None) -> None:
        super().__init__(owner, device=device, checksum=checksum)
        if recv not in ("auto", "direct", "slab"):
            raise InvalidRequest(f"recv must be auto, direct or slab, not {recv!r}", field="transport.recv")
        if ucx_error_handling not in (None, "none", "peer"):
            raise InvalidRequest(f"ucx_error_handling must be none or peer, not {ucx_error_handling!r}",
                                 field="transport.ucx_error_handling", limit="none, peer")
        nixl_agent, nixl_agent_config, sync_t = _load_nixl()
        for key, value in UCX_DEFAULTS.items():
            os.environ.setdefault(f"UCX_{key}", value)
        if self.device is not None and self.device.type == "cuda":
            # UCX sets up its CUDA transports when the agent creates its context; without a CUDA
            # context in this process by then, reads of VRAM fall back to host-memory emulation.
            torch.zeros(1, device=self.device)
        self.agent_name = agent_name or f"{owner}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._ucx_log = ucx_transport_log(ucx_log_dir) if ucx_log_dir else None
        self.ucx_params: dict[str, str] = {}
        try:
            config = nixl_agent_config(backends=[], sync_mode=sync_t.NIXL_THREAD_SYNC_STRICT)
            self._agent = nixl_agent(self.agent_name, config)
            for name in backends:
                params = {}
                if name == "UCX" and ucx_error_handling is not None:
                    params["ucx_error_handling_mode"] = ucx_error_handling
                if name in self._agent.plugin_list:
                    self._agent.create_backend(name, params)
                if name == "UCX" and "UCX" in self._agent.backends:
                    # effective settings: the plugin's defaults, overridden by what we passed
                    self.ucx_params = {**self._agent.get_plugin_params("UCX"),
                                       **self._agent.backend_options.get("UCX", {})}
        except Exception as exc:
            raise Unavailable(f"cannot create NIXL agent {self.agent_name!r}: {exc}",
                              field="transport.backend") from None
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise Unavailable(f"NIXL backend(s) {missing} not available here "
                              f"(plugins: {self._agent.plugin_list})", field="transport.backend")
        self._backends = list(backends)
        self._inline = inline_metadata
        self._recv = recv
        self._max_cached = max_cached_bytes
        self._pools: dict[tuple[str, str], SlabPool] = {}  # (role, device) -> pool
        self._pools_lock = threading.Lock()
        self._peers: set[str] = set()
        self._peers_lock = threading.Lock()
        # (xfer handle, (buffers, cleanups)) of transfers NIXL could not cancel
        self._quarantine: list[tuple[object, tuple]] = []

    # ------------------------------------------------------------------ metadata side channel
    def agent_metadata(self) -> bytes:
        """This agent's full metadata (for a pool's Describe reply)."""
        return self._agent.get_agent_metadata()

    def add_peer(self, metadata: bytes) -> str:
        """Load a peer's metadata (from its Describe reply); returns the peer's agent name."""
        try:
            name = self._agent.add_remote_agent(metadata)
        except Exception as exc:
            raise Unavailable(f"cannot load NIXL peer metadata: {exc}", field="descriptor.md") from None
        name = name.decode() if isinstance(name, bytes) else str(name)
        with self._peers_lock:
            self._peers.add(name)
        return name

    def _forget_peer(self, name: str) -> None:
        with self._peers_lock:
            known = name in self._peers
            self._peers.discard(name)
        if known:
            try:
                self._agent.remove_remote_agent(name)
            except Exception:
                pass

    # ------------------------------------------------------------------ slabs
    def _pool(self, role: str, device: torch.device) -> SlabPool:
        key = (role, str(device))
        with self._pools_lock:
            pool = self._pools.get(key)
            if pool is None:
                pool = SlabPool(lambda cap: self._register(cap, device, owner_side=(role == "owner")),
                                self._deregister, max_cached_bytes=self._max_cached)
                self._pools[key] = pool
            return pool

    def _register(self, capacity: int, device: torch.device, *, owner_side: bool) -> _Region:
        # Zeroed once so a slab's pages are resident before its first transfer.
        buf = torch.zeros(capacity, dtype=torch.uint8, device=device)
        try:
            reg = self._agent.register_memory(buf, backends=self._backends)
        except Exception as exc:
            raise Unavailable(f"NIXL cannot register {capacity} bytes on {device}: {exc}",
                              field="transport.nixl") from None
        region = _Region(buf, reg)
        if owner_side:  # connection info + this slab's remote key, for refs to carry
            try:
                region.md_b64 = base64.b64encode(self._agent.get_partial_agent_metadata(
                    reg, True, self._backends)).decode("ascii")
            except Exception as exc:
                self._deregister(region)
                raise Unavailable(f"NIXL cannot export metadata for a slab: {exc}",
                                  field="transport.nixl") from None
        return region

    def _deregister(self, region: _Region) -> None:
        try:
            self._agent.deregister_memory(region.reg, backends=self._backends)
        finally:
            region.buf = None

    # ------------------------------------------------------------------ owner
    def _publish(self, buffer_id: str, tensor: torch.Tensor, csum_algo: str):
        device = tensor.device
        nbytes = tensor.numel() * tensor.element_size()
        pool = self._pool("owner", device)
        slab = pool.acquire(slab_bytes_needed(nbytes))
        try:
            buf = slab.handle.buf
            csum, gen = self._stage(buf[:nbytes], tensor, csum_algo)
            off = trailer_offset(nbytes)
            trailer = torch.frombuffer(bytearray(pack_trailer(gen, nbytes)), dtype=torch.uint8)
            buf[off:off + TRAILER_BYTES].copy_(trailer)
            _sync(device)
        except BaseException:
            pool.give_back(slab)
            raise
        descriptor = {
            "agent": self.agent_name, "addr": buf.data_ptr(), "len": off + TRAILER_BYTES,
            "dev": _dev_index(device), "mem": _mem_type(device), "generation": gen,
        }
        if self._inline:
            descriptor["md"] = slab.handle.md_b64
        return (pool, slab, off), csum, descriptor

    def _free(self, payload) -> None:
        pool, slab, off = payload
        buf = slab.handle.buf
        buf[off:off + TRAILER_BYTES].zero_()  # stale readers now see "released"
        _sync(buf.device)
        pool.give_back(slab)

    def _resident_bytes(self, ref: TensorRef) -> torch.Tensor:
        _pool, slab, _off = self._lookup(ref).payload
        return slab.handle.buf[:ref.nbytes]

    # ------------------------------------------------------------------ reader
    def _ensure_peer(self, ref: TensorRef, remote) -> str:
        desc = ref.descriptor
        agent = desc["agent"]
        with self._peers_lock:
            known = agent in self._peers
        if known and self._agent.check_remote_metadata(agent, remote):
            return agent
        md = desc.get("md")
        if isinstance(md, str) and md:
            try:
                self.add_peer(base64.b64decode(md))
            except ValueError:
                raise InvalidRequest("descriptor md is not base64", field="descriptor.md") from None
            return agent
        if known:
            return agent  # metadata loaded via add_peer; let the transfer tell us
        raise Unavailable(f"no NIXL metadata for agent {agent!r}: the ref carries none and "
                          "add_peer() was not called for it", field="descriptor.md")

    def _fetch(self, ref: TensorRef, deadline: Deadline, copy: bool,
               out: torch.Tensor | None) -> torch.Tensor:
        desc = ref.descriptor
        for key in ("agent", "addr", "len", "dev", "mem", "generation"):
            if key not in desc:
                raise InvalidRequest(f"nixl descriptor needs {key!r}", field=f"descriptor.{key}")
        nbytes, off = ref.nbytes, trailer_offset(ref.nbytes)
        if desc["mem"] not in ("DRAM", "VRAM") or int(desc["len"]) != off + TRAILER_BYTES:
            raise InvalidRequest("nixl descriptor region disagrees with nbytes", field="descriptor.len")
        deadline.check(f"nixl fetch of {ref.buffer_id}")
        addr, dev = int(desc["addr"]), int(desc["dev"])
        # Two regions in one READ: the data (if any) and the generation trailer.
        regions = ([(addr, nbytes, dev)] if nbytes else []) + [(addr + off, TRAILER_BYTES, dev)]
        try:
            remote = self._agent.get_xfer_descs(regions, desc["mem"])
        except Exception as exc:
            raise InvalidRequest(f"bad nixl region: {exc}", field="descriptor") from None
        agent = self._ensure_peer(ref, remote)

        device = out.device if out is not None else (self.device or torch.device("cpu"))
        result = out if out is not None else torch.empty(ref.shape, dtype=ref.torch_dtype, device=device)
        cleanups: list = []  # undone after the transfer, unless it is quarantined
        staged = None
        try:
            recv = self._pool("recv", device)
            tslab = recv.acquire(TRAILER_BYTES)
            cleanups.append(lambda: recv.give_back(tslab))
            local = [tslab.handle.buf[:TRAILER_BYTES]]
            if nbytes:
                mode = self._recv if self._recv != "auto" else ("direct" if device.type == "cpu" else "slab")
                if mode == "slab" and out is None:
                    dslab = recv.acquire(nbytes)
                    cleanups.append(lambda: recv.give_back(dslab))
                    staged = dslab.handle.buf[:nbytes]
                    local.insert(0, staged)
                else:  # READ straight into the caller's tensor, registered for this transfer
                    target = self._bytes_of(result)
                    reg = self._agent.register_memory(target, backends=self._backends)
                    cleanups.append(lambda: self._agent.deregister_memory(reg, backends=self._backends))
                    local.insert(0, target)
            state, handle = self._post_and_wait(local, remote, agent, deadline)
        except BaseException:
            self._undo(cleanups)
            raise
        if state != "DONE":
            if self._cancel(handle):
                self._undo(cleanups)
            else:  # a peer may still write into these buffers: never reuse or deregister them
                self._quarantine.append((handle, (result, cleanups)))
            what = f"nixl READ of {ref.owner}:{ref.buffer_id}"
            if state == "TIMEOUT":
                raise DeadlineExceeded(f"{what}: deadline of {deadline.deadline_s:.3f}s exceeded",
                                       field="deadline_s", limit=f"{deadline.deadline_s:.3f}s")
            self._forget_peer(agent)
            raise Unavailable(f"{what}: transfer failed (peer lost?)", field="owner")
        handle.release()
        try:
            raw = local[-1].cpu().numpy().tobytes()
            if unpack_trailer(raw) != (TRAILER_MAGIC, desc["generation"], nbytes):
                raise NotFound(f"{ref.owner} released {ref.buffer_id} (slab reused)", field="buffer_id")
            if staged is not None:
                self._bytes_of(result).copy_(staged)
            return result
        finally:
            self._undo(cleanups)

    @staticmethod
    def _undo(cleanups: list) -> None:
        for fn in reversed(cleanups):
            try:
                fn()
            except Exception:
                pass
        cleanups.clear()

    def _post_and_wait(self, local: list[torch.Tensor], remote, agent: str, deadline: Deadline):
        """Post a READ into ``local`` (tensors, in the order of ``remote``) and poll it:
        ("DONE" | "ERR" | "TIMEOUT", handle)."""
        try:
            handle = self._agent.initialize_xfer("READ", self._agent.get_xfer_descs(local), remote, agent)
        except Exception as exc:
            self._forget_peer(agent)
            raise Unavailable(f"nixl READ from {agent}: cannot start: {exc}", field="owner") from None
        try:
            state = self._agent.transfer(handle)
        except Exception:
            state = "ERR"
        pause = _POLL_MIN_S
        while state == "PROC":
            if deadline.expired():
                return "TIMEOUT", handle
            time.sleep(pause)  # yield the core to UCX's progress thread (and to the peer)
            pause = min(pause * 2, _POLL_MAX_S)
            try:
                state = self._agent.check_xfer_state(handle)
            except Exception:
                state = "ERR"
        return state, handle

    @staticmethod
    def _cancel(handle) -> bool:
        """Release an unfinished transfer; False if NIXL could not cancel it."""
        try:
            handle.release()
            return True
        except Exception:
            return False

    def _backend_stats(self):
        totals = {"slabs_created": 0, "slabs_destroyed": 0, "slab_bytes": 0, "slab_bytes_free": 0}
        with self._pools_lock:
            pools = list(self._pools.values())
        for pool in pools:
            for key, value in pool.stats().items():
                totals[key] += value
        totals["quarantined"] = len(self._quarantine)
        totals["peers"] = len(self._peers)
        totals["ucx"] = {"UCX_TLS": os.environ.get("UCX_TLS", ""), **self.ucx_params,
                         **{f"UCX_{k}": os.environ.get(f"UCX_{k}", "") for k in UCX_DEFAULTS}}
        if self._ucx_log is not None:
            text = _read_logs(self._ucx_log)
            totals["ucx_transports"] = parse_ucx_transports(text)  # every lane of every endpoint
            totals["ucx_data_transports"] = sorted({tl for p in parse_ucx_data_protocols(text) for tl in p["via"]})
            totals["ucx_vram_transports"] = vram_data_transports(text)  # what moves GPU memory
            totals["ucx_protocols"] = parse_ucx_data_protocols(text)[:16]
        return totals

    def _close_backend(self) -> None:
        with self._pools_lock:
            pools = list(self._pools.values())
        for pool in pools:  # kept (empty) so stats() still reports their history
            pool.clear()
        for name in list(self._peers):
            self._forget_peer(name)
        still = []
        for handle, (buffers, cleanups) in self._quarantine:
            if self._cancel(handle):
                self._undo(cleanups)
            else:
                still.append((handle, (buffers, cleanups)))  # kept on purpose: a peer may write
        self._quarantine = still

