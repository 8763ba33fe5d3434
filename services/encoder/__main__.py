"""``python -m services.encoder --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
from fastvideo3.vocab import Role
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.cache import TextFeatureCache
    from fastvideo3.runtime.pool.executors import EncoderExecutor
    cache = TextFeatureCache(max_bytes=int(cfg.feature_cache_mb * (1 << 20))) if cfg.feature_cache_mb > 0 else None
    return EncoderExecutor(card, transport, cfg.device, cfg.precision, cache=cache)


if __name__ == "__main__":
    main(Role.ENCODER, build)
