"""The flow-matching objective, on the serving model and the serving schedule.

    x_sigma = (1 - sigma) * x0 + sigma * eps          target = eps - x0      (Wan's flow prediction)

The DiT is called exactly as the denoiser pool calls it: ``dit(latents, timestep, text)`` with
``timestep = sigma * num_train_timesteps`` taken from :func:`fastvideo3.loop.samplers.make_schedule`.
Training sigmas are drawn from that schedule's dense grid (``steps = num_train_timesteps``), the
same flow-shift family the sampler walks at serve time, so every serve-time timestep is a
training timestep.
"""
from __future__ import annotations

import torch

from fastvideo3.loop.samplers import make_schedule
from fastvideo3.vocab import Sampler


class SigmaSampler:
    """Draws (sigma, timestep) pairs from the serve-time schedule family.

    ``grid="dense"`` samples the unipc schedule at ``num_train_timesteps`` steps (all shifted
    sigmas); ``grid=(sampler, steps)`` samples only the sigmas a fixed serve schedule visits (a
    distilled student's own steps)."""

    def __init__(self, flow_shift: float, grid: str | tuple[str, int] = "dense", num_train_timesteps: int = 1000,
                 device: str | torch.device = "cpu"):
        sampler, steps = (Sampler.UNIPC, num_train_timesteps) if grid == "dense" else grid
        sched = make_schedule(sampler, steps, flow_shift, num_train_timesteps)
        self.sigmas = torch.tensor(sched.sigmas[:-1], dtype=torch.float32, device=device)
        self.timesteps = torch.tensor(sched.timesteps, dtype=torch.float32, device=device)

    def __call__(self, n: int, generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.sigmas), (n,), generator=generator, device=self.sigmas.device)
        return self.sigmas[idx], self.timesteps[idx]


def noised(x0: torch.Tensor, eps: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    s = sigma.view(-1, *([1] * (x0.ndim - 1)))
    return (1.0 - s) * x0 + s * eps


def flow_matching_loss(dit, x0: torch.Tensor, text: torch.Tensor, sigma: torch.Tensor, timestep: torch.Tensor,
                       eps: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor:
    """Mean squared error of the DiT's flow prediction against ``eps - x0``.

    ``weight`` (broadcastable to the latents) re-weights positions; each element's optimum is
    still E[eps - x0 | x_sigma, text], so weighting changes where the model learns first, not
    what it converges to."""
    pred = dit(noised(x0, eps, sigma), timestep, text)
    err = (pred.float() - (eps - x0).float()).square()
    if weight is None:
        return err.mean()
    w = weight.float().expand_as(err)
    return (err * w).sum() / w.sum()
