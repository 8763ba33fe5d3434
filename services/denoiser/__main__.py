"""``python -m services.denoiser --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.runtime.executors import DenoiserExecutor
    experts = [e for e in cfg.experts.split(",") if e] or None
    return DenoiserExecutor(card, transport, cfg.device, cfg.precision, batching=not cfg.no_batching, experts=experts)


if __name__ == "__main__":
    main("denoiser", build)
