"""``python -m services.decoder --port P --card NAME [...]``: wiring only (see services/common/pool.py)."""
import sys

from fastvideo3.vocab import Role
from services.common.pool import run_pool


def build(cfg, card, transport):
    from fastvideo3.runtime.pool.vae_executor import DecoderExecutor
    return DecoderExecutor(card, transport, cfg.device, cfg.precision, max_decode_batch=cfg.max_decode_batch)


def warm(cfg, executor):
    """The warm phase (before the pool serves): cuDNN tuned for the card's bucket shapes, unless ``--decode-warm off``."""
    executor.warm_decode(cfg.decode_warm)


if __name__ == "__main__":
    sys.exit(run_pool(Role.DECODER, build, warm=warm))
