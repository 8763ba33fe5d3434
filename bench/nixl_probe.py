"""Which UCX settings make NIXL move VRAM to VRAM on a CUDA path, and at what speed.

Each configuration runs in fresh processes (UCX reads its environment once per process): an
owner publishes a 64 MiB tensor through the project's ``NixlTransport``; a reader fetches it
(end to end: the READ, the generation check, the checksum verification) and reports GB/s. UCX
is asked to report the protocols it selects (``UCX_PROTO_INFO=y``, ``UCX_LOG_LEVEL=info``); the
transport names in that report are recorded per configuration. Also recorded: the UCX modules
shipped in the NIXL wheel and whether each loads (a module whose libraries cannot be found is
silently skipped by UCX).

  python bench/nixl_probe.py --device cuda --out $OUT/nixl_probe.json     # the whole sweep
  python bench/nixl_probe.py --one '{"env": {...}, "err": "none"}'        # one configuration

Writes JSON as it goes (what finished is kept when a later configuration hangs).
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MiB = 1 << 20
# (name, extra environment, NIXL UCX error-handling mode; None = NIXL's default, "peer")
# Ordered by what is still open. Measured on an H200 (NIXL 1.5.1, UCX 1.23, one GPU): with UCX's
# own defaults a READ of GPU memory ran as "software emulation" at host pace (0.56 GB/s over TCP
# with NIXL's "peer" error handling, 0.73 GB/s over shared memory with "none"). UCX's cuda_ipc
# turns its zero-copy GET off when the GPU has no NVLink (one GPU has none); NixlTransport now
# asks for it (UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y unless set). "auto" rows are UCX's own choice.
CONFIGS = [
    ("project_default", {}, None),  # peer error handling, GET zero-copy on
    ("err_none", {}, "none"),
    ("ucx_default_get_auto", {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "auto"}, None),  # the old baseline
    ("err_none_cuda_only", {"UCX_TLS": "cuda_ipc,cuda_copy,sm,self"}, "none"),
    # if GPU memory still takes no zero-copy protocol: lane and protocol selection at debug level
    ("err_none_debug", {"UCX_TLS": "sm,cuda_copy,cuda_ipc,self", "UCX_LOG_LEVEL": "debug"}, "none"),
    ("proto_v1", {"UCX_PROTO_ENABLE": "n"}, None),
    ("err_none_get_auto", {"UCX_CUDA_IPC_ENABLE_GET_ZCOPY": "auto"}, "none"),
]


def _owner(cfg: dict, nbytes: int, device: str, conn) -> None:
    import torch

    from fastvideo3.transport import make_transport
    try:
        t = make_transport("nixl", owner="probe-owner", device=device, ucx_error_handling=cfg.get("err"))
        src = torch.randn(nbytes // 4, device=device)
        conn.send(("ok", t.publish("probe", "x", src).to_dict()))
    except Exception as exc:  # reported, not raised: the sweep goes on
        conn.send(("err", f"{type(exc).__name__}: {exc}"))
        return
    conn.recv()
    t.close()


def run_one(cfg: dict) -> dict:
    """Owner in a spawned child, reader here; returns a result dict (never raises)."""
    import torch

    from fastvideo3.transport import TensorRef, make_transport
    device, nbytes, repeats = cfg.get("device", "cuda"), cfg.get("mib", 64) * MiB, cfg.get("repeats", 5)
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=_owner, args=(cfg, nbytes, device, child), daemon=True)
    proc.start()
    out: dict = {"ok": False}
    try:
        if not conn.poll(90):
            return {**out, "error": "owner did not start"}
        kind, value = conn.recv()
        if kind != "ok":
            return {**out, "error": "owner: " + value}
        ref = TensorRef.from_dict(value)
        reader = make_transport("nixl", owner="probe-reader", device=device, ucx_error_handling=cfg.get("err"))
        try:
            times = []
            for i in range(repeats + 1):
                start = time.perf_counter()
                got = reader.fetch(ref, deadline_s=30)
                if got.device.type == "cuda":
                    torch.cuda.synchronize(got.device)
                if i:
                    times.append(time.perf_counter() - start)
            secs = statistics.median(times)
            out = {"ok": True, "fetch_median_s": secs, "GBps": nbytes / secs / 1e9, "ucx": reader.stats().get("ucx")}
        finally:
            reader.close()
        conn.send("done")
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        proc.join(20)
        if proc.is_alive():
            proc.kill()
    return out


def ucx_modules() -> dict:
    """The UCX modules bundled with NIXL and whether each one's libraries load here."""
    try:
        import torch  # noqa: F401  (its CUDA runtime is what UCX's CUDA modules link against)
        import nixl_cu13  # noqa: F401
        libs = Path(nixl_cu13.__file__).resolve().parent.parent / "nixl_cu13.libs"
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    found = {}
    for path in sorted(glob.glob(str(libs / "ucx" / "*.so*"))):
        try:
            ctypes.CDLL(path)
            found[Path(path).name] = "loads"
        except OSError as exc:
            found[Path(path).name] = str(exc)[-200:]
    version = None
    for path in glob.glob(str(libs / "libucp-*.so*")):
        try:
            lib = ctypes.CDLL(path)
            lib.ucp_get_version_string.restype = ctypes.c_char_p
            version = lib.ucp_get_version_string().decode()
        except Exception:
            pass
    return {"ucx_version": version, "modules": found}


