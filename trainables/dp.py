"""DP-SGD for in-context fine-tuning: per-query-row clipping, Gaussian noise, Opacus's accountant.

**The privacy unit is one fine-tuning query row** (a member row: its features and its label). A training
step of :class:`~trainables.finetune.Finetuner` conditions the model on the fixed context C′ and predicts
the member rows as queries; the rows sit on the model's *sequence* axis, not on a batch axis, so Opacus's
``GradSampleModule`` (which reads per-sample gradients off the batch dimension of each layer) does not
see them. Instead each query row is run **alone with C′** (one forward per row, ``torch.func.vmap`` over
the rows of ``functional_call`` + ``grad``): row i then enters exactly one loss term, so its gradient is
its whole contribution to the step, whether or not the model lets query rows attend to each other.
Each row's gradient is clipped to L2 norm ``max_grad_norm`` (over all trainable parameters together), the
clipped gradients are summed, Gaussian noise of standard deviation ``noise_multiplier × max_grad_norm`` is
added to the sum, and the result is divided by a public row count (``Finetuner._public_rows``): the batch's
query rows (its members, plus any exposure canaries' copies, all fixed by the config and the design), or,
with ``one_run`` canaries, the members plus the *expected* number of canaries in (half of them), since the
drawn number would let the update's scale tell how many coins came up "in".

What is *not* protected: the context rows C′ (their influence is not clipped; treat them as public
context), and multi_random runs (their contexts are drawn from the member pool, so the sweep config
refuses DP there).

**Accounting.** Batches are the regime's fixed ones, not sampled: in single_fixed every member row is a
query at every step, in multi_fixed each task's rows at one step per epoch, so a row takes part in one
Gaussian mechanism per epoch with sample rate 1 (no amplification by subsampling is claimed). The noise
multiplier is Opacus's ``get_noise_multiplier`` for (target ε, δ, sample rate 1, ``epochs`` steps), and
the ε spent up to epoch e is Opacus's accountant over e such steps, so every checkpoint has its own ε
(≤ the target; the last checkpoint's is the run's).
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from iclmem.errors import ConfigError
from iclmem.vocab import Neighbours

if TYPE_CHECKING:  # torch is imported where the gradients are computed: the sweep config reads this module
    import torch

__all__ = ["DPAccountant", "DPSettings", "PerRowMode", "noise_multiplier_for", "epsilon_spent",
           "per_row_gradients", "clipped_gradient_sum", "noisy_gradient", "DEFAULT_DP_DELTA"]

DEFAULT_DP_DELTA = 1e-5
# rows per vmap call: at most this many, and at most _GRAD_BUDGET per-row gradient values held at once
# (rows x trainable parameters; 2^27 float32 = 512 MiB); the chunking changes the memory, never the sum
DEFAULT_CHUNK_ROWS = 64
_GRAD_BUDGET = 1 << 27


class DPAccountant(str, Enum):
    """Opacus's accountants: Rényi DP (``rdp``) or privacy random variables (``prv``, tighter)."""

    RDP = "rdp"
    PRV = "prv"

    def __str__(self) -> str:
        return self.value


class PerRowMode(str, Enum):
    """How per-row gradients are computed: ``vmap`` (torch.func, one batched call) or ``loop`` (one
    backward per row; the reference the vmap path is tested against, and the fallback for a model whose
    operators vmap cannot batch)."""

    VMAP = "vmap"
    LOOP = "loop"

    def __str__(self) -> str:
        return self.value


# The largest target ε calibrated: e^ε bounds nothing long before it, and Opacus's σ search (to an absolute ε
# tolerance of 0.01) does not end for ε near 1e50 (1e8 took 2.7 s, 1e6 a millisecond)
MAX_TARGET_EPSILON = 1e6


def _check_epsilon(value: float, name: str) -> float:
    v = float(value)
    if not v > 0 or math.isnan(v) or math.isinf(v):
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    if v > MAX_TARGET_EPSILON:
        raise ConfigError(f"{name} {value!r} is above {MAX_TARGET_EPSILON:g}: a guarantee of e^ε protects nothing "
                          "there, and calibrating its noise would not end; use inf for plain fine-tuning")
    return v


