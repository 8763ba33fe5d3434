"""Parallel denoiser replicas: one request's forward spread over the ranks of one replica.

* :mod:`.plan`      -- :class:`ParallelPlan` (cfg x ring x Ulysses), its rank layout and padding;
* :mod:`.mesh`      -- the process groups of a plan and the collectives it uses;
* :mod:`.attention` -- Ulysses all-to-all and ring attention (online softmax) as the DiT's hook;
* :mod:`.dit`       -- token layout, sharding/gathering, the DiT forward on one rank's shard;
* :mod:`.executor`  -- the denoiser executor of one rank (sharded resident state, snapshots);
* :mod:`.spmd`      -- rank 0 drives the others: every batch is broadcast and run everywhere.
"""
from fastvideo3.parallel.plan import PLAN_KINDS, SINGLE, ParallelPlan

__all__ = ["PLAN_KINDS", "SINGLE", "ParallelPlan"]
