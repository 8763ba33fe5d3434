"""durability: request checkpoints to the state store, and resume (see fastvideo3/runtime/__init__.py)."""
