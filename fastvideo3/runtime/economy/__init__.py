"""economy: the cost model, pricing and admission (see fastvideo3/runtime/__init__.py)."""
