"""Where the Wan VAE decode's GPU time goes: one 81x480x832 bf16 decode (random Wan2.1 VAE,
channels-last weights, time chunk 8, the serving path's ``chunked_decode``), timed once warm and
then profiled, the CUDA kernels listed by total time.

    python bench/vae_decode_profile.py                 # fused decoder (the serving default on CUDA)
    python bench/vae_decode_profile.py --no-fused      # diffusers' modules, chunked
    python bench/vae_decode_profile.py --compare       # time unfused, fused and diffusers' decode, then profile

``--shape 17x256x256 --batches 1,2,4,8`` times the serving path's decode of that clip shape at each
batch size (wall seconds per call against the CUDA kernels' total: how much of a small decode is
launch and host time) and writes them to ``--out`` as JSON.

``--compare`` also reports the fused and unfused frames' largest difference from diffusers'
own ``decode`` of the same latents (bf16 all three).
"""
import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from diffusers import AutoencoderKLWan  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from fastvideo3.models.wan import vae_decode as vd  # noqa: E402
from timing import synced_seconds, upper_median  # noqa: E402


def timed(fn, repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds of ``repeats`` synchronised calls after one warm call, and the last output."""
    _, times, out = synced_seconds(fn, repeats, torch.cuda.synchronize)
    return upper_median(times), out


def random_vae():
    """A random-weight Wan2.1 VAE in bf16 on CUDA, its convolution weights channels-last."""
    torch.manual_seed(0)
    m = AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                         temperal_downsample=[False, True, True]).cuda().to(torch.bfloat16).eval()
    vd.to_channels_last(m)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fused", action=argparse.BooleanOptionalAction, default=True,
                    help="profile the fused decoder (vae_decode.fuse_decoder); --no-fused: diffusers' modules")
    ap.add_argument("--compare", action="store_true", help="time unfused, fused and diffusers' decode first")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-chunk", type=int, default=8)
    ap.add_argument("--shape", default=None, help="FRAMESxHEIGHTxWIDTH: time this clip shape per batch size instead")
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes for --shape")
    ap.add_argument("--out", default=None, help="JSON for --shape")
    a = ap.parse_args()
    if a.shape:
        return per_batch(a)
    m = random_vae()
    z = torch.randn(1, 16, 21, 60, 104, device="cuda", dtype=torch.bfloat16)
    decode = lambda: vd.chunked_decode(m, z, a.time_chunk)  # noqa: E731
    with vd.cuda_flags("cuda"):
        if a.compare:
            s_unfused, v_unfused = timed(decode, a.repeats)
            vd.fuse_decoder(m)
            s_fused, v_fused = timed(decode, a.repeats)
            vd.unfuse_decoder(m)
            with torch.no_grad():
                s_ref, v_ref = timed(lambda: m.decode(z, return_dict=False)[0], 1)
            err = lambda v: round(float((v.float() - v_ref.float()).abs().max()), 4)  # noqa: E731
            print(f"decode_s unfused {s_unfused:.3f}  fused {s_fused:.3f}  diffusers {s_ref:.3f}  "
                  f"(speedup fused/unfused {s_unfused / s_fused:.2f}x)")
            print(f"max_abs_vs_diffusers unfused {err(v_unfused)}  fused {err(v_fused)}")
            del v_unfused, v_fused, v_ref
        if a.fused:
            print("fused modules", vd.fuse_decoder(m))
        decode()
        torch.cuda.synchronize()
        t = time.perf_counter()
        decode()
        torch.cuda.synchronize()
        print("decode_s", time.perf_counter() - t, "fused" if a.fused else "unfused")
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            decode()
            torch.cuda.synchronize()
    agg, cnt = collections.defaultdict(float), collections.Counter()
    for e in p.key_averages():
        agg[e.key[:110]] += e.device_time_total / 1e3
        cnt[e.key[:110]] += e.count
    print("kernel ms total", round(sum(agg.values()), 1))
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:30]:
        print(f"{v:9.1f} ms {cnt[k]:6d}  {k}")


def device_ms(fn) -> float:
    """The CUDA kernels' total milliseconds of one call of ``fn``."""
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sum(e.device_time_total for e in p.key_averages()) / 1e3


def per_batch(a) -> None:
    import json
    frames, height, width = (int(v) for v in a.shape.lower().split("x"))
    m = random_vae()
    fused = vd.fuse_decoder(m) if a.fused else 0
    rows = []
    with vd.cuda_flags("cuda"), torch.no_grad():
        for b in (int(v) for v in a.batches.split(",")):
            z = torch.randn(b, 16, (frames - 1) // 4 + 1, height // 8, width // 8, device="cuda", dtype=torch.bfloat16)
            decode = lambda: vd.chunked_decode(m, z, a.time_chunk)  # noqa: E731
            t_first = time.perf_counter()
            decode()
            torch.cuda.synchronize()
            first = time.perf_counter() - t_first
            s, _ = timed(decode, a.repeats)
            dev = device_ms(decode) / 1e3
            # what serving adds: the frames to [0, 1], [B, F, H, W, 3] fp32 on the host
            s_host, _ = timed(lambda: ((decode() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 4, 1).float().cpu()), a.repeats)
            rows.append({"batch": b, "first_call_s": round(first, 3), "wall_s": round(s, 4),
                         "wall_s_per_latent": round(s / b, 4), "kernels_s": round(dev, 4),
                         "kernel_fraction": round(dev / s, 3), "with_host_frames_s": round(s_host, 4)})
            print(json.dumps(rows[-1]), flush=True)
    out = {"what": f"Wan2.1 VAE decode (random weights, bf16, channels-last, fused={bool(fused)}) of "
                   f"{a.shape} per batch size", "time_chunk": a.time_chunk, "rows": rows,
           "summary": {"shape": a.shape, "wall_s_per_latent": {str(r["batch"]): r["wall_s_per_latent"] for r in rows},
                       "kernel_fraction": {str(r["batch"]): r["kernel_fraction"] for r in rows}}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
