"""Fixtures shared by the end-to-end tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def gateway_stack(redis_url, tmp_path_factory):
    """One ``fastvideo3 serve --gateway-port P --state-store redis://...`` for every gateway test
    (the OpenAI SDK tests and the playground's browser tests share it)."""
    from tests.e2e.gateway_stack import serve_stack
    with serve_stack(redis_url, tmp_path_factory.mktemp("serve-gateway")) as stack:
        yield stack
