"""A native host drives the denoiser's captured CUDA graphs through the C ABI.

The denoiser executor (tiny card, CUDA, fast path) declares and captures one shape bucket
through its model runtime; its C face (``include/fastvideo3/runtime.h``) is handed to the C
consumer in tests/native/consumer.c, compiled here with the machine's ``cc``/``gcc`` (else
``nvcc``) and loaded into this process. The consumer reaches the CUDA runtime with dlopen.

1. replay: the host writes the DiT inputs into the SWAP buffers (cudaMemcpy), launches the
   ``dit`` graph through its exported exec handle on the exported stream (cudaGraphLaunch) and
   reads ``noise_pred``; the bytes must equal the Python replay of the same graph.
2. snapshot/restore: from a seeded state the host snapshots the state regions, fires the stage
   graphs (load, dit, update) 3 times, reads the state, restores the snapshot, fires the same
   3 steps again: identical latents and history. The Python ``step`` from the same snapshot is
   compared too.

    python bench/export_native.py --out $OUT/export_native_h200.json

Writes JSON whose ``summary`` holds ``c_replay_bit_identical`` and ``snapshot_restore_identical``.
"""
from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.native.cc import Err, compiler, load  # noqa: E402


def cudart_path() -> str:
    """The CUDA runtime library torch loaded (else one shipped next to torch, else the system's)."""
    torch.zeros(1, device="cuda")
    with open("/proc/self/maps") as f:
        for line in f:
            if "libcudart.so" in line:
                return line.split()[-1]
    site = Path(torch.__file__).resolve().parents[1]
    for pattern in ("nvidia/*/lib/libcudart.so*", "nvidia/cuda_runtime/lib/libcudart.so*", "torch/lib/libcudart*.so*"):
        hits = sorted(glob.glob(str(site / pattern)))
        if hits:
            return hits[0]
    return "libcudart.so"