def _check_delta(value: float, name: str) -> float:
    v = float(value)
    if not 0.0 < v < 1.0:
        raise ConfigError(f"{name} must lie in (0, 1), got {value!r}")
    return v


def _accountant(accountant: DPAccountant | str) -> DPAccountant:
    try:
        return DPAccountant(accountant)
    except ValueError:
        raise ConfigError(f"DP accountant must be one of {[a.value for a in DPAccountant]}, got {accountant!r}") from None


# Rényi orders the RDP accountant optimises over: Opacus's defaults (1.1 .. 63) extended up to 4096, since a
# few unsampled Gaussian steps (sample rate 1) reach their optimum beyond 63, where Opacus's range would stop
# at a looser (still valid) ε and warn
RDP_ORDERS: tuple[float, ...] = (*(1 + x / 10.0 for x in range(1, 100)), *map(float, range(12, 64)),
                                 *(2.0 ** (k / 4) for k in range(24, 49)))


def _epsilon_options(accountant: DPAccountant) -> dict[str, Any]:
    return {"alphas": list(RDP_ORDERS)} if accountant is DPAccountant.RDP else {}


def noise_multiplier_for(target_epsilon: float, delta: float, sample_rate: float, steps: int,
                         accountant: DPAccountant | str = DPAccountant.RDP) -> float:
    """Opacus's noise multiplier σ that keeps ``steps`` Gaussian steps at ``sample_rate`` within
    (``target_epsilon``, ``delta``)-DP (Opacus searches σ to ``epsilon_tolerance`` 0.01 and returns the
    σ whose ε is at most the target)."""
    from opacus.accountants.utils import get_noise_multiplier

    eps, d, acc = _check_epsilon(target_epsilon, "target epsilon"), _check_delta(delta, "delta"), _accountant(accountant)
    if steps < 1 or not 0.0 < sample_rate <= 1.0:
        raise ConfigError(f"DP accounting needs steps >= 1 and a sample rate in (0, 1], got {steps}, {sample_rate}")
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        # PRV at sample rate 1 takes log(0) on a masked branch, and bounds its domain with RDP's default orders
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")
        return float(get_noise_multiplier(target_epsilon=eps, target_delta=d, sample_rate=float(sample_rate),
                                          steps=int(steps), accountant=acc.value, **_epsilon_options(acc)))


def epsilon_spent(noise_multiplier: float, sample_rate: float, steps: int, delta: float,
                  accountant: DPAccountant | str = DPAccountant.RDP) -> float:
    """ε of ``steps`` Gaussian steps (noise multiplier σ, sample rate q) at ``delta``, by Opacus's
    accountant; 0 for 0 steps."""
    from opacus.accountants import create_accountant

    if steps == 0:
        return 0.0
    kind = _accountant(accountant)
    acc = create_accountant(mechanism=kind.value)
    acc.history = [(float(noise_multiplier), float(sample_rate), int(steps))]
    with np.errstate(divide="ignore", invalid="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Optimal order is the largest alpha")  # PRV's domain bound
        return float(acc.get_epsilon(delta=_check_delta(delta, "delta"), **_epsilon_options(kind)))


