"""Transport throughput between two processes, per backend, against an in-process copy.

An owner process publishes one tensor per size; this process fetches it ``--repeats`` times
(after one warm-up) and reports the median. A fetch is timed end to end: the transfer, the
checksum verification the contract requires, and the tensor handed back. The ceiling is a
plain in-process ``dst.copy_(src)`` of the same size on the reader's device.

  python bench/transport.py                       # host memory, writes bench/results/transport_cpu.json
  python bench/transport.py --device cuda         # VRAM -> VRAM, two processes on one GPU
                                                  # (writes bench/results/transport_h200.json)
  python bench/transport.py --devices 0,1 --out bench/results/transport_2gpu.json

On a GPU it also times the device checksum and runs the fault checks of the ``cuda_ipc``
backend against a real owner process (stale buffer, reused slab, checksum mismatch, deadline,
hung and dead owner). ``--nixl-from-probe`` applies the best UCX configuration found by
``bench/nixl_probe.py`` (environment and NIXL's UCX error-handling mode) before any NIXL agent
exists. The JSON is rewritten after every size, so a run cut short keeps what it measured.

GB/s here is 1e9 bytes per second; sizes are MiB.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastvideo3.transport import available_backends, make_transport  # noqa: E402
from fastvideo3.transport import checksum as _checksum  # noqa: E402
from fastvideo3.transport.ref import TensorRef  # noqa: E402
from timing import synced_seconds  # noqa: E402 - the sibling module in bench/

MiB = 1 << 20
# (label, backend, fetch kwargs, reader cfg)
# "-into" variants fetch into a warm, preallocated ``out=`` tensor, like the memcpy ceiling.
VARIANTS = [
    ("shm-view", "shm", {"copy": False}, {}),
    ("shm-copy", "shm", {"copy": True}, {}),
    ("shm-into", "shm", {"out": True}, {}),
    ("grpc", "grpc", {}, {}),
    ("grpc-into", "grpc", {"out": True}, {}),
    ("nixl", "nixl", {}, {}),
    ("nixl-slab", "nixl", {}, {"recv": "slab"}),
    ("nixl-into", "nixl", {"out": True}, {}),
    # cuda_ipc: a private verified copy (fresh tensor), into a warm out=, and a zero-copy view
    # of the owner's slab (valid only while the owner holds the request: not safe against reuse).
    ("cuda_ipc", "cuda_ipc", {"copy": True}, {}),
    ("cuda_ipc-into", "cuda_ipc", {"out": True}, {}),
    ("cuda_ipc-view", "cuda_ipc", {"copy": False}, {}),
]
OWNER_CFG = {"shm": {}, "grpc": {"listen": "127.0.0.1:0"}, "nixl": {}, "cuda_ipc": {}}
SUMMARY_KEYS = ("memcpy_GBps_64MiB", "cuda_ipc_GBps_64MiB", "nixl_GBps_64MiB", "grpc_GBps_64MiB",
                "checksum_GBps", "nixl_ucx_transports")


def _owner_main(backends: list[str], device: str, threads: int, owner_cfg: dict, conn) -> None:
    """The owner process: builds a backend's transport on its first publish, closes it on request."""
    torch.set_num_threads(threads)
    transports: dict = {}
    conn.send(("ready", {}))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            for t in transports.values():
                t.close()
            conn.send("bye")
            return
        if msg[0] == "close":
            t = transports.pop(msg[1], None)
            if t is not None:
                t.close()
            conn.send("closed")
            continue
        _, backend, nbytes, repeats = msg
        try:
            if backend not in transports:
                cfg = dict(owner_cfg.get(backend, {}))
                if backend in ("nixl", "cuda_ipc") and device.startswith("cuda"):
                    cfg["device"] = device
                transports[backend] = make_transport(backend, owner=f"bench-{backend}", **cfg)
            t = transports[backend]
            src = torch.randn(nbytes // 4, device=device)
            times = []
            for i in range(repeats + 1):
                start = time.perf_counter()
                ref = t.publish(f"bench-{i}", "x", src)
                times.append(time.perf_counter() - start)
                if i < repeats:
                    t.release(f"bench-{i}")
        except Exception as exc:  # reported as this row's error; the owner keeps serving
            conn.send(("error", f"publish: {type(exc).__name__}: {exc}"))
            continue
        conn.send((ref.to_dict(), statistics.median(times[1:])))
        conn.recv()  # reader done
        t.release(f"bench-{repeats}")
        conn.send("released")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, repeats: int, device: torch.device) -> float:
    _, times, _ = synced_seconds(fn, repeats, lambda: _sync(device))  # the first call: a warm-up
    return statistics.median(times)


