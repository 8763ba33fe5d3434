"""LoRA adapters in a real fleet: load, use, reload a new version under load, unload while in use,
reload — no request fails, the version follows the file, and the prompt cache never serves an
entry made under one version to a request running another."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from safetensors.torch import save_file

from fastvideo3.card import resolve_card
from fastvideo3.client import FleetClient
from fastvideo3.errors import FailedPrecondition, NotFound
from fastvideo3.models.wan.dit import WanDiTConfig
from tests.fleet_fixture import fleet_fixture, pool_describe, wait_until
from tests.parity.test_lora import random_lora

pytestmark = pytest.mark.timeout(600)
fleet = fleet_fixture(scope="module", roles=("encoder", "denoiser", "decoder"))
KW = dict(output_format="npy", num_frames=5, height=32, width=32, num_inference_steps=3)
STYLE = [{"id": "style", "scale": 0.8}]


def _misses(target: str) -> float:
    return pool_describe(target).cache_stats["feature_cache.misses"]


def test_load_use_reload_unload_under_load(fleet, tmp_path):
    cfg = WanDiTConfig.from_dict(resolve_card("wan-tiny").components["transformer"].config)
    v1_file, v2_file = tmp_path / "v1.safetensors", tmp_path / "v2.safetensors"
    save_file(random_lora(cfg, 8, 1), str(v1_file))
    save_file(random_lora(cfg, 8, 2), str(v2_file))
    encoder = fleet.pools["encoder"][0].target
    with FleetClient(fleet.target, timeout_s=300) as c:
        with pytest.raises(NotFound, match="'style' is not loaded"):
            c.generate("a cat", adapters=STYLE, **KW)
        v1 = c.load_adapter("style", str(v1_file))["version"]
        assert c.describe()["description"]["adapters"] == {"style": v1}
        base = c.generate("a cat", seed=1, **KW)
        m0 = _misses(encoder)
        first = c.generate("a cat", seed=1, adapters=STYLE, **KW)
        assert _misses(encoder) == m0 + 1  # the adapter's version is in the prompt cache's key
        again = c.generate("a cat", seed=1, adapters=STYLE, **KW)
        assert _misses(encoder) == m0 + 1  # same version: served from the cache
        assert first.sidecar["adapters"] == [{"id": "style", "version": v1, "scale": 0.8}]
        assert first.sidecar["runtime"]["adapters"] == [f"style@{v1}*0.8"]
        assert np.abs(first.frames - base.frames).max() > 1e-2
        np.testing.assert_allclose(again.frames, first.frames, atol=1e-3)

        # reload a new version while requests (with and without the adapter) keep coming
        stop, seen, errors = threading.Event(), [], []

        def worker(i: int) -> None:
            with FleetClient(fleet.target, timeout_s=300) as w:
                n = 0
                while not stop.is_set():
                    n += 1
                    try:
                        ad = STYLE if (i + n) % 3 else None
                        v = w.generate(f"load {i} {n}", seed=n, adapters=ad, **KW)
                        seen.append(v.sidecar["adapters"][0]["version"] if ad else "none")
                    except BaseException as e:  # noqa: BLE001 - asserted below
                        errors.append(e)
                        return

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: seen.count(v1) >= 2 or errors, 240, "requests with version 1 under load")
            v2 = c.load_adapter("style", str(v2_file))["version"]
            assert v2 != v1
            wait_until(lambda: seen.count(v2) >= 2 or errors, 240, "requests with version 2 under load")
        finally:
            stop.set()
            for t in threads:
                t.join(300)
        assert not errors, errors

        m1 = _misses(encoder)
        after = c.generate("a cat", seed=1, adapters=STYLE, **KW)
        assert _misses(encoder) == m1 + 1  # the version-1 entry is not served under version 2
        assert after.sidecar["adapters"][0]["version"] == v2
        assert np.abs(after.frames - first.frames).max() > 1e-2

        # unloading an adapter in use waits for its request (never yanks it)
        started, result = threading.Event(), []

        def long_request() -> None:
            with FleetClient(fleet.target, timeout_s=300) as w:
                on = lambda ev: ev.kind == "progress" and started.set()  # noqa: E731
                result.append(w.generate("slow", seed=3, adapters=STYLE, on_event=on,
                                         **{**KW, "num_inference_steps": 8}))

        t = threading.Thread(target=long_request)
        t.start()
        assert started.wait(240)
        with pytest.raises(FailedPrecondition, match="in use by 1 request"):
            c.unload_adapter("style", wait_s=0.0)  # refused, and nothing changed
        removed = c.unload_adapter("style", wait_s=240)
        t.join(300)
        assert len(result) == 1 and result[0].sidecar["adapters"][0]["version"] == v2
        assert v2 in removed
        with pytest.raises(NotFound, match="'style' is not loaded"):
            c.generate("a cat", adapters=STYLE, **KW)

        # reload: the same file is the same version, and gives the same frames
        assert c.load_adapter("style", str(v1_file))["version"] == v1
        back = c.generate("a cat", seed=1, adapters=STYLE, **KW)
        np.testing.assert_allclose(back.frames, first.frames, atol=1e-3)


def test_pool_dedicated_to_a_merged_adapter(tmp_path):
    """A denoiser started with --merge-adapter: Describe reports the merge, the scheduler learns the
    adapter from it, requests naming it (at its scale) run, others are refused."""
    from fleet.launcher import LocalFleet
    from tests.fleet_fixture import running
    cfg = WanDiTConfig.from_dict(resolve_card("wan-tiny").components["transformer"].config)
    path = tmp_path / "style.safetensors"
    save_file(random_lora(cfg, 8, 1), str(path))
    merged = LocalFleet(roles=("encoder", "denoiser", "decoder"), log_dir=tmp_path / "logs",
                        pool_args={"denoiser": ["--merge-adapter", f"style={path}", "--merge-scale", "0.8"]})
    with running(merged) as fl, FleetClient(fl.target, timeout_s=300) as c:
        info = pool_describe(fl.pools["denoiser"][0].target)
        ad = info.adapters
        assert ad.mode == "merged" and ad.merged.id == "style" and ad.merged.scale == 0.8
        assert ad.merged.version in info.weights_digest
        video = c.generate("a cat", seed=1, adapters=STYLE, **KW)
        assert video.sidecar["adapters"][0]["version"] == ad.merged.version
        with pytest.raises(FailedPrecondition, match="merged into its weights"):
            c.generate("a cat", seed=1, adapters=[{"id": "style", "scale": 0.5}], **KW)
        with pytest.raises(FailedPrecondition, match="merged into its weights"):
            c.generate("a cat", seed=1, **KW)
