"""What the GraphRunner tests (CPU and CUDA) share."""
from __future__ import annotations

from typing import Any, Callable


def counting(fn: Callable[..., Any]) -> tuple[Callable[..., Any], list[int]]:
    """``fn`` wrapped, and a list that grows by one each time the wrapper runs: a replay that runs
    the captured graph never calls the Python function, so the list tells replays from calls."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fn(*args, **kwargs)

    return counted, calls
