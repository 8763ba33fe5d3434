"""``python -m services.denoiser --port P --card NAME [--nproc N --plan PLAN] [...]``: wiring only
(see services/common/pool.py; a multi-rank replica is services/denoiser/parallel.py)."""
import sys

from fastvideo3.vocab import Role
from services.common.pool import run_pool


def build(cfg, card, transport):
    from fastvideo3.runtime.pool.dit_executor import DenoiserExecutor
    experts = [e for e in cfg.experts.split(",") if e] or None
    ex = DenoiserExecutor(card, transport, cfg.device, cfg.precision, batching=not cfg.no_batching, experts=experts,
                          lora_slots=cfg.lora_slots, lora_max_rank=cfg.lora_max_rank,
                          lora_merge_cache_bytes=int(cfg.lora_merge_cache_gib * 2**30))
    if cfg.merge_adapter:  # a pool dedicated to one adapter, merged into its weights
        adapter_id, path = cfg.merge_adapter.split("=", 1)
        ex.merge_adapter(adapter_id, cfg.merge_scale, path)
    return ex


def warm(cfg, executor):
    """The warm phase (before the pool serves): the card's CUDA-graph buckets, unless ``--graph-buckets off``."""
    executor.warm_graphs(cfg.graph_buckets)


if __name__ == "__main__":
    from services.denoiser.parallel import split_args
    par, rest = split_args(sys.argv[1:])
    if par is None:  # one rank: the ordinary pool process
        sys.exit(run_pool(Role.DENOISER, build, rest, warm=warm))
    from services.denoiser.parallel import exit_now, run_parallel
    exit_now(run_parallel(par, rest))
