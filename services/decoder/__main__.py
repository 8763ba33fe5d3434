"""``python -m services.decoder --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
from fastvideo3.vocab import Role
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.runtime.pool.vae_executor import DecoderExecutor
    return DecoderExecutor(card, transport, cfg.device, cfg.precision, max_decode_batch=cfg.max_decode_batch)


if __name__ == "__main__":
    main(Role.DECODER, build)
