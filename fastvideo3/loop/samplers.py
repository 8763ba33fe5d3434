"""Flow-matching samplers: schedules (pure numbers, kept in LoopState) and step updates.

A sampler's per-request history (previous model outputs, last sample) is tensor data: it lives
in the denoiser pool as a resident region next to the latent, in a :class:`SamplerHistory`, and
is snapshot/restored with it. The arithmetic mirrors the reference schedulers operation for
operation (fp32 sigmas, the same order of operations), so results match them closely.

- ``unipc``: UniPC multistep (B(h)=expm1 variant, x0 prediction, flow sigmas, lower order at
  the end), predictor + corrector.
- ``euler``: flow-matching Euler.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from fastvideo3.vocab import Sampler


@dataclass(frozen=True)
class Schedule:
    timesteps: list[float]  # passed to the DiT, one per step
    sigmas: list[float]  # len(timesteps) + 1, the last is the terminal sigma (0)


def make_schedule(sampler: str, steps: int, flow_shift: float, num_train_timesteps: int = 1000, *,
                  sigma_spacing: str = "scheduler") -> Schedule:
    n = num_train_timesteps
    if sigma_spacing == "linear":  # the pipeline passes these sigmas; the scheduler shifts them
        if sampler != Sampler.EULER:
            raise ValueError(f"sigma_spacing 'linear' is implemented for the {Sampler.EULER} sampler, not {sampler!r}")
        sig = np.linspace(1.0, 0.0, steps + 1)[:-1].astype(np.float32)
        sig = flow_shift * sig / (1 + (flow_shift - 1) * sig)
        sig32 = torch.from_numpy(sig).to(torch.float32)
        sigmas = torch.cat([sig32, torch.zeros(1)])
        return Schedule([float(t) for t in (sig32 * n).tolist()], [float(s) for s in sigmas.tolist()])
    if sigma_spacing != "scheduler":
        raise ValueError(f"unknown sigma spacing {sigma_spacing!r}")
    if sampler == Sampler.UNIPC:
        sig = np.linspace(1, 1 / n, steps + 1)[:-1]
        sig = flow_shift * sig / (1 + (flow_shift - 1) * sig)
        if abs(sig[0] - 1) < 1e-6:
            sig[0] -= 1e-6
        ts = (sig * n).copy().astype(np.int64)  # the reference truncates to integer timesteps
        sigmas = np.concatenate([sig, [0.0]]).astype(np.float32)
        return Schedule([float(t) for t in ts], [float(s) for s in sigmas])
    if sampler == Sampler.EULER:
        s_min = flow_shift * (1 / n) / (1 + (flow_shift - 1) * (1 / n))
        ts = np.linspace(1.0 * n, s_min * n, steps)
        sig = ts / n
        sig = flow_shift * sig / (1 + (flow_shift - 1) * sig)
        sig32 = torch.from_numpy(sig).to(torch.float32)
        t32 = sig32 * n
        sigmas = torch.cat([sig32, torch.zeros(1)])
        return Schedule([float(t) for t in t32.tolist()], [float(s) for s in sigmas.tolist()])
    raise ValueError(f"unknown sampler {sampler!r}")


@dataclass
class SamplerHistory:
    """Resident per-request sampler state (tensor data). ``order`` is the solver order."""

    order: int = 2
    model_outputs: list[torch.Tensor | None] = field(default_factory=list)
    last_sample: torch.Tensor | None = None
    lower_order_nums: int = 0
    this_order: int = 1

    def __post_init__(self):
        if not self.model_outputs:
            self.model_outputs = [None] * self.order

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {f"model_output.{i}": t for i, t in enumerate(self.model_outputs) if t is not None}
        if self.last_sample is not None:
            out["last_sample"] = self.last_sample
        return out

    def meta(self) -> dict:
        return {"order": self.order, "lower_order_nums": self.lower_order_nums, "this_order": self.this_order,
                "present": [t is not None for t in self.model_outputs], "has_last": self.last_sample is not None}

    @classmethod
    def rebuild(cls, meta: dict, tensors: dict[str, torch.Tensor]) -> "SamplerHistory":
        h = cls(order=meta["order"])
        h.model_outputs = [tensors.get(f"model_output.{i}") if p else None for i, p in enumerate(meta["present"])]
        h.last_sample = tensors.get("last_sample") if meta["has_last"] else None
        h.lower_order_nums, h.this_order = meta["lower_order_nums"], meta["this_order"]
        return h


def _lam(s: torch.Tensor) -> torch.Tensor:
    alpha, sigma = 1 - s, s
    return torch.log(alpha) - torch.log(sigma)


def _coeffs(order: int, hh: torch.Tensor):
    h_phi_1 = torch.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1
    b_h = torch.expm1(hh)
    fact = 1
    b = []
    for i in range(1, order + 1):
        b.append(h_phi_k * fact / b_h)
        fact *= i + 1
        h_phi_k = h_phi_k / hh - 1 / fact
    return h_phi_1, b_h, b


def unipc_step(hist: SamplerHistory, model_output: torch.Tensor, sample: torch.Tensor, step: int,
               sigmas: list[float]) -> torch.Tensor:
    """One UniPC multistep update (corrector on the previous step, then predictor). Mutates ``hist``."""
    sig = torch.tensor(sigmas, dtype=torch.float32)
    num_steps = len(sigmas) - 1
    x0 = sample - sig[step] * model_output
    if step > 0 and hist.last_sample is not None:
        sample = _unipc_correct(hist, x0, sample, step, sig)
    for i in range(hist.order - 1):
        hist.model_outputs[i] = hist.model_outputs[i + 1]
    hist.model_outputs[-1] = x0
    this_order = min(hist.order, num_steps - step)  # lower order at the final steps
    hist.this_order = min(this_order, hist.lower_order_nums + 1)
    hist.last_sample = sample
    prev = _unipc_predict(hist, sample, step, sig)
    if hist.lower_order_nums < hist.order:
        hist.lower_order_nums += 1
    return prev


def _unipc_terms(hist: SamplerHistory, sig: torch.Tensor, at: int):
    """The terms predictor and corrector share, for the step from ``sig[at - 1]`` to ``sig[at]``:
    the last model output, the two sigmas, ``alpha_t``, the ratios ``r_k`` (and their stack with a
    final 1), the scaled output differences ``D1_k`` and the B(h) coefficients."""
    order = hist.this_order
    m0 = hist.model_outputs[-1]
    s_t, s_0 = sig[at], sig[at - 1]
    alpha_t = 1 - s_t
    lam_t, lam_0 = _lam(s_t), _lam(s_0)
    h = lam_t - lam_0
    rks, d1s = [], []
    for i in range(1, order):
        mi = hist.model_outputs[-(i + 1)]
        rk = (_lam(sig[at - 1 - i]) - lam_0) / h
        rks.append(rk)
        d1s.append((mi - m0) / rk)
    rks.append(torch.ones(()))
    rks_t = torch.stack(rks)
    h_phi_1, b_h, b = _coeffs(order, -h)
    return order, m0, s_t, s_0, alpha_t, rks_t, d1s, h_phi_1, b_h, b


def _unipc_predict(hist: SamplerHistory, x: torch.Tensor, step: int, sig: torch.Tensor) -> torch.Tensor:
    order, m0, s_t, s_0, alpha_t, rks_t, d1s, h_phi_1, b_h, b = _unipc_terms(hist, sig, step + 1)
    x_t_ = s_t / s_0 * x - alpha_t * h_phi_1 * m0
    if d1s:
        if order == 2:
            rhos = torch.ones(1, dtype=x.dtype, device=x.device) * 0.5
        else:
            r = torch.stack([torch.pow(rks_t, i - 1) for i in range(1, order + 1)])
            rhos = torch.linalg.solve(r[:-1, :-1], torch.stack(b)[:-1]).to(x.device, x.dtype)
        res = torch.einsum("k,bkc...->bc...", rhos, torch.stack(d1s, dim=1))
        return (x_t_ - alpha_t * b_h * res).to(x.dtype)
    return x_t_.to(x.dtype)


def _unipc_correct(hist: SamplerHistory, model_t: torch.Tensor, x_t: torch.Tensor, step: int,
                   sig: torch.Tensor) -> torch.Tensor:
    x = hist.last_sample
    order, m0, s_t, s_0, alpha_t, rks_t, d1s, h_phi_1, b_h, b = _unipc_terms(hist, sig, step)
    if order == 1:
        rhos = torch.ones(1, dtype=x.dtype, device=x.device) * 0.5
    else:
        r = torch.stack([torch.pow(rks_t, i - 1) for i in range(1, order + 1)])
        rhos = torch.linalg.solve(r, torch.stack(b)).to(x.device, x.dtype)
    x_t_ = s_t / s_0 * x - alpha_t * h_phi_1 * m0
    corr = torch.einsum("k,bkc...->bc...", rhos[:-1], torch.stack(d1s, dim=1)) if d1s else 0
    return (x_t_ - alpha_t * b_h * (corr + rhos[-1] * (model_t - m0))).to(x.dtype)


def euler_step(model_output: torch.Tensor, sample: torch.Tensor, step: int, sigmas: list[float]) -> torch.Tensor:
    sig = torch.tensor(sigmas, dtype=torch.float32)
    return (sample.to(torch.float32) + (sig[step + 1] - sig[step]) * model_output).to(model_output.dtype)


def sampler_step(name: str, hist: SamplerHistory, model_output, sample, step: int, sigmas: list[float]):
    if name == Sampler.UNIPC:
        return unipc_step(hist, model_output, sample, step, sigmas)
    if name == Sampler.EULER:
        return euler_step(model_output, sample, step, sigmas)
    raise ValueError(f"unknown sampler {name!r}")
