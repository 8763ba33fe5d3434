"""Caches that are correct by key.

:class:`CacheKey` names every field that can change a cached output (model, component, weights
digest, adapters, precision, device, length / shape signature, input hash, contract version);
:class:`FeatureCache` is a content-addressed, reference-counted LRU under a byte budget;
:class:`TextFeatureCache` plugs it into the encoder executor so a repeated prompt skips the
text encoder.
"""
from fastvideo3.cache.feature import FeatureCache
from fastvideo3.cache.key import CONTRACT_VERSION, CacheKey, input_hash
from fastvideo3.cache.text import TextFeatureCache

__all__ = ["CONTRACT_VERSION", "CacheKey", "FeatureCache", "TextFeatureCache", "input_hash"]
