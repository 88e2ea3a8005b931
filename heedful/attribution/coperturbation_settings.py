"""Co-perturbation's settings and fit result: the option choices, the optimisation
:class:`Settings` (Guan et al. 2019's as :data:`GUAN2019`), the runner's activation budget and
the :class:`InterestFit` both solvers return (:mod:`heedful.attribution.coperturbation` for the
Adam solver and the method, :mod:`heedful.attribution.coperturbation_linearized` for the closed
form)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from heedful.attribution.noise import GUAN_SCALE_FACTOR, OUTPUTS, SCALE_BASES, SPACES, check_choice
from heedful.errors import InputError

Score = Literal["rho", "log_rho"]
Keep = Literal["best", "last", "average"]
Init = Literal["randn", "zeros", "linearized"]
Objective = Literal["normalised", "paper"]
Solver = Literal["adam", "linearized"]
Schedule = Literal["constant", "cosine"]
SCORES: tuple[str, ...] = Score.__args__
KEEP: tuple[str, ...] = Keep.__args__
INITS: tuple[str, ...] = Init.__args__
OBJECTIVES: tuple[str, ...] = Objective.__args__
SOLVERS: tuple[str, ...] = Solver.__args__
SCHEDULES: tuple[str, ...] = Schedule.__args__
INIT_CLIP = 4.0
"""``init="linearized"``: the largest ``|theta|`` of the warm start (``sigmoid(4) = 0.982``, so
the closed-form noise keeps its shape over a factor ``e^4`` either side of the cold start's
level and is clipped beyond)."""


ACTIVATION_BUDGET = 512 * 2**20
"""Bytes one noised forward+backward chunk may take (estimated by :mod:`heedful.engine.memory`; the
adapter's ``max_memory`` when that is smaller): on a CPU the cost per position is flat from a
few hundred positions on, so bigger chunks would only cost memory."""
GRAD_CHUNK_OVERHEAD = 64
"""What one more forward+backward chunk costs, in noised token positions, when problems are cut
into chunks (measured on MiniLM, one thread: ~20 ms of per-call work against ~0.7 ms per
noised position, i.e. ~30 positions; 64 leaves room for the lower efficiency of small chunks).

Problems are chunked by the runner with padding costed per noised copy (``samples`` per
problem): costing it per problem, sizing every chunk by the batch's longest problem and charging
a forward pass's overhead at 256 cells padded 32 movie sentences (8..53 tokens) to 1.34x their
real positions -- a third more arithmetic than running them one at a time; now 1.08x."""
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class Settings:
    """Optimisation settings (see the module docstring for the source of each default).

    ``tol`` <= 0 disables the convergence test (run ``max_steps``). ``scale`` ``None``:
    ``scale_factor x`` the std of the noised representation (``scale_basis="input"``) or of the
    word-embedding matrix (``"word_embeddings"``, Guan et al.); see
    :func:`~heedful.attribution.noise.noise_scale`. ``keep``: the state with the lowest ``J`` seen
    (``"best"``, Algorithm 1 / Guan et al.), the final one (``"last"``; ``J`` is a noisy
    estimate, so the lowest one seen favours a lucky draw) or the mean ``theta`` of the last
    ``window`` iterates (``"average"``, Polyak-Ruppert averaging). ``init``: ``theta`` starts at
    0, at a seeded N(0, 1) draw, or at the first-order optimum (``"linearized"``, see
    :func:`linearized_theta`). ``antithetic``: the ``samples`` draws of a step come in pairs
    ``z, -z``. ``crn``: common random numbers -- every step reuses the first step's draws.
    ``schedule``: Adam's learning rate constant or cosine-annealed from ``lr`` to 0 over
    ``max_steps``.
    """

    lam: float = 0.6
    samples: int = 8
    lr: float = 0.05
    max_steps: int = 100
    window: int = 25
    tol: float = 0.005
    scale: float | None = None
    scale_factor: float | None = None
    scale_basis: str = "input"
    space: str = "embedding_output"
    output: str = "logits"
    objective: str = "normalised"
    solver: str = "adam"
    probes: int = 16
    keep: str = "best"
    init: str = "zeros"
    antithetic: bool = False
    crn: bool = False
    schedule: str = "constant"
    internal_batch_size: int | None = None

    def check(self) -> None:
        check_choice("space", self.space, SPACES)
        check_choice("objective", self.objective, OBJECTIVES)
        check_choice("solver", self.solver, SOLVERS)
        check_choice("keep", self.keep, KEEP)
        check_choice("init", self.init, INITS)
        check_choice("schedule", self.schedule, SCHEDULES)
        check_choice("scale_basis", self.scale_basis, SCALE_BASES)
        check_choice("output", self.output, OUTPUTS)
        for name in ("samples", "max_steps", "window", "probes"):
            _check_number(name, getattr(self, name), 1, integer=True)
        if self.internal_batch_size is not None:
            _check_number("internal_batch_size", self.internal_batch_size, 1, integer=True)
        _check_number("lr", self.lr, 0, strict=True)
        _check_number("tol", self.tol, None)
        for name in ("scale", "scale_factor"):
            value = getattr(self, name)
            if value is not None:
                _check_number(name, value, 0, strict=True)
        _check_number("lam", self.lam, 0)


def _check_number(name: str, value: object, low: float | None, strict: bool = False, integer: bool = False) -> None:
    """An :class:`InputError` unless ``value`` is a finite number (an integer if ``integer``)
    above ``low`` (or at it, unless ``strict``)."""
    import math

    kind = "an integer" if integer else "a finite number"
    bound = "" if low is None else f" {'>' if strict else '>='} {low:g}"
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (not integer or float(value).is_integer())
    ok = ok and (low is None or (value > low if strict else value >= low))
    if not ok:
        default = Settings.__dataclass_fields__[name].default
        raise InputError(f"{name} must be {kind}{bound}, got {value!r}", hint="leave it unset for the default" if default is None else f"e.g. {name}={default}")


GUAN2019 = Settings(
    lam=0.2, samples=1, lr=0.01, max_steps=5000, tol=0.0, scale_factor=GUAN_SCALE_FACTOR,
    scale_basis="word_embeddings", init="randn",
)
"""Guan et al.'s reference settings: ``rate = 0.1`` (``lam = 2 * rate``), one noise sample per
step, 5000 Adam iterations at lr 0.01 from ``theta ~ N(0, 1)``, no convergence test, scale
10 x std(word embeddings)."""


@dataclass
class InterestFit:
    """Result of :func:`fit_interest` for ``P`` problems over a batch padded to ``N`` tokens.

    ``sigma`` ``[P, N]``: noise std of every token at the kept state (lowest objective, or the
    last with ``keep="last"``), 0 on padding. ``objective``/``distortion`` ``[P]``: ``J`` and its
    distortion term at that state (estimates from that step's samples). ``steps`` ``[P]``: steps run; ``converged`` ``[P]``;
    ``history`` ``[T, P]``: ``J`` per step (NaN once a problem stopped); ``scale`` ``[P]``: noise
    ceilings. ``elapsed`` ``[T]``: wall seconds from the start of the fit to the end of step
    ``t`` (for the whole batch; the warm start's closed form included); ``init_seconds``: the part
    of it spent on the warm start; ``elapsed_cpu`` / ``init_cpu``: the same in CPU seconds of
    the process (less sensitive to other work on the machine). ``states``: ``sigma`` under every ``keep`` rule (``"best"``,
    ``"last"``, ``"average"``) of the same run -- one optimisation, three estimates.
    """

    sigma: torch.Tensor
    objective: torch.Tensor
    distortion: torch.Tensor
    steps: torch.Tensor
    converged: torch.Tensor
    history: torch.Tensor
    scale: torch.Tensor
    elapsed: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    init_seconds: float = 0.0
    states: dict[str, torch.Tensor] = field(default_factory=dict)
    elapsed_cpu: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    init_cpu: float = 0.0
