"""``python -m services.decoder --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.runtime.executors import DecoderExecutor
    return DecoderExecutor(card, transport, cfg.device, cfg.precision)


if __name__ == "__main__":
    main("decoder", build)
