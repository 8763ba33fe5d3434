"""Shared fixtures. Tests never reach the Hugging Face hub: every model is built locally."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_wan_dir(tmp_path_factory: pytest.TempPathFactory):
    """A random tiny Wan2.1 T2V directory (diffusers layout, seed 0), built once per session."""
    from fastvideo3.models.wan.synthetic import build_wan_dir

    return build_wan_dir(tmp_path_factory.mktemp("wan") / "tiny-wan", preset="tiny", seed=0)


from tests.redis_server import redis_url  # noqa: E402,F401  (a real redis-server per session)
