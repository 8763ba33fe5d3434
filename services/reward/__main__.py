"""``python -m services.reward --port P --card NAME [--scorers a,b]``: wiring only (see services/common/pool.py)."""
from fastvideo3.vocab import Role
from services.common.pool import main


def build(cfg, card, transport):
    from fastvideo3.runtime.pool.reward_executor import RewardExecutor
    names = [s.strip() for s in cfg.scorers.split(",") if s.strip()] or None
    return RewardExecutor(card, transport, cfg.device, cfg.precision, scorers=names)


if __name__ == "__main__":
    main(Role.REWARD, build)
