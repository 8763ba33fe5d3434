"""The encoder pool's prompt cache: a repeated prompt skips the text encoder.

An entry holds the embeddings of one encoder call's ordered texts (e.g. ``[prompt, negative]``),
not of each text alone: a row's numbers can depend on its batch-mates (kernel blocking), so
caching per text could change outputs in the last bits. Keyed by :class:`CacheKey` over the
card, weights and tokenizer digests, precision, device, padded length, the texts' content hash
and the contract version.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from fastvideo3.cache.feature import FeatureCache
from fastvideo3.cache.key import CacheKey, input_hash

TEXT_CONTRACT = "text_encode/1"  # prompt cleaning + zero padding as in TextEncoder.encode


def _tokenizer_version(executor) -> str:
    card = executor.card
    comp = card.components.get("tokenizer")
    if comp is None or not card.checkpoint.root:
        return "builtin:" + type(executor.encoder.tokenizer).__name__
    folder = Path(card.checkpoint.root) / (comp.subfolder or "tokenizer")
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return "sha256:" + h.hexdigest()[:32]


class TextFeatureCache:
    """Adapter the EncoderExecutor calls: ``encode(executor, texts, request_id) -> [B, L, D]``."""

    def __init__(self, cache: FeatureCache | None = None, max_bytes: int = 256 << 20):
        self.cache = cache if cache is not None else FeatureCache(max_bytes)
        self._tokenizer: dict[int, str] = {}

    def key(self, executor, texts: list[str], adapter_versions: tuple[str, ...] = ()) -> CacheKey:
        tok = self._tokenizer.get(id(executor))
        if tok is None:
            tok = self._tokenizer[id(executor)] = _tokenizer_version(executor)
        return CacheKey(
            model_id=executor.card.model_id, component_id="text_encoder",
            weights_version=executor.encoder.digest, precision=executor.precision,
            device=str(executor.device).split(":")[0], max_len=executor.encoder.max_len,
            shape_sig=f"texts={len(texts)}", input_hash=input_hash(list(texts)),
            tokenizer_version=tok, adapter_versions=tuple(adapter_versions), contract_version=TEXT_CONTRACT,
        )

    def encode(self, executor, texts: list[str], request_id: str, adapter_versions: tuple[str, ...] = ()):
        key = self.key(executor, texts, adapter_versions)
        hit = self.cache.lookup(key, request_id)
        if hit is not None:
            return hit
        return self.cache.insert(key, executor.encoder.encode(texts), request_id)

    def release(self, request_id: str) -> int:
        return self.cache.release(request_id)

    def stats(self) -> dict[str, float]:
        return self.cache.stats()
