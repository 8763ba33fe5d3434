"""The request runtime, by plane.

- :mod:`~fastvideo3.runtime.scheduling`: the pure planner (what runs next, under the budget), the
  dispatcher (threads, replica slots, in-flight batches), the CoreScheduler that wires them, the
  WorkUnit and the Executor protocol pools implement.
- :mod:`~fastvideo3.runtime.pool`: the executors a role pool runs (text/image encoder, DiT
  denoiser, VAE, reward), their resident request state and LoRA adapters.
- :mod:`~fastvideo3.runtime.economy`: the cost model (GPU-seconds per unit), pricing and admission.
- :mod:`~fastvideo3.runtime.durability`: request checkpoints to the state store, and resume.

The embedded Engine that runs all of it in one process is :mod:`fastvideo3.engine`. (Model
weights checkpoints are the model families' business: ``models/<family>/checkpoint.py``.)
"""