def memcpy_ceiling(nbytes: int, src_dev: torch.device, dst_dev: torch.device, repeats: int) -> float:
    src = torch.randn(nbytes // 4, device=src_dev)
    dst = torch.empty(nbytes // 4, device=dst_dev)
    return _median_time(lambda: dst.copy_(src), repeats, dst_dev)


def checksum_rate(nbytes: int, device: torch.device, repeats: int) -> dict:
    """Throughput of the checksum a fetch on ``device`` verifies with, digest on the host."""
    data = torch.randn(nbytes // 4, device=device)
    algo = _checksum.pick_algorithm("auto", device)
    secs = _median_time(lambda: _checksum.compute(data, algo), repeats, device)
    row = {"algorithm": algo, "size_mib": nbytes // MiB, "GBps": nbytes / secs / 1e9}
    if algo == "fsum64":
        from fastvideo3.transport import device_checksum
        row["kernel"] = "triton" if device_checksum.available(device) else "torch"
        flat = data.view(torch.uint8)
        row["matches_torch_reference"] = _checksum.fsum64_torch(flat) == _checksum.compute(flat, "fsum64")[7:]
        if device.type == "cuda":
            torch_secs = _median_time(lambda: _checksum.fsum64_torch(flat), max(2, repeats // 2), device)
            row["torch_reference_GBps"] = nbytes / torch_secs / 1e9
    return row


def apply_nixl_probe(path: str) -> dict | None:
    """Set the environment and error-handling mode of the probe's best NIXL configuration."""
    best = json.loads(Path(path).read_text()).get("best")
    if not best:
        return None
    os.environ.update(best.get("env") or {})
    err = best.get("ucx_error_handling", "")
    if err in ("none", "peer"):
        OWNER_CFG["nixl"] = {"ucx_error_handling": err}
    return best


def machine() -> dict:
    info = {"cpu_count": os.cpu_count(), "platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor(), "python": platform.python_version(),
            "torch": torch.__version__, "cuda_available": torch.cuda.is_available(),
            "loadavg_1_5_15": list(os.getloadavg())}  # other work on the host skews every figure
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    try:
        from importlib.metadata import version
        info["nixl"] = version("nixl")
    except Exception:
        info["nixl"] = None
    return info


def summarize(results: list[dict], ceilings: dict, checksum: dict | None, ucx_transports: list[str]) -> dict:
    """The top-level summary: exactly SUMMARY_KEYS (None where a figure was not measured)."""
    def best(backend, labels=None):
        rates = [r["fetch_GBps"] for r in results if r["backend"] == backend and r["size_mib"] == 64
                 and r["fetch_GBps"] is not None and (labels is None or r["variant"] in labels)]
        return max(rates) if rates else None
    return {
        "memcpy_GBps_64MiB": ceilings.get(64),
        # a verified private copy, or a verified zero-copy view: the view pins the owner's slab
        # (never reused while any tensor shares it), so it is safe against reuse
        "cuda_ipc_GBps_64MiB": best("cuda_ipc"),
        "nixl_GBps_64MiB": best("nixl"),
        "grpc_GBps_64MiB": best("grpc"),
        "checksum_GBps": checksum["GBps"] if checksum else None,
        "nixl_ucx_transports": ucx_transports,
    }


def goals(results: list[dict], ceilings: dict, checksum: dict | None) -> dict:
    """The issue's targets next to what was measured (64 MiB, fraction of device memcpy)."""
    out = {}
    for r in results:
        if r["size_mib"] == 64 and r["fetch_GBps"] is not None and r["backend"] in ("cuda_ipc", "nixl"):
            out[f"{r['variant'].replace('-', '_')}_fraction_of_memcpy_64MiB"] = r["fraction_of_memcpy"]
    cuda = [r for r in results if r["size_mib"] == 64 and r["backend"] == "cuda_ipc" and r["fetch_GBps"]]
    if cuda and 64 in ceilings:
        out["cuda_ipc_best_fraction_of_memcpy_64MiB (goal >= 0.5)"] = max(r["fetch_GBps"] for r in cuda) / ceilings[64]
    nixl = [r["fetch_GBps"] for r in results if r["size_mib"] == 64 and r["backend"] == "nixl" and r["fetch_GBps"]]
    if nixl:
        out["nixl_GBps_64MiB (goal >= 100)"] = max(nixl)
    if checksum:
        out["checksum_GBps (goal >= 1000)"] = checksum["GBps"]
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="1,8,64,256")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both processes on one device)")
    parser.add_argument("--devices", default=None, help="owner,reader GPU indices, e.g. 0,1")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per process (two processes share the host)")
    parser.add_argument("--checksum-mib", type=int, default=1024,
                        help="size for the headline checksum rate on a GPU (64 MiB is also reported)")
    parser.add_argument("--nixl-from-probe", default=None, help="nixl_probe.py JSON whose best config to use")
    parser.add_argument("--ucx-log-dir", default=None, help="where UCX reports the protocols it selects")
    parser.add_argument("--no-faults", action="store_true", help="skip the cuda_ipc fault checks")
    parser.add_argument("--time-limit", type=float, default=0, help="seconds; stop measuring after (0: none)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    t_end = time.monotonic() + args.time_limit if args.time_limit > 0 else float("inf")

    if args.devices:
        owner_idx, reader_idx = (int(x) for x in args.devices.split(","))
        owner_dev, reader_dev = torch.device("cuda", owner_idx), torch.device("cuda", reader_idx)
    else:
        owner_dev = reader_dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    out_path = Path(args.out or ROOT / "bench" / "results" / (
        "transport_cpu.json" if owner_dev.type == "cpu" else
        "transport_2gpu.json" if args.devices else "transport_h200.json"))
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    wanted = args.variants.split(",")
    have = set(available_backends())
    variants = [v for v in VARIANTS if v[0] in wanted and v[1] in have]
    if owner_dev.type == "cuda":
        variants = [v for v in variants if v[0] != "shm-view"]  # host mappings only
    else:
        variants = [v for v in variants if v[1] != "cuda_ipc"]  # VRAM only
    backends = sorted({v[1] for v in variants})
    probe = apply_nixl_probe(args.nixl_from_probe) if args.nixl_from_probe and "nixl" in backends else None
    ucx_log = None
    if args.ucx_log_dir and "nixl" in backends:
        from fastvideo3.transport.nixl_backend import ucx_transport_log
        ucx_log = ucx_transport_log(args.ucx_log_dir)  # before any agent, in both processes

    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "owner_device": str(owner_dev), "reader_device": str(reader_dev),
        "repeats": args.repeats, "torch_threads_per_process": args.threads, "statistic": "median",
        "units": "GB/s = 1e9 bytes/s; sizes in MiB",
        "notes": "fetch = transfer + checksum verification + tensor returned; shm-view returns a "
                 "copy-on-write mapping of the owner's segment, shm-copy a fresh private copy; nixl "
                 "reads into a fresh tensor (host: registered per fetch; VRAM: through a registered "
                 "slab plus a device copy), nixl-slab always through the slab; cuda_ipc copies the "
                 "owner's slab into a fresh tensor and verifies it in one kernel, cuda_ipc-view "
                 "verifies and returns a zero-copy view of the owner's slab that pins it (the owner "
                 "never reuses a slab while a tensor shares it), so it is safe against reuse and "
                 "counts in the summary; on a GPU the verification kernel of a repeated (address, size) "
                 "runs from a captured CUDA graph (the first fetches of a pair launch it plainly); "
                 "'-into' variants fill a "
                 "warm preallocated out= tensor (as the memcpy ceiling does); fresh host "
                 "allocations pay first-touch page faults",
        "nixl_config": {"probe_best": probe, "owner_cfg": OWNER_CFG.get("nixl"),
                        "UCX_TLS": os.environ.get("UCX_TLS", "")},
    }
    results: list[dict] = []
    ceilings: dict[int, float] = {}

    def write(checksum=None, ucx_transports=None, stage="measuring"):
        report.update({"stage": stage, "memcpy_GBps": {str(k): v for k, v in ceilings.items()},
                       "results": results})
        report["summary"] = summarize(results, ceilings, checksum, ucx_transports or [])
        report["goals"] = goals(results, ceilings, checksum)
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=2) + "\n")

    # The checksum first: it is one of the goals and needs no second process.
    checksum = None
    if owner_dev.type == "cuda":
        checksum = checksum_rate(args.checksum_mib * MiB, reader_dev, args.repeats)
        report["checksum_64MiB"] = checksum_rate(64 * MiB, reader_dev, args.repeats)
    else:
        checksum = checksum_rate(64 * MiB, reader_dev, args.repeats)
    report["checksum"] = checksum
    print(f"checksum {checksum['algorithm']} {checksum['GBps']:.1f} GB/s at {checksum['size_mib']} MiB", flush=True)
    write(checksum)

    # The cuda_ipc fault checks come before the measurements: a run cut short still has them.
    if "cuda_ipc" in backends and not args.no_faults:
        from fastvideo3.transport.testing import fault_suite, pinned_view_check
        report["cuda_ipc_faults"] = {}
        try:
            reader = make_transport("cuda_ipc", owner="fault-reader", device=reader_dev)
            try:
                report["cuda_ipc_faults"] = fault_suite("cuda_ipc", {}, reader, device=str(owner_dev))
                report["cuda_ipc_faults"]["view_pins_slab"] = pinned_view_check({}, reader, device=str(owner_dev))
            finally:
                reader.close()
        except Exception as exc:  # recorded; the measurements still run
            report["cuda_ipc_faults"]["suite"] = {"ok": False, "detail": f"{type(exc).__name__}: {exc}"}
        for name, res in report["cuda_ipc_faults"].items():
            print(f"fault check {name:<18} {'ok' if res['ok'] else 'FAIL'}  {res['detail'][:100]}", flush=True)
        write(checksum)

    # Memcpy ceilings first, then one backend at a time (the GPU paths first): each backend's readers
    # (and the owner's transport) exist only while it is measured, as in a pool that moves an
    # edge over one backend. A NIXL agent's progress thread polls CUDA all the time; it is not
    # left running under the other backends' figures.
    for size in sizes:
        nbytes = size * MiB
        ceilings[size] = nbytes / memcpy_ceiling(nbytes, owner_dev, reader_dev, args.repeats) / 1e9
        print(f"{size:>4} MiB  memcpy {ceilings[size]:7.2f} GB/s", flush=True)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_owner_main, args=(backends, str(owner_dev), args.threads, dict(OWNER_CFG), child),
                       daemon=True)
    proc.start()
    if not conn.poll(180):
        raise SystemExit("owner process did not start")
    conn.recv()
    failed: dict[str, str] = {}
    report["unavailable"] = failed
    ucx_transports: list[str] = []
    stopped = None
    order = [b for b in ("cuda_ipc", "nixl", "grpc", "shm") if b in backends]
    for backend in order:
        readers = {}
        for label, b, _kw, cfg in variants:
            if b != backend:
                continue
            reader_cfg = dict(cfg)
            if backend == "nixl":
                reader_cfg = {**OWNER_CFG.get(backend, {}), **cfg, "ucx_log_dir": args.ucx_log_dir}
            try:
                readers[label] = make_transport(backend, owner=f"reader-{label}", device=reader_dev, **reader_cfg)
            except Exception as exc:
                failed[label] = f"{type(exc).__name__}: {exc}"
                print(f"unavailable: {label}: {failed[label]}", flush=True)
        for size in sizes:
            nbytes = size * MiB
            for label, b, kw, _cfg in variants:
                if b != backend or label not in readers:
                    continue
                if time.monotonic() > t_end:
                    stopped = f"time limit reached before {label} at {size} MiB"
                    break
                conn.send(("publish", backend, nbytes, args.repeats))
                if not conn.poll(600):
                    raise SystemExit("owner process stalled")
                ref_dict, publish_s = conn.recv()
                if ref_dict == "error":
                    results.append({"variant": label, "backend": backend, "size_mib": size, "fetch_GBps": None,
                                    "fraction_of_memcpy": None, "error": publish_s})
                    print(f"{size:>4} MiB  {label:<14} ERROR {publish_s}", flush=True)
                    continue
                ref = TensorRef.from_dict(ref_dict)
                reader = readers[label]
                kwargs = dict(kw)
                if kwargs.pop("out", False):
                    kwargs["out"] = torch.zeros(ref.shape, dtype=ref.torch_dtype, device=reader_dev)
                try:
                    fetch_s = _median_time(lambda: reader.fetch(ref, deadline_s=120, **kwargs), args.repeats,
                                           reader_dev)
                    error = None
                except Exception as exc:  # recorded; the other variants still run
                    fetch_s, error = float("nan"), f"{type(exc).__name__}: {exc}"
                kwargs.clear()
                conn.send("done")
                conn.recv()
                gbps = nbytes / fetch_s / 1e9 if error is None else None
                row = {"variant": label, "backend": backend, "size_mib": size, "fetch_median_s": fetch_s,
                       "fetch_GBps": gbps, "publish_median_s": publish_s,
                       "publish_GBps": nbytes / publish_s / 1e9,
                       "fraction_of_memcpy": gbps / ceilings[size] if gbps else None}
                results.append(row)
                if error:
                    row["error"] = error
                    print(f"{size:>4} MiB  {label:<14} ERROR {error}", flush=True)
                    continue
                print(f"{size:>4} MiB  {label:<14} fetch {gbps:8.2f} GB/s ({row['fraction_of_memcpy']:.0%} of "
                      f"memcpy)  publish {row['publish_GBps']:7.2f} GB/s", flush=True)
            write(checksum, ucx_transports)
            if stopped:
                break
        for label, reader in readers.items():
            stats = reader.stats()
            if "ucx_vram_transports" in stats:  # the transports that carried the data (GPU memory on a GPU)
                key = "ucx_vram_transports" if reader_dev.type == "cuda" else "ucx_data_transports"
                ucx_transports = sorted(set(ucx_transports) | set(stats[key]))
                report["nixl_ucx_all_lanes"] = stats.get("ucx_transports")
                report["nixl_ucx_protocols"] = stats.get("ucx_protocols")
            if "ucx" in stats:
                report.setdefault("nixl_reader_ucx", stats["ucx"])
            reader.close()
        conn.send(("close", backend))
        conn.poll(60) and conn.recv()
        if stopped:
            break
    conn.send(("stop",))
    conn.poll(60) and conn.recv()
    proc.join(30)
    if not ucx_transports and probe:
        ucx_transports = list(probe.get("vram_transports") or [])
        report["nixl_ucx_transports_source"] = "nixl_probe best configuration"
    elif ucx_log:
        report["nixl_ucx_transports_source"] = "UCX protocol report of this run (the reads/writes of the data)"
    report["stopped"] = stopped
    write(checksum, ucx_transports, stage="measured")

    if reader_dev.type == "cuda":
        from fastvideo3.transport import device_checksum
        report["device_checksum_graphs"] = device_checksum.graph_stats()
    write(checksum, ucx_transports, stage="done")
    print(json.dumps(report["summary"], indent=2))
    print(f"wrote {out_path}")
    return report


if __name__ == "__main__":
    main()
