"""The denoiser executor's adapter verbs: load, unload and merge a LoRA adapter while serving
(:class:`AdapterVerbs`, a part of :class:`~fastvideo3.runtime.pool.dit_executor.DenoiserExecutor`;
the store that applies them is :mod:`fastvideo3.runtime.pool.adapters`)."""
from __future__ import annotations

from fastvideo3.errors import FailedPrecondition, InvalidRequest
from fastvideo3.request.schema import ID_CHARS
from fastvideo3.runtime.pool.dit_graphs import GRAPH_OFF


class AdapterVerbs:
    """The adapter verbs of the denoiser executor (a mixin: the executor holds the store, the DiT
    and the runtime export)."""

    def _read_adapter(self, adapter_id: str, path: str | None, tensors: dict | None):
        from fastvideo3.models.wan.lora import load_lora_file, parse_lora
        if not isinstance(adapter_id, str) or not 1 <= len(adapter_id) <= 128 or not set(adapter_id) <= ID_CHARS:
            raise InvalidRequest("must be 1-128 characters of [A-Za-z0-9-_.:]", field="adapter_id",
                                 limit="1..128 chars")
        if type(self._forward).__name__ == "Fp8FastWanDiT":
            raise FailedPrecondition("the FP8 fast path takes no LoRA adapters", field="adapter_id")
        if len(getattr(self, "experts", ())) > 1:  # the delta hooks sit on one expert's layers
            raise FailedPrecondition("a two-expert pool takes no LoRA adapters yet", field="adapter_id")
        if getattr(self, "mesh", None) is not None:  # every rank would need it, loaded in step
            raise FailedPrecondition("a multi-rank (parallel) replica takes no LoRA adapters yet", field="adapter_id")
        if getattr(self, "adapters", None) is not None and not self.adapters.shapes:  # the DiT adapts no layers
            raise FailedPrecondition(f"card {self.card.model_id}'s DiT takes no LoRA adapters", field="adapter_id")
        if tensors is not None:
            return parse_lora(tensors, self.dit.cfg, adapter_id, self.adapters.max_rank)
        if not path:
            raise InvalidRequest("an adapter needs a file", field="adapter_path")
        return load_lora_file(path, self.dit.cfg, adapter_id, self.adapters.max_rank)

    def load_adapter(self, adapter_id: str, path: str | None = None, tensors: dict | None = None) -> dict:
        """Load (or reload) an adapter while serving; returns its id, version, rank and bytes. Reading
        and checking the file happens outside the step lock; only the registration takes it."""
        adapter = self._read_adapter(adapter_id, path, tensors)
        return self.adapters.load(adapter, source=str(path or "memory"))

    def unload_adapter(self, adapter_id: str, wait_s: float = 0.0) -> list[str]:
        """Remove every version of an adapter, waiting up to ``wait_s`` for requests using it."""
        return self.adapters.unload(adapter_id, wait_s)

    def merge_adapter(self, adapter_id: str, scale: float, path: str | None = None,
                      tensors: dict | None = None) -> dict:
        """Dedicate this pool to one adapter merged into its weights (no per-row delta). Start-up
        only: refused once adapters are loaded or requests are resident."""
        from fastvideo3.models.wan.lora import merge_into_
        from fastvideo3.runtime.pool.adapters import _Entry
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not -8.0 <= float(scale) <= 8.0:
            raise InvalidRequest(f"{scale!r}", field="scale", limit="[-8, 8]")
        adapter = self._read_adapter(adapter_id, path, tensors)
        with self._lock:
            if self.regions or self.adapters.entries or self.adapters.merged:
                raise FailedPrecondition("merge an adapter before any other adapter or request", field="merge_adapter")
            merge_into_(self.dit, adapter, float(scale))
            store = self.adapters
            store.entries[(adapter_id, adapter.version)] = _Entry(adapter, str(path or "memory"))
            store.current[adapter_id] = adapter.version
            store.merged = (adapter_id, adapter.version, float(scale))
            # what ran is now other weights: the digest, and with it the runtime identity, says so
            self.weights_digest = f"{self.base_weights_digest}+lora:{adapter_id}@{adapter.version}*{float(scale):g}"
            self.runtime.release()
            from fastvideo3.models.wan.runtime_export import card_buckets
            # graphs captured before hold no merged weights' identity: the warm phase captures anew
            self.runtime, self._prepared, self.graph_buckets = self._build_runtime(card_buckets(self.card)), {}, []
            self.graph_capture = GRAPH_OFF
        return {"id": adapter_id, "version": adapter.version, "scale": float(scale), "mode": "merged"}
