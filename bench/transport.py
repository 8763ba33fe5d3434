"""Transport throughput between two processes, per backend, against an in-process copy.

An owner process publishes one tensor per size; this process fetches it ``--repeats`` times
(after one warm-up) and reports the median. A fetch is timed end to end: the transfer, the
checksum verification the contract requires, and the tensor handed back. The ceiling is a
plain in-process ``dst.copy_(src)`` of the same size on the reader's device.

  python bench/transport.py                       # host memory, writes bench/results/transport_cpu.json
  python bench/transport.py --device cuda         # VRAM -> VRAM, two processes on one GPU
  python bench/transport.py --devices 0,1 --out bench/results/transport_2gpu.json

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
]
OWNER_CFG = {"shm": {}, "grpc": {"listen": "127.0.0.1:0"}, "nixl": {}}


def _owner_main(backends: list[str], device: str, threads: int, conn) -> None:
    torch.set_num_threads(threads)
    transports = {b: make_transport(b, owner=f"bench-{b}", **OWNER_CFG[b]) for b in backends}
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            for t in transports.values():
                t.close()
            conn.send("bye")
            return
        _, backend, nbytes, repeats = msg
        t = transports[backend]
        src = torch.randn(nbytes // 4, device=device)
        times = []
        for i in range(repeats + 1):
            start = time.perf_counter()
            ref = t.publish(f"bench-{i}", "x", src)
            times.append(time.perf_counter() - start)
            if i < repeats:
                t.release(f"bench-{i}")
        conn.send((ref.to_dict(), statistics.median(times[1:])))
        conn.recv()  # reader done
        t.release(f"bench-{repeats}")
        conn.send("released")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
        del out
    return statistics.median(times)


def memcpy_ceiling(nbytes: int, src_dev: torch.device, dst_dev: torch.device, repeats: int) -> float:
    src = torch.randn(nbytes // 4, device=src_dev)
    dst = torch.empty(nbytes // 4, device=dst_dev)
    return _median_time(lambda: dst.copy_(src), repeats, dst_dev)


def checksum_rate(nbytes: int, device: torch.device, repeats: int) -> dict[str, float]:
    data = torch.randn(nbytes // 4, device=device)
    algo = _checksum.pick_algorithm("auto", device)
    secs = _median_time(lambda: _checksum.compute(data, algo), repeats, device)
    return {"algorithm": algo, "GBps": nbytes / secs / 1e9}


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


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes-mib", default="1,8,64,256")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    parser.add_argument("--device", default="cpu", help="cpu or cuda (both processes on one device)")
    parser.add_argument("--devices", default=None, help="owner,reader GPU indices, e.g. 0,1")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per process (two processes share the host)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    if args.devices:
        owner_idx, reader_idx = (int(x) for x in args.devices.split(","))
        owner_dev, reader_dev = torch.device("cuda", owner_idx), torch.device("cuda", reader_idx)
    else:
        owner_dev = reader_dev = torch.device("cuda", 0) if args.device == "cuda" else torch.device(args.device)
    out_path = Path(args.out or ROOT / "bench" / "results" / (
        "transport_cpu.json" if owner_dev.type == "cpu" else
        "transport_2gpu.json" if args.devices else "transport_gpu.json"))
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    wanted = args.variants.split(",")
    have = set(available_backends())
    variants = [v for v in VARIANTS if v[0] in wanted and v[1] in have]
    if owner_dev.type == "cuda":
        variants = [v for v in variants if v[0] != "shm-view"]  # host mappings only
    backends = sorted({v[1] for v in variants})

    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_owner_main, args=(backends, str(owner_dev), args.threads, child), daemon=True)
    proc.start()
    if not conn.poll(120) or conn.recv() != "ready":
        raise SystemExit("owner process did not start")
    readers = {}
    for label, backend, _kw, cfg in variants:
        readers[label] = make_transport(backend, owner=f"reader-{label}", device=reader_dev, **cfg)

    results, ceilings = [], {}
    for size in sizes:
        nbytes = size * MiB
        ceilings[size] = nbytes / memcpy_ceiling(nbytes, owner_dev, reader_dev, args.repeats) / 1e9
        print(f"{size:>4} MiB  memcpy {ceilings[size]:7.2f} GB/s", flush=True)
        for label, backend, kw, _cfg in variants:
            conn.send(("publish", backend, nbytes, args.repeats))
            if not conn.poll(600):
                raise SystemExit("owner process stalled")
            ref_dict, publish_s = conn.recv()
            ref = TensorRef.from_dict(ref_dict)
            reader = readers[label]
            kwargs = dict(kw)
            if kwargs.pop("out", False):
                kwargs["out"] = torch.zeros(ref.shape, dtype=ref.torch_dtype, device=reader_dev)
            fetch_s = _median_time(lambda: reader.fetch(ref, deadline_s=120, **kwargs), args.repeats, reader_dev)
            kwargs.clear()
            conn.send("done")
            conn.recv()
            gbps = nbytes / fetch_s / 1e9
            row = {"variant": label, "backend": backend, "size_mib": size, "fetch_median_s": fetch_s,
                   "fetch_GBps": gbps, "publish_median_s": publish_s,
                   "publish_GBps": nbytes / publish_s / 1e9, "fraction_of_memcpy": gbps / ceilings[size]}
            results.append(row)
            print(f"{size:>4} MiB  {label:<10} fetch {gbps:7.2f} GB/s ({row['fraction_of_memcpy']:.0%} of memcpy)"
                  f"  publish {row['publish_GBps']:6.2f} GB/s", flush=True)
    conn.send(("stop",))
    conn.poll(60) and conn.recv()
    proc.join(30)
    for reader in readers.values():
        reader.close()

    def rate(label, size):
        return next((r["fetch_GBps"] for r in results if r["variant"] == label and r["size_mib"] == size), None)

    goals = {}
    if 64 in sizes:
        if rate("nixl", 64) and rate("grpc", 64):
            goals["nixl_over_grpc_at_64MiB"] = rate("nixl", 64) / rate("grpc", 64)
        if rate("shm-copy", 64):
            goals["shm_copy_fraction_of_memcpy_at_64MiB"] = rate("shm-copy", 64) / ceilings[64]
        for label in ("shm-view", "shm-into"):
            if rate(label, 64):
                goals[f"{label.replace('-', '_')}_fraction_of_memcpy_at_64MiB"] = rate(label, 64) / ceilings[64]
        if rate("nixl-into", 64) and rate("grpc-into", 64):
            goals["nixl_into_over_grpc_into_at_64MiB"] = rate("nixl-into", 64) / rate("grpc-into", 64)
    report = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "owner_device": str(owner_dev), "reader_device": str(reader_dev),
        "repeats": args.repeats, "torch_threads_per_process": args.threads, "statistic": "median", "units": "GB/s = 1e9 bytes/s; sizes in MiB",
        "notes": "fetch = transfer + checksum verification + tensor returned; shm-view returns a "
                 "copy-on-write mapping of the owner's segment, shm-copy a fresh private copy; nixl "
                 "reads into a fresh tensor registered per fetch (recv=direct), nixl-slab into a "
                 "registered reusable buffer plus a copy-out; '-into' variants fill a warm "
                 "preallocated out= tensor (as the memcpy ceiling does); fresh allocations pay "
                 "first-touch page faults",
        "memcpy_GBps": {str(k): v for k, v in ceilings.items()},
        "checksum": checksum_rate(64 * MiB, reader_dev, args.repeats),
        "results": results,
        "goals": goals,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(goals, indent=2))
    print(f"wrote {out_path}")
    return report


if __name__ == "__main__":
    main()
