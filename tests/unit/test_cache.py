"""CacheKey sensitivity (every field splits entries), FeatureCache refcounts and LRU eviction,
and the encoder's prompt cache (a repeated prompt skips the encoder and returns the same tensor)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from fastvideo3.cache import CacheKey, FeatureCache, TextFeatureCache, input_hash

pytestmark = pytest.mark.timeout(60)

BASE = CacheKey(model_id="wan-tiny", component_id="text_encoder", weights_version="sha:a", precision="fp32",
                device="cpu", max_len=64, shape_sig="texts=2", input_hash=input_hash(["a", ""]),
                tokenizer_version="builtin:ByteTokenizer", adapter_versions=(), contract_version="text_encode/1")
CHANGED = {"model_id": "wan2.1-t2v-1.3b", "component_id": "vae", "weights_version": "sha:b", "precision": "bf16",
           "device": "cuda", "max_len": 512, "shape_sig": "texts=1", "input_hash": input_hash(["b", ""]),
           "tokenizer_version": "sha256:other", "adapter_versions": ("lora:1",), "contract_version": "text_encode/2",
           "interceptors": "policy=dbcache,threshold=0.08", "image_digest": "sha256:" + "ab" * 32}


def test_every_field_of_the_key_is_covered_by_this_test():
    assert {f.name for f in dataclasses.fields(CacheKey)} == set(CHANGED)


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_a_change_in_any_key_field_misses(field):
    cache = FeatureCache(1 << 20)
    cache.insert(BASE, torch.ones(4), "r1")
    other = dataclasses.replace(BASE, **{field: CHANGED[field]})
    assert other.digest() != BASE.digest()
    assert cache.lookup(other, "r2") is None
    assert cache.lookup(BASE, "r2") is not None
    assert cache.stats()["misses"] == 1 and cache.stats()["hits"] == 1


def test_equal_keys_share_one_entry_and_input_order_matters():
    assert dataclasses.replace(BASE).digest() == BASE.digest()
    assert input_hash(["a", "b"]) != input_hash(["b", "a"])


def _key(i: int) -> CacheKey:
    return dataclasses.replace(BASE, input_hash=input_hash([str(i)]))


def test_lru_eviction_under_the_byte_budget_spares_referenced_entries():
    cache = FeatureCache(max_bytes=3 * 16)  # three float32[4] entries
    for i in range(3):
        cache.insert(_key(i), torch.full((4,), float(i)), f"r{i}")
    cache.release("r0")
    cache.release("r2")
    assert cache.lookup(_key(0), "r9") is not None  # 0 is now most recent; 2 is the LRU unreferenced one
    cache.release("r9")
    cache.insert(_key(3), torch.zeros(4), "r3")
    assert _key(2) not in cache and _key(1) in cache  # 1 is still held by r1
    assert cache.stats()["evictions"] == 1 and cache.stats()["bytes"] <= 3 * 16


def test_referenced_entries_are_never_evicted_and_release_frees_them():
    cache = FeatureCache(max_bytes=16)
    cache.insert(_key(0), torch.zeros(4), "a")
    cache.insert(_key(1), torch.zeros(4), "b")  # over budget: both referenced
    assert _key(0) in cache and _key(1) in cache and cache.stats()["over_budget"] >= 1
    assert cache.refcount(_key(0)) == 1
    assert cache.lookup(_key(0), "c") is not None and cache.refcount(_key(0)) == 2
    assert cache.release("a") == 1 and cache.release("a") == 0  # idempotent
    cache.release("c")
    assert _key(0) not in cache and _key(1) in cache  # evicted once unreferenced
    cache.release("b")
    assert cache.stats()["referenced_entries"] == 0 and cache.stats()["holders"] == 0


def test_zero_budget_stores_nothing():
    cache = FeatureCache(0)
    v = torch.ones(2)
    assert cache.insert(BASE, v, "r") is v and BASE not in cache


class _FakeEncoder:
    digest, max_len = "seeded:x", 8

    def __init__(self):
        self.calls = 0
        self.tokenizer = object()

    def encode(self, texts):
        self.calls += 1
        return torch.stack([torch.full((self.max_len, 4), float(len(t))) for t in texts])


class _FakeExecutor:
    def __init__(self, precision="fp32"):
        from fastvideo3.card import get_card
        self.card, self.precision, self.device = get_card("wan-tiny"), precision, "cpu"
        self.encoder = _FakeEncoder()


def test_text_cache_skips_the_encoder_for_a_repeated_prompt_and_keys_on_precision():
    cache = TextFeatureCache(max_bytes=1 << 20)
    ex = _FakeExecutor()
    a = cache.encode(ex, ["a cat", ""], "r1")
    b = cache.encode(ex, ["a cat", ""], "r2")
    assert b is a and ex.encoder.calls == 1 and cache.stats()["hits"] == 1
    cache.encode(ex, ["", "a cat"], "r3")  # other order: other key
    other = _FakeExecutor(precision="bf16")
    other.encoder = ex.encoder
    cache.encode(other, ["a cat", ""], "r4")  # other precision: other key
    assert ex.encoder.calls == 3
    for r in ("r1", "r2", "r3", "r4"):
        cache.release(r)
    assert cache.stats()["referenced_entries"] == 0