def sweep(args) -> dict:
    from fastvideo3.transport.nixl_backend import parse_ucx_data_protocols, parse_ucx_transports, vram_data_transports
    report = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "size_mib": args.mib,
              "ucx": ucx_modules(), "configs": []}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + args.time_limit
    wanted = [c for c in args.configs.split(",") if c]
    for name, env_extra, err in [c for c in CONFIGS if not wanted or c[0] in wanted]:
        left = end - time.monotonic()
        if left < 20:
            report["configs"].append({"name": name, "skipped": "time limit"})
            continue
        env = {**os.environ, "UCX_PROTO_INFO": "y", "UCX_LOG_LEVEL": "info", **env_extra,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cfg = {"device": args.device, "mib": args.mib, "repeats": args.repeats, "err": err}
        row: dict = {"name": name, "env": env_extra, "ucx_error_handling": err or "peer (NIXL default)"}
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", json.dumps(cfg)], env=env,
                                  capture_output=True, text=True, timeout=min(args.per_config_s, left - 5))
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{\"probe\":")]
            row.update(json.loads(lines[-1])["probe"] if lines else {"ok": False, "error": f"rc={proc.returncode}"})
            log = proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            row.update({"ok": False, "error": "timed out"})
            log = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace") \
                if isinstance(exc.stdout, bytes) else (exc.stdout or "") + (exc.stderr or "")
        row["seconds"] = round(time.monotonic() - start, 1)
        row["ucx_transports"] = parse_ucx_transports(log)  # any lane of any endpoint
        row["vram_transports"] = vram_data_transports(log)  # what moved GPU memory
        row["vram_protocols"] = [p for p in parse_ucx_data_protocols(log) if "cuda" in p["op"]][:12]
        lines = log.splitlines()
        lanes = [ln[-300:] for ln in lines if "ucp_worker.c" in ln and "cfg#" in ln]
        why = [ln[-300:] for ln in lines if any(k in ln for k in (
            "high-bw", "rma_bw", "not suitable", "unreachable", "get_offload", "get_zcopy", "rkey",
            "cuda_ipc", "no lane", "rror"))]
        row["log_excerpt"] = lanes[:20] + why[:120]
        report["configs"].append(row)
        print(f"{name:<24} {'ok' if row.get('ok') else 'FAIL':<5} "
              f"{row.get('GBps', 0):8.2f} GB/s  vram={row['vram_transports']}  {row.get('error', '')[:120]}", flush=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
    ok = [c for c in report["configs"] if c.get("ok")]
    best = max(ok, key=lambda c: c["GBps"], default=None)
    report["best"] = {k: best[k] for k in ("name", "env", "ucx_error_handling", "GBps", "ucx_transports",
                                           "vram_transports")} if best else None
    report = {"summary": {"best_config": best["name"] if best else None, "best_GBps": best["GBps"] if best else None,
                          "GBps_by_config": {c["name"]: c.get("GBps") for c in report["configs"]},
                          "vram_transports_by_config": {c["name"]: c.get("vram_transports")
                                                        for c in report["configs"]}}, **report}
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--one", default=None, help="run one configuration (JSON) and print its result")
    p.add_argument("--device", default="cuda")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--per-config-s", type=float, default=45)
    p.add_argument("--time-limit", type=float, default=300)
    p.add_argument("--configs", default="", help="comma list of configuration names (default: all, in order)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "nixl_probe.json"))
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps({"probe": run_one(json.loads(args.one))}), flush=True)
        return None
    return sweep(args)


if __name__ == "__main__":
    main()