@dataclass(frozen=True)
class DPSettings:
    """One run's DP-SGD: what the noise was calibrated for and the noise itself."""

    target_epsilon: float
    delta: float
    max_grad_norm: float
    noise_multiplier: float
    epochs: int  # epochs the noise was calibrated for (the run's)
    sample_rate: float = 1.0  # share of member rows in a row's steps (fixed batches: 1)
    steps_per_epoch: int = 1  # Gaussian steps a row takes part in per epoch
    accountant: DPAccountant = DPAccountant.RDP

    def __post_init__(self) -> None:
        object.__setattr__(self, "accountant", _accountant(self.accountant))
        _check_epsilon(self.target_epsilon, "dp target epsilon")
        _check_delta(self.delta, "dp delta")
        if not self.max_grad_norm > 0 or not math.isfinite(self.max_grad_norm):
            raise ConfigError(f"dp max_grad_norm must be a finite number > 0, got {self.max_grad_norm!r}")
        if not self.noise_multiplier >= 0 or not math.isfinite(self.noise_multiplier):
            raise ConfigError(f"dp noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}")
        if self.epochs < 1 or self.steps_per_epoch < 1 or not 0.0 < self.sample_rate <= 1.0:
            raise ConfigError(f"dp epochs and steps_per_epoch must be >= 1 and sample_rate in (0, 1], got "
                              f"{self.epochs}, {self.steps_per_epoch}, {self.sample_rate}")

    @classmethod
    def calibrate(cls, target_epsilon: float, delta: float, max_grad_norm: float, epochs: int,
                  accountant: DPAccountant | str = DPAccountant.RDP, sample_rate: float = 1.0,
                  steps_per_epoch: int = 1) -> DPSettings:
        """Settings whose noise keeps ``epochs`` epochs within (``target_epsilon``, ``delta``)."""
        sigma = noise_multiplier_for(target_epsilon, delta, sample_rate, epochs * steps_per_epoch, accountant)
        return cls(target_epsilon=float(target_epsilon), delta=float(delta), max_grad_norm=float(max_grad_norm),
                   noise_multiplier=sigma, epochs=int(epochs), sample_rate=float(sample_rate),
                   steps_per_epoch=int(steps_per_epoch), accountant=_accountant(accountant))

    @classmethod
    def from_value(cls, value: DPSettings | Mapping[str, Any]) -> DPSettings:
        return value if isinstance(value, DPSettings) else cls(**dict(value))

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise added to the sum of clipped row gradients."""
        return self.noise_multiplier * self.max_grad_norm

    def steps_at(self, epoch: int) -> int:
        return int(epoch) * self.steps_per_epoch

    def epsilon_at(self, epoch: int) -> float:
        """The accountant's ε after ``epoch`` epochs (what a checkpoint of that epoch guarantees)."""
        return epsilon_spent(self.noise_multiplier, self.sample_rate, self.steps_at(epoch), self.delta, self.accountant)

    def epsilon_replace_one_at(self, epoch: int) -> float:
        """ε after ``epoch`` epochs for the neighbour relation the membership audit plays: replace one row.

        The accountant's ε is for add/remove-one neighbours. The audit's game swaps which row of a (member,
        non-member) pair is trained on, a replace-one neighbour: the clipped gradient sum then moves by up to
        2 × ``max_grad_norm``, so each step is the same Gaussian mechanism at half the noise multiplier (exact
        with sample rate 1, the fixed batches this module trains with). NaN for a sampled batch (sample rate
        < 1), where this simple argument does not hold and no replace-one bound is claimed."""
        if self.sample_rate != 1.0:
            return math.nan
        return epsilon_spent(self.noise_multiplier / 2.0, 1.0, self.steps_at(epoch), self.delta, self.accountant)

    def mu_at(self, epoch: int, neighbours: Neighbours = Neighbours.ADD_REMOVE) -> float:
        """The mechanism's exact Gaussian-DP μ after ``epoch`` epochs: full-batch steps are Gaussian mechanisms
        of noise multiplier σ, and GDP composes exactly (μ = sqrt(steps) / σ add/remove, twice that for
        replace-one: the clipped sum moves by up to 2 × max_grad_norm). NaN for a sampled batch (sample
        rate < 1), whose trade-off curve is not Gaussian."""
        if self.sample_rate != 1.0:
            return math.nan
        sensitivity = 2.0 if Neighbours(neighbours) is Neighbours.REPLACE_ONE else 1.0
        return gaussian_mechanism_mu(self.noise_multiplier, self.steps_at(epoch), sensitivity)

    def as_dict(self) -> dict[str, Any]:
        return {"target_epsilon": self.target_epsilon, "delta": self.delta, "max_grad_norm": self.max_grad_norm,
                "noise_multiplier": self.noise_multiplier, "epochs": self.epochs, "sample_rate": self.sample_rate,
                "steps_per_epoch": self.steps_per_epoch, "accountant": self.accountant.value}

    def record(self, epoch: int) -> dict[str, Any]:
        """What a checkpoint of ``epoch`` records: the settings, the accounted steps and the ε spent."""
        return {**self.as_dict(), "steps": self.steps_at(epoch), "epsilon": self.epsilon_at(epoch)}


