"""What a request's interceptors did, from its LoopState's ``plugin_state`` (for results,
provenance and benchmarks)."""
from __future__ import annotations


def summarize(plugin_state: dict) -> dict:
    """Steps reused per CFG stream, and block evaluations run / would have run, summed."""
    computed = total = 0
    reused: dict[str, list[int]] = {}
    diffs: dict[str, dict[str, float]] = {}
    for policy, streams in (plugin_state or {}).items():
        for stream, st in streams.items():
            computed += int(st.get("blocks_computed", 0))
            total += int(st.get("blocks_total", 0))
            reused[f"{policy}/{stream}"] = list(st.get("reused", []))
            diffs[f"{policy}/{stream}"] = dict(st.get("diffs", {}))
    return {"reused_steps": reused, "diffs": diffs, "blocks_computed": computed, "blocks_total": total,
            "block_savings": (1.0 - computed / total) if total else 0.0}
