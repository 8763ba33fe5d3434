"""pool: the executors role pools run, their resident request state and LoRA adapters (see fastvideo3/runtime/__init__.py)."""