def check(rc: int, err: Err, what: str) -> None:
    if rc != 0:
        raise RuntimeError(f"{what}: rc={rc}: {err}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "out"), "export_native_h200.json"))
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--height", type=int, default=256)
    ap.add_argument("--width", type=int, default=448)
    a = ap.parse_args()
    result: dict = {"summary": {"c_replay_bit_identical": False, "snapshot_restore_identical": False},
                    "command": "python bench/export_native.py", "compiler": compiler(),
                    "torch": torch.__version__, "python": platform.python_version()}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        run(a, result)
    except Exception as exc:  # noqa: BLE001 - the partial result is still written
        result["error"] = f"{type(exc).__name__}: {exc}"
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0 if all(result["summary"].values()) else 1


def run(a, result: dict) -> None:
    from fastvideo3.models.wan.cards import wan_tiny
    from fastvideo3.export import arena_views
    from fastvideo3.export.native import STATE_BUFFER, NativeModelRuntime
    from fastvideo3.models.wan.components import latent_shape
    from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
    from fastvideo3.transport import make_transport

    result["gpu"] = torch.cuda.get_device_name()
    card = wan_tiny()
    ex = DenoiserExecutor(card, make_transport("inproc", owner="bench"), "cuda")
    shape = latent_shape(card, a.frames, a.height, a.width)
    t0 = time.perf_counter()
    ex.prepare_graphs([(2, shape)])  # the pool's warm phase: CUDA graphs through the runtime
    result["capture_s"] = round(time.perf_counter() - t0, 3)
    rt = ex.runtime
    key = sorted(ex._prepared)[0]
    rt.prepare(key)
    result.update({"bucket": key, "fingerprint": rt.fingerprint_hex, "precision": ex.precision,
                   "stages": [s.graph for s in rt.stages]})

    with tempfile.TemporaryDirectory() as tmp:
        lib = load("consumer", Path(tmp))
        err = Err()
        result["cudart"] = cudart_path()
        check(lib.fv3c_load_cuda(result["cudart"].encode(), *err.args), err, "load cuda")
        nat = NativeModelRuntime(rt)
        ptr = nat.ptr
        fp, fnv = ctypes.c_uint64(), ctypes.c_uint64()
        check(lib.fv3c_adopt(ptr, ctypes.byref(fp), ctypes.byref(fnv), *err.args), err, "adopt")
        exp = nat.struct.exp.contents
        result["graphs"] = [{"name": exp.graphs[i].name.decode(), "bucket": exp.graphs[i].bucket.decode(),
                             "exec_handle": bool(exp.graphs[i].exec_handle)} for i in range(exp.num_graphs)]
        result["stream_handle"] = bool(exp.streams[0].native_handle) if exp.num_streams else False
        result["fingerprint_is_fnv1a_of_identity"] = fp.value == fnv.value == rt.fingerprint
        replay(lib, rt, key, ptr, err, result)
        snapshot_steps(lib, rt, key, ptr, err, result, arena_views, STATE_BUFFER)
        check(lib.fv3c_release(ptr, *err.args), err, "release")
        result["refcount_after_host_release"] = nat.refcount
        nat.release()


def replay(lib, rt, key, ptr, err, result) -> None:
    g = torch.Generator(device="cpu").manual_seed(0)
    inputs = {}
    for name in ("latents", "timestep", "text"):
        spec = rt.ports[name]
        value = torch.randn(spec.shape_for(key), generator=g)
        inputs[name] = value * 400 + 500 if name == "timestep" else value
        inputs[name] = inputs[name].to(rt.export.buffers[name].dtype)
    # Python replay of the captured dit graph
    for name, value in inputs.items():
        rt.set_input(name, value.cuda())
    rt.fire("dit")
    want = rt.get_output("noise_pred").cpu().clone()
    # scribble everything, then let the host write the inputs and launch the same graph
    for name in ("latents", "timestep", "text", "noise_pred"):
        rt.export.buffers[name].zero_()
    torch.cuda.synchronize()
    for name, value in inputs.items():
        host = value.contiguous()
        check(lib.fv3c_write_swap(ptr, name.encode(), key.encode(), ctypes.c_void_p(host.data_ptr()),
                                  host.numel() * host.element_size(), *err.args), err, f"write {name}")
    got = torch.empty_like(want)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        check(lib.fv3c_launch_graph(ptr, b"dit", key.encode(), *err.args), err, "launch dit")
        times.append(time.perf_counter() - t0)
    check(lib.fv3c_read_swap(ptr, b"noise_pred", key.encode(), ctypes.c_void_p(got.data_ptr()),
                             got.numel() * got.element_size(), *err.args), err, "read noise_pred")
    same = bool(torch.equal(got.view(torch.uint8) if got.dtype != torch.uint8 else got,
                            want.view(torch.uint8) if want.dtype != torch.uint8 else want))
    result["replay"] = {"output_shape": list(want.shape), "dtype": str(want.dtype),
                        "max_abs_diff": float((got.float() - want.float()).abs().max()),
                        "output_abs_mean": float(want.float().abs().mean()),
                        "c_launch_ms_median": round(sorted(times)[len(times) // 2] * 1e3, 3)}
    result["summary"]["c_replay_bit_identical"] = same


def snapshot_steps(lib, rt, key, ptr, err, result, arena_views, state_buffer) -> None:
    arena = rt.export.buffers[state_buffer]
    views = arena_views(arena, rt.regions)
    g = torch.Generator(device="cpu").manual_seed(1)
    views["latent"].copy_(torch.randn(views["latent"].shape, generator=g).cuda())
    views["history.has_previous"].zero_()
    rt.set_input("timestep", torch.full(rt.ports["timestep"].shape_for(key), 600.0, device="cuda"))
    rt.set_input("dt", torch.full(rt.ports["dt"].shape_for(key), -0.05, device="cuda"))
    torch.cuda.synchronize()
    n = int(lib.fv3c_state_bytes(ptr))
    snap, after_a, after_b, after_py = (ctypes.create_string_buffer(n) for _ in range(4))
    check(lib.fv3c_snapshot(ptr, snap, n, *err.args), err, "snapshot")
    for _ in range(3):
        check(lib.fv3c_fire_stages(ptr, key.encode(), *err.args), err, "fire stages")
    check(lib.fv3c_snapshot(ptr, after_a, n, *err.args), err, "read state A")
    check(lib.fv3c_restore(ptr, snap, n, *err.args), err, "restore")
    for _ in range(3):
        check(lib.fv3c_fire_stages(ptr, key.encode(), *err.args), err, "fire stages")
    check(lib.fv3c_snapshot(ptr, after_b, n, *err.args), err, "read state B")
    # the Python path from the same snapshot: rt.step() three times
    check(lib.fv3c_restore(ptr, snap, n, *err.args), err, "restore")
    for _ in range(3):
        rt.step()
    torch.cuda.synchronize()
    check(lib.fv3c_snapshot(ptr, after_py, n, *err.args), err, "read state (Python steps)")
    moved = after_a.raw != snap.raw
    result["snapshot"] = {"state_bytes": n, "regions": [r.name for r in rt.regions], "state_moved": moved,
                          "python_steps_equal_c_steps": after_py.raw == after_a.raw}
    result["summary"]["snapshot_restore_identical"] = bool(moved and after_a.raw == after_b.raw)


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
