"""Where the Wan VAE decode's GPU time goes: one 81x480x832 bf16 decode (random Wan2.1 VAE,
channels-last weights, time chunk 8, the serving path's ``chunked_decode``), timed once warm and
then profiled, the CUDA kernels listed by total time.

    python bench/vae_decode_profile.py        # on a CUDA machine with diffusers installed
"""
import collections
import time

import torch
from diffusers import AutoencoderKLWan
from torch.profiler import ProfilerActivity, profile

from fastvideo3.models.wan import vae_decode as vd


def main() -> None:
    torch.manual_seed(0)
    m = AutoencoderKLWan(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2,
                         temperal_downsample=[False, True, True]).cuda().to(torch.bfloat16).eval()
    vd.to_channels_last(m)
    z = torch.randn(1, 16, 21, 60, 104, device="cuda", dtype=torch.bfloat16)
    with vd.cuda_flags("cuda"):
        vd.chunked_decode(m, z, 8)
        torch.cuda.synchronize()
        t = time.perf_counter()
        vd.chunked_decode(m, z, 8)
        torch.cuda.synchronize()
        print("decode_s", time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            vd.chunked_decode(m, z, 8)
            torch.cuda.synchronize()
    agg, cnt = collections.defaultdict(float), collections.Counter()
    for e in p.key_averages():
        agg[e.key[:110]] += e.device_time_total / 1e3
        cnt[e.key[:110]] += e.count
    print("kernel ms total", round(sum(agg.values()), 1))
    for k, v in sorted(agg.items(), key=lambda kv: -kv[1])[:30]:
        print(f"{v:9.1f} ms {cnt[k]:6d}  {k}")


if __name__ == "__main__":
    main()
