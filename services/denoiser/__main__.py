"""``python -m services.denoiser --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.runtime.executors import DenoiserExecutor
    ex = DenoiserExecutor(card, transport, cfg.device, cfg.precision, batching=not cfg.no_batching,
                          lora_slots=cfg.lora_slots, lora_max_rank=cfg.lora_max_rank)
    if cfg.merge_adapter:  # a pool dedicated to one adapter, merged into its weights
        adapter_id, path = cfg.merge_adapter.split("=", 1)
        ex.merge_adapter(adapter_id, cfg.merge_scale, path)
    return ex


if __name__ == "__main__":
    main("denoiser", build)
