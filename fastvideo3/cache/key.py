"""CacheKey: every field that can change a cached output, and nothing else.

Two lookups share an entry only when all fields are equal. Adding a field that can change an
output is always safe (it only splits entries); leaving one out is a correctness bug, which is
why the key is a frozen dataclass with no defaults for the identity fields.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

#: bump when the meaning of a cached value changes (e.g. how prompts are cleaned or padded)
CONTRACT_VERSION = "1"


def input_hash(value) -> str:
    """Content hash of a JSON-serializable input (texts, ids, numbers) — order preserving."""
    blob = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class CacheKey:
    model_id: str            # the card
    component_id: str        # which component produced the value ("text_encoder")
    weights_version: str     # digest of the component's weights
    precision: str           # compute precision ("fp32", "bf16")
    device: str              # device kind ("cpu", "cuda"): kernels differ numerically
    max_len: int             # padded length (text tokens) the value was computed at
    shape_sig: str           # batch / shape signature the value was computed under
    input_hash: str          # content hash of the inputs (see :func:`input_hash`)
    tokenizer_version: str = ""              # digest of tokenizer files, when separate from weights
    adapter_versions: tuple[str, ...] = ()   # LoRA / adapter digests applied, in order
    #: interceptor settings that change outputs (fastvideo3.extend.settings.settings_key), "none"
    interceptors: str = "none"
    #: the digest of the request's image (image-to-video), "" for none
    image_digest: str = ""
    contract_version: str = CONTRACT_VERSION

    def digest(self) -> str:
        """A stable text digest over every field (the cache's content address)."""
        blob = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode("utf-8")).hexdigest()