# ------------------------------------------------------------------------------------------- per-row gradients
@functools.cache
def _log_probs_module() -> type:
    from torch import nn

    class _LogProbs(nn.Module):
        """``adapter.log_probs`` as a module's forward, with the adapter's module as a submodule, so that
        ``functional_call`` can swap its parameters for the duration of a call."""

        _adapter: Any  # set in __init__ with object.__setattr__ (an annotation only: no class attribute)

        def __init__(self, adapter: Any) -> None:
            super().__init__()
            self.inner = adapter.module
            object.__setattr__(self, "_adapter", adapter)  # not a submodule: the adapter is no nn.Module

        def forward(self, context_x: torch.Tensor, context_y: torch.Tensor, query_x: torch.Tensor,
                    n_classes: int) -> torch.Tensor:
            log_probs: torch.Tensor = self._adapter.log_probs(context_x, context_y, query_x, n_classes)
            return log_probs

    return _LogProbs


def _trainable(adapter: Any) -> list[tuple[str, Any]]:
    return [(name, p) for name, p in adapter.module.named_parameters() if p.requires_grad]


def _row_loss_fn(wrapper: Any, batch: Any) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    import torch.nn.functional as F
    from torch.func import functional_call

    def row_loss(params: dict[str, torch.Tensor], qx: torch.Tensor,
                 qy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # one query row [F] with the whole context: the row's loss depends on no other query row
        lp = functional_call(wrapper, params, (batch.context_x, batch.context_y, qx[None, None], batch.n_classes))
        loss = F.nll_loss(lp.reshape(1, batch.n_classes), qy.reshape(1))
        return loss, loss.detach()

    return row_loss


def per_row_gradients(adapter: Any, batch: Any, rows: slice | None = None,
                      mode: PerRowMode | str = PerRowMode.VMAP) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Gradients of each query row's own loss (the row alone with the context): one tensor
    ``[rows, *param.shape]`` per trainable parameter (in ``named_parameters`` order), and the rows' losses
    ``[rows]``. ``batch``: a :class:`~trainables.finetune.Batch` with one context (B = 1)."""
    if batch.query_x.shape[0] != 1:
        raise ConfigError(f"per-row gradients take one context per batch, got {batch.query_x.shape[0]}")
    import torch

    rows = rows or slice(0, batch.query_x.shape[1])
    qx, qy = batch.query_x[0, rows], batch.query_y[0, rows]
    named = _trainable(adapter)
    wrapper = _log_probs_module()(adapter)
    row_loss = _row_loss_fn(wrapper, batch)
    if PerRowMode(mode) is PerRowMode.VMAP:
        from torch.func import grad, vmap

        params = {f"inner.{name}": p.detach() for name, p in named}
        with warnings.catch_warnings():
            # operators without a batching rule (e.g. CPU flash attention) fall back to a per-row loop inside
            # vmap; the result is the same, and the notice would repeat at every step
            warnings.filterwarnings("ignore", message="There is a performance drop because we have not yet implemented")
            grads, losses = vmap(grad(row_loss, has_aux=True), in_dims=(None, 0, 0),
                                 randomness="different")(params, qx, qy)
        return [grads[f"inner.{name}"] for name, _ in named], losses
    per_param: list[list[torch.Tensor]] = [[] for _ in named]
    losses_list = []
    for i in range(qx.shape[0]):
        live = {f"inner.{name}": p for name, p in named}
        loss, _ = row_loss(live, qx[i], qy[i])
        gs = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for j, ((_, p), g) in enumerate(zip(named, gs)):
            per_param[j].append(torch.zeros_like(p) if g is None else g.detach())
        losses_list.append(loss.detach())
    return [torch.stack(gs) for gs in per_param], torch.stack(losses_list)


def clipped_gradient_sum(adapter: Any, batch: Any, max_grad_norm: float, mode: PerRowMode | str = PerRowMode.VMAP,
                         chunk_rows: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """Σ_i clip(g_i) over the batch's query rows, clip(g) = g · min(1, C / ‖g‖) with ‖·‖ the L2 norm over
    every trainable parameter at once. Returns the sums (one per trainable parameter), the rows' losses and
    the rows' unclipped gradient norms. Rows are processed ``chunk_rows`` at a time (memory only)."""
    import torch
    named = _trainable(adapter)
    if chunk_rows is None:
        n_params = sum(p.numel() for _, p in named)
        chunk_rows = max(1, min(DEFAULT_CHUNK_ROWS, _GRAD_BUDGET // max(n_params, 1)))
    sums = [torch.zeros_like(p) for _, p in named]
    losses, norms = [], []
    m = batch.query_x.shape[1]
    for lo in range(0, m, chunk_rows):
        grads, loss = per_row_gradients(adapter, batch, slice(lo, min(m, lo + chunk_rows)), mode)
        norm = torch.sqrt(cast(torch.Tensor, sum(g.reshape(g.shape[0], -1).pow(2).sum(1) for g in grads)))
        # the 1e-6 keeps a zero gradient at factor 1 instead of 0/0; a row's clipped norm stays <= C
        factor = torch.clamp(max_grad_norm / (norm + 1e-6), max=1.0)
        for s, g in zip(sums, grads):
            s.add_(torch.einsum("i,i...->...", factor, g))
        losses.append(loss)
        norms.append(norm)
    return sums, torch.cat(losses), torch.cat(norms)


def noisy_gradient(sums: list[torch.Tensor], noise_std: float, n_rows: int,
                   generator: torch.Generator) -> list[torch.Tensor]:
    """(Σ clipped + N(0, noise_std²)) / n_rows per parameter, ``n_rows`` a count that does not depend on which
    rows are in (module docstring). The noise is drawn on the CPU from
    ``generator`` (saved with the checkpoint) and moved to the gradients' device, so a run's noise is the
    same on any device and a resumed run draws what it would have drawn."""
    import torch
    out = []
    for s in sums:
        noise = torch.normal(0.0, float(noise_std), size=tuple(s.shape), generator=generator, dtype=torch.float32)
        out.append((s + noise.to(device=s.device, dtype=s.dtype)) / float(n_rows))
    return out


def vmap_unsupported(exc: BaseException) -> bool:
    """An error that says vmap cannot batch one of the model's operators (then the loop is used)."""
    text = str(exc)
    return isinstance(exc, (RuntimeError, NotImplementedError)) and ("vmap" in text or "functorch" in text
                                                                      or "Batching rule" in text)


def warn_loop_fallback(model: str, exc: BaseException) -> None:
    warnings.warn(f"DP-SGD: torch.func.vmap cannot batch model {model!r} ({exc}); per-row gradients are computed "
                  "one row at a time instead (same result, slower)", RuntimeWarning, stacklevel=3)


def gaussian_mechanism_mu(noise_multiplier: float, steps: int, sensitivity: float = 1.0) -> float:
    """μ of ``steps`` full-batch Gaussian mechanisms with noise ``noise_multiplier`` × clip norm and a
    neighbour that moves the clipped sum by ``sensitivity`` × clip norm: sqrt(steps) · sensitivity / σ
    (GDP composes exactly: the μ of a composition is the root of the sum of squares). Sensitivity 1 is
    add/remove one row, 2 is replace one row."""
    if not noise_multiplier > 0:
        return math.inf
    return math.sqrt(max(int(steps), 0)) * float(sensitivity) / float(noise_multiplier)
