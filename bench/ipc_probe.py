"""Where a cuda_ipc fetch spends its time, and which device-checksum launch settings are fastest.

An owner process publishes one tensor through ``cuda_ipc``; this process maps it and times, at
each size: the in-process copy ceiling, the digest kernel alone (device time from CUDA events,
and host time with the digest read back), and whole fetches (a verified copy, into a warm
``out=``, and a pinned zero-copy view) under every kernel setting in ``SETTINGS``. It also
profiles the fetch of the default setting (the functions that cost the most host time) and times
the fetch's host-side steps one by one. Writes JSON (``--out``) and prints a table; the fastest
setting is reported as ``summary.best_setting``.

  python bench/ipc_probe.py --out OUT/ipc_probe.json [--sizes-mib 64,256] [--repeats 30]
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import multiprocessing as mp
import pstats
import statistics
import sys
from pathlib import Path

import torch
from timing import cuda_times, synced_seconds, upper_median  # noqa: E402 - the sibling module in bench/

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastvideo3.transport import checksum as _checksum  # noqa: E402
from fastvideo3.transport import device_checksum  # noqa: E402
from fastvideo3.transport import make_transport  # noqa: E402
from fastvideo3.transport.ref import TensorRef  # noqa: E402

MiB = 1 << 20
SETTINGS = [
    {"variant": "block", "warps": 8, "pinned": False},   # the earlier default
    {"variant": "atomic", "block": 2048, "warps": 8, "programs_per_sm": 4, "pinned": True},
    {"variant": "atomic", "block": 2048, "warps": 4, "programs_per_sm": 8, "pinned": True},
    {"variant": "atomic", "block": 1024, "warps": 4, "programs_per_sm": 8, "pinned": True},
    {"variant": "block", "warps": 8, "pinned": True},
    {"variant": "loop", "block": 2048, "warps": 8, "programs_per_sm": 4, "pinned": True},
    {"variant": "loop", "block": 4096, "warps": 8, "programs_per_sm": 4, "pinned": True},
    {"variant": "loop", "block": 2048, "warps": 4, "programs_per_sm": 8, "pinned": True},

]


def _owner(sizes: list[int], conn) -> None:
    t = make_transport("cuda_ipc", owner="probe-owner", device="cuda")
    refs = {}
    for size in sizes:
        src = torch.randn(size * MiB // 4, device="cuda")
        refs[size] = t.publish(f"probe-{size}", "x", src).to_dict()
    conn.send(refs)
    conn.recv()
    t.close()
    conn.send("bye")


def _host_median(fn, repeats: int) -> float:
    """Median wall seconds of ``repeats`` synchronised calls after one warm call."""
    return upper_median(synced_seconds(fn, repeats, torch.cuda.synchronize)[1])


def _device_median(fn, repeats: int) -> float:
    return statistics.median(ms / 1e3 for ms in cuda_times(fn, 1, repeats))


def _kernel_only(src_u8: torch.Tensor, dst_u8: torch.Tensor | None, repeats: int, per_graph: int = 10) -> float:
    """Device time of the digest kernel alone (no readback): ``per_graph`` launches captured in one
    graph, replayed back to back, so host launch costs stay out of the events."""
    n4 = src_u8.numel() - src_u8.numel() % 4
    grid = device_checksum._programs(n4 // 4, src_u8.device)
    partials = torch.empty(device_checksum._partials_len(grid), dtype=torch.int64, device=src_u8.device)
    device_checksum._run_kernel(src_u8, dst_u8, n4, grid, partials)  # compiles
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            device_checksum._run_kernel(src_u8, dst_u8, n4, grid, partials)
    return _device_median(graph.replay, repeats) / per_graph


def _profile(fn, n: int) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
        torch.cuda.synchronize()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    lines = [line for line in buf.getvalue().splitlines() if line.strip()][-16:]
    site = str(Path(torch.__file__).resolve().parents[1]) + "/"
    return [line.replace(str(ROOT) + "/", "").replace(site, "site-packages/") for line in lines]


def _steps(reader, ref: TensorRef, repeats: int) -> dict:
    """Host time of the fetch's steps, one by one (microseconds, median)."""
    d = ref.descriptor
    table = reader._reader_table(d["table"])
    slab = reader._mapping(table.name, d["epoch"], d["export"])
    src = slab[:ref.nbytes]
    steps = {
        "ref.validate": lambda: ref.validate(),
        "owner_alive (flock)": lambda: table.owner_alive(),
        "check_slot": lambda: reader._check_slot(table, ref, d["slot"], d["epoch"], d["generation"]),
        "pin+unpin": lambda: (table.pin(d["slot"]), table.unpin(d["slot"])),
        "torch.empty": lambda: torch.empty(ref.shape, dtype=ref.torch_dtype, device="cuda"),
        "checksum.compute (mapped)": lambda: _checksum.compute(src, "fsum64"),
        "layer.view": lambda: reader.layer.view(slab, ref.nbytes, lambda: None),
    }
    out = {}
    for name, fn in steps.items():
        out[name] = round(_host_median(fn, repeats) * 1e6, 2)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", default="4,64,256")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--out", default="out/ipc_probe.json")
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_owner, args=(sizes, child), daemon=True)
    proc.start()
    if not parent.poll(300):
        raise SystemExit("owner did not publish")
    refs = {size: TensorRef.from_dict(r) for size, r in parent.recv().items()}
    reader = make_transport("cuda_ipc", owner="probe-reader", device="cuda")
    report: dict = {"command": "python bench/ipc_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                    "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "sizes": {}}
    default = device_checksum.CONFIG.as_dict()
    best: dict = {}
    for size in sizes:
        ref = refs[size]
        nbytes = size * MiB
        reader.fetch(ref, deadline_s=60, copy=True)  # maps the slab
        d = ref.descriptor
        slab = reader._mapping(reader._reader_table(d["table"]).name, d["epoch"], d["export"])
        src_u8 = slab[:nbytes]
        dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        local = torch.randn(nbytes // 4, device="cuda")
        local_dst = torch.empty_like(local)
        row: dict = {
            "memcpy_GBps": nbytes / _host_median(lambda: local_dst.copy_(local), args.repeats) / 1e9,
            "memcpy_device_GBps": nbytes / _device_median(lambda: local_dst.copy_(local), args.repeats) / 1e9,
            "mapped_copy_GBps": nbytes / _host_median(lambda: dst.copy_(src_u8), args.repeats) / 1e9,
            "settings": [],
        }
        warm_out = torch.zeros(ref.shape, dtype=ref.torch_dtype, device="cuda")
        for setting in SETTINGS:
            device_checksum.configure(**{**default, **setting})
            entry = {"setting": device_checksum.CONFIG.as_dict()}
            try:
                entry["kernel_sum_GBps"] = nbytes / _kernel_only(src_u8, None, args.repeats) / 1e9
                entry["kernel_copy_sum_GBps"] = nbytes / _kernel_only(src_u8, dst, args.repeats) / 1e9
                entry["checksum_GBps"] = nbytes / _host_median(lambda: _checksum.compute(src_u8, "fsum64"),
                                                               args.repeats) / 1e9
                for label, kw in (("fetch_copy", {"copy": True}), ("fetch_into", {"out": warm_out}),
                                  ("fetch_view", {"copy": False})):
                    secs = _host_median(lambda: reader.fetch(ref, deadline_s=60, **kw), args.repeats)
                    entry[label + "_GBps"] = nbytes / secs / 1e9
                    entry[label + "_us"] = round(secs * 1e6, 1)
            except Exception as exc:  # noqa: BLE001 - a failing setting is recorded, the others run
                entry["error"] = f"{type(exc).__name__}: {exc}"
            row["settings"].append(entry)
            fetches = [entry.get(k) or 0 for k in ("fetch_copy_GBps", "fetch_into_GBps", "fetch_view_GBps")]
            if max(fetches) > best.get(size, (0, None))[0]:
                best[size] = (max(fetches), entry["setting"])
            print(f"{size:>4} MiB {json.dumps(entry['setting'])}: " + ", ".join(
                f"{k} {v:.0f}" for k, v in entry.items() if k.endswith("GBps") and isinstance(v, float)),
                flush=True)
        device_checksum.configure(**default)
        row["steps_us"] = _steps(reader, ref, args.repeats)
        row["profile_fetch_copy"] = _profile(lambda: reader.fetch(ref, deadline_s=60, copy=True), 50)
        row["profile_fetch_view"] = _profile(lambda: reader.fetch(ref, deadline_s=60, copy=False), 50)
        report["sizes"][str(size)] = row
        print(f"{size:>4} MiB memcpy {row['memcpy_GBps']:.0f} GB/s (device {row['memcpy_device_GBps']:.0f}); "
              f"steps {row['steps_us']}", flush=True)
    report["graph_stats"] = device_checksum.graph_stats()
    report["summary"] = {"best_setting": {str(s): b[1] for s, b in best.items()},
                         "best_fetch_GBps": {str(s): b[0] for s, b in best.items()},
                         "memcpy_GBps": {s: r["memcpy_GBps"] for s, r in report["sizes"].items()}}
    reader.close()
    parent.send("done")
    parent.poll(30)
    proc.join(30)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report["summary"], indent=1))
    return report


if __name__ == "__main__":
    main()
