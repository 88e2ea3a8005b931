"""Lower-precision forward passes: the numeric precision a forward-only computation runs at.

Perturbation methods (leave-one-out, LIME, KernelSHAP, RISE) and the faithfulness curves only
run the model forward and read its outputs, so they can trade a little accuracy for speed:

* ``"fp32"`` -- the model as loaded (the default; every result reported unless asked).
* ``"bf16"`` -- a bfloat16 copy of the model: weights and activations in bfloat16, layer norms
  and softmax accumulating in float32 inside their kernels. Fast only where the hardware has
  bfloat16 arithmetic (AVX-512 BF16 or AMX on x86 CPUs, compute capability 8.0 on CUDA): there
  about twice the float32 rate; elsewhere several times *slower* than float32 (0.15x measured
  on an AMD EPYC without AVX-512). (Casting only the linear layers' weights, with float32
  activations between them, was measured too: half the speed-up, for a third of the
  deviation; see benchmarks/results/precision.md.)
* ``"int8"`` -- a copy whose linear layers are dynamically quantised to int8
  (:func:`torch.ao.quantization.quantize_dynamic`: int8 weights per tensor, activations
  quantised per batch; CPU only).
* ``"auto"`` -- the fastest of the precisions whose deviations the computation tolerates
  (:class:`Tolerates`) that this machine runs faster than fp32, by :func:`support`'s measured
  probe; fp32 where none is. Resolved before any work (:func:`resolve_precision`), so results
  and store keys record the precision actually used, never ``"auto"``.

:func:`support` says which precisions this machine runs natively (CPU flags or the GPU's
compute capability, :mod:`heedful.engine.machine`) and how fast, from a short timed probe cached per
machine. An explicit ``"bf16"`` or ``"int8"`` the probe measured slower than fp32 runs anyway
with one :class:`SlowPrecisionWarning` naming the ratio, or is refused (an :class:`InputError`)
inside :func:`strict_precision` (``--strict`` on the command line).

:func:`forward_precision` sets the precision for the passes run inside it (a context
variable: other threads and tasks keep theirs); an adapter asked for a forward pass at a lower
precision runs it on its low-precision copy (:func:`lowered_model`, built once per adapter and
precision and then reused). Outputs come back in float32 whatever the precision.

>>> import torch
>>> from heedful.engine.precision import lowered_model
>>> layer = torch.nn.Sequential(torch.nn.Linear(4, 2))
>>> lowered_model(layer, "bf16")(torch.ones(1, 4, dtype=torch.bfloat16)).dtype
torch.bfloat16
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
from torch import nn

from heedful.engine.machine import cpuinfo, cuda_route, native_route, relevant_flags
from heedful.errors import InputError
from heedful.files.atomic import atomic_file
from heedful.files.cache import heedful_home

PRECISIONS = ("fp32", "bf16", "int8")
CHOICES = (*PRECISIONS, "auto")
Precision = Literal["fp32", "bf16", "int8"]
"""A precision forward passes run at (see the module docstring)."""
PrecisionChoice = Literal["fp32", "bf16", "int8", "auto"]
"""The type of a ``precision`` option: a precision, or ``"auto"`` (resolved before any work)."""

SPEED_MARGIN = 1.1
"""A precision counts as faster than fp32 from this measured speed ratio on, and as slower
below its inverse: closer ratios are within the probe's noise on a shared machine."""

HALF = (torch.float16, torch.bfloat16)
"""The half-precision dtypes a model can be *stored* in (``heedful.load(..., dtype=...)``,
``--dtype``) -- distinct from the precision its forward-only passes run at (this module's
``precision`` option, a lowered copy of a float32 model). A half-precision model runs as
stored; what a method sums over many terms (gradients over copies and embedding dimensions,
relevance rules' ratios, token scores) is summed in float32 (:func:`widened`)."""


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is half precision (``t`` itself otherwise)."""
    return t.float() if t.dtype in HALF else t


DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
"""The dtypes a model can be stored in, by their names on the command line (``--dtype``)."""


def check_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``dtype`` (a name of :data:`DTYPES` or one of its values) as a ``torch.dtype``; an
    :class:`InputError` otherwise."""
    found = DTYPES.get(dtype) if isinstance(dtype, str) else dtype if dtype in DTYPES.values() else None
    if found is None:
        raise InputError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", hint="store the model in fp32 (the default), bf16 or fp16")
    return found


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a :data:`DTYPES` value (``torch.bfloat16`` -> ``"bf16"``)."""
    return next(name for name, value in DTYPES.items() if value == dtype)


_ACTIVE: ContextVar[str] = ContextVar("heedful_precision", default="fp32")
_STRICT: ContextVar[bool] = ContextVar("heedful_strict_precision", default=False)


def check_precision(precision: str, auto: bool = False) -> str:
    """``precision`` when it is one of :data:`PRECISIONS` (or ``"auto"`` when ``auto``); an
    :class:`InputError` otherwise."""
    allowed = CHOICES if auto else PRECISIONS
    if precision not in allowed:
        raise InputError(f"precision {precision!r} is not one of {', '.join(allowed)}", hint=f"use {', '.join(allowed[:-1])} or {allowed[-1]}")
    return precision


def active_precision() -> str:
    """The precision forward passes run at here (``"fp32"`` outside :func:`forward_precision`)."""
    return _ACTIVE.get()


@contextmanager
def forward_precision(precision: str) -> Iterator[None]:
    """Forward passes inside run at ``precision`` (the adapter's low-precision copy of its model).

    Only forward passes without gradients belong inside: the low-precision copies serve no
    backward pass.
    """
    token = _ACTIVE.set(check_precision(precision))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def lowered_model(model: nn.Module, precision: str) -> nn.Module:
    """A copy of ``model`` for forward passes at ``precision`` (``model`` itself is untouched):
    ``"bf16"`` in bfloat16 (its inputs' embeddings must be bfloat16 too), ``"int8"`` with every
    ``nn.Linear`` dynamically quantised (CPU only); ``"fp32"`` returns ``model``."""
    check_precision(precision)
    if precision == "fp32":
        return model
    device = next(model.parameters()).device
    if precision == "int8" and device.type != "cpu":
        raise InputError(f"precision int8 runs on the CPU only; the model is on {device}", hint="use precision='bf16'")
    lowered = copy.deepcopy(model).eval()
    if precision == "bf16":
        lowered = lowered.to(torch.bfloat16)
    else:
        with warnings.catch_warnings():  # torch.ao's deprecation notices: the eager API is what runs here
            warnings.simplefilter("ignore")
            lowered = torch.ao.quantization.quantize_dynamic(lowered, {nn.Linear}, dtype=torch.qint8)
    for p in lowered.parameters():
        p.requires_grad_(False)
    return lowered


# ---------------------------------------------------------------------------- what the machine runs
@dataclass(frozen=True)
class Tolerates:
    """``Annotated`` metadata of a ``precision`` option (or a constant beside a protocol field):
    the lower precisions whose deviations from fp32 the computation's results tolerate -- those
    ``precision="auto"`` may choose (measured in benchmarks/results/precision.md)."""

    precisions: tuple[str, ...] = ()


class SlowPrecisionWarning(UserWarning):
    """An explicit lower precision this machine runs slower than fp32 (:func:`resolve_precision`)."""


@dataclass(frozen=True)
class Support:
    """Which precisions this machine runs natively and how fast, measured (:func:`support`).

    ``routes[p]``: how the hardware runs precision ``p`` -- the instructions that run it, or
    what is missing (CPU flags, :mod:`heedful.engine.machine`; on CUDA the compute capability).
    ``speed[p]``: the measured speed of the probe at ``p`` relative to fp32 (``> 1``: faster;
    ``None``: ``p`` cannot run on this device). ``flags``: the relevant CPU flags present
    (``None``: unknown); ``probe``: what was timed, at ``threads`` torch threads.
    """

    device: str
    processor: str
    flags: tuple[str, ...] | None
    routes: dict[str, str]
    speed: dict[str, float | None]
    probe: str
    threads: int
    torch: str
    seconds: float

    def faster(self, precision: str) -> bool:
        """``precision`` ran at least :data:`SPEED_MARGIN` times the speed of fp32."""
        ratio = self.speed.get(precision)
        return ratio is not None and ratio >= SPEED_MARGIN

    def slower(self, precision: str) -> bool:
        """``precision`` ran below ``1 / SPEED_MARGIN`` times the speed of fp32."""
        ratio = self.speed.get(precision)
        return ratio is not None and ratio * SPEED_MARGIN < 1.0

    def where(self) -> str:
        """``"this processor"``, ``"this GPU"`` (CUDA) or ``"this mps device"``."""
        return {"cpu": "this processor", "cuda": "this GPU"}.get(self.device, f"this {self.device} device")

    def slow_message(self, precision: str) -> str:
        """One line: how fast ``precision`` runs here and why (for warnings and refusals)."""
        return (
            f"{precision} runs {self.speed[precision]:.2f}x the speed of fp32 on {self.where()} "
            f"({self.processor}: {self.routes[precision]}); use precision=fp32 or auto"
        )

    def ratios(self) -> str:
        """``"bf16 0.15x (no AVX-512 BF16 or AMX), int8 1.43x (no VNNI or AMX)"``."""
        parts = []
        for p in PRECISIONS[1:]:
            ratio = self.speed.get(p)
            parts.append(f"{p} {'-' if ratio is None else f'{ratio:.2f}x'} ({self.routes[p]})")
        return ", ".join(parts)

    def shown_flags(self) -> str:
        """The relevant flags present, comma-separated (or that they are unknown / absent)."""
        return "flags unknown" if self.flags is None else ", ".join(self.flags) or "none of the relevant flags"

    def summary(self) -> str:
        """One line: the processor, its relevant flags and the measured ratios."""
        return (
            f"{self.processor} ({self.device}; {self.shown_flags()}); speed vs fp32: {self.ratios()} "
            f"[{self.probe}, {self.threads} thread(s), torch {self.torch}]"
        )

    def auto(self, tolerated: Sequence[str]) -> str:
        """The fastest of ``tolerated`` that runs faster than fp32 here, else ``"fp32"``."""
        fast = [p for p in tolerated if self.faster(p)]
        return max(fast, key=lambda p: self.speed[p] or 0.0) if fast else "fp32"


# The probe: a linear stack shaped like a transformer block's feed-forward part (MiniLM's widths
# on CPU; a GPU needs more work per call to time it).
_PROBE_SHAPES = {"cpu": (128, 384, 1536), "cuda": (4096, 1024, 4096)}
_PROBE_ROUNDS = 7
_CACHE_NAME = "precision-support.json"
_MEMORY: dict[tuple[str, str], Support] = {}  # results a read-only cache could not keep


def support(device: str | torch.device = "cpu", *, refresh: bool = False) -> Support:
    """Which precisions this machine runs natively on ``device`` and how fast, relative to fp32.

    The flags come from the processor (:mod:`heedful.engine.machine`) or the GPU's compute
    capability; the speed from a probe -- a layer norm and two linear layers (``T x H -> 4H ->
    H``) timed at fp32, bf16 (:func:`lowered_model`) and int8 (dynamic quantisation, CPU only),
    interleaved, the fastest of 7 rounds (other work on the machine only adds time to a round,
    so the fastest is the least disturbed; a median moves with the load), at the current torch
    threads (about a second on a CPU without AVX-512, less with it). The result is cached in ``heedful_home()`` per processor
    model, flags and torch version (per GPU model on CUDA), so later calls take milliseconds;
    ``refresh`` probes again. A cache that cannot be written is skipped (the probe then runs once
    per process).
    """
    device = torch.device(device)
    kind = device.type
    if kind == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        capability = torch.cuda.get_device_capability(index)
        processor, flags = torch.cuda.get_device_name(index), None
        routes = {p: cuda_route(p, capability) for p in PRECISIONS}
        identity = [kind, processor, list(capability)]
    elif kind != "cpu":  # mps and others: no flags to read, the probe alone speaks
        processor, flags = f"{kind} device", None
        routes = {p: native_route(p, None) for p in PRECISIONS}
        identity = [kind]
    else:
        processor, all_flags = cpuinfo()
        flags = relevant_flags(all_flags)
        routes = {p: native_route(p, flags) for p in PRECISIONS}
        identity = [kind, processor, sorted(all_flags or [])]
    key = hashlib.sha1(json.dumps([*identity, torch.__version__]).encode()).hexdigest()[:16]
    path = heedful_home() / _CACHE_NAME
    if not refresh and (str(path), key) in _MEMORY and not path.exists():
        return _MEMORY[str(path), key]
    cached = _read_cache(path)
    if not refresh and key in cached:
        try:
            return _support_of(cached[key])
        except (TypeError, KeyError):
            pass  # written by another version: probe again
    began = time.perf_counter()
    speed, probe = _probe(device)
    found = Support(
        device=kind, processor=processor, flags=flags, routes=routes, speed=speed, probe=probe,
        threads=torch.get_num_threads(), torch=torch.__version__, seconds=time.perf_counter() - began,
    )
    cached[key] = asdict(found)
    _MEMORY[str(path), key] = found
    try:
        with atomic_file(path) as part:
            part.write_text(json.dumps(cached, indent=1, sort_keys=True), encoding="utf-8")
    except OSError:
        pass  # a read-only cache: this process keeps the result in _MEMORY
    return found


def _read_cache(path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _support_of(record: dict[str, Any]) -> Support:
    flags = record["flags"]
    return Support(**{**record, "flags": None if flags is None else tuple(flags)})


@torch.inference_mode()
def _probe(device: torch.device) -> tuple[dict[str, float | None], str]:
    """The probe's speed at each precision relative to fp32 (``None``: cannot run on
    ``device``), and a description of what was timed."""
    tokens, hidden, inner = _PROBE_SHAPES["cuda" if device.type == "cuda" else "cpu"]
    generator = torch.Generator().manual_seed(0)
    stack = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, inner), nn.GELU(), nn.Linear(inner, hidden)).eval()
    x = torch.randn(tokens, hidden, generator=generator)
    stack, x = stack.to(device), x.to(device)
    runs = {}
    for precision in PRECISIONS:
        try:
            model = lowered_model(stack, precision)
        except (InputError, RuntimeError):  # int8 off the CPU, or a build without the kernels
            continue
        inputs = x.to(torch.bfloat16) if precision == "bf16" else x
        runs[precision] = (model, inputs)
    times: dict[str, list[float]] = {p: [] for p in runs}
    for round_ in range(_PROBE_ROUNDS + 1):  # the first round warms up
        for precision, (model, inputs) in runs.items():
            began = time.perf_counter()
            model(inputs)
            _synchronize(device)
            if round_:
                times[precision].append(time.perf_counter() - began)
    base = min(times["fp32"])
    speed = {p: (base / min(times[p]) if p in times else None) for p in PRECISIONS}
    return speed, f"layer norm + linear {hidden}->{inner}->{hidden} on {tokens} tokens"


def _synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device`` (GPUs run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


# ---------------------------------------------------------------------------- choosing and saying
_WARNED: set[tuple[str, str]] = set()


@contextmanager
def strict_precision(strict: bool = True) -> Iterator[None]:
    """Inside, an explicit precision this machine runs slower than fp32 is refused (an
    :class:`InputError`) instead of run with a warning (``--strict`` on the command line).

    >>> from heedful.engine.precision import is_strict, strict_precision
    >>> with strict_precision():
    ...     is_strict()
    True
    """
    token = _STRICT.set(strict)
    try:
        yield
    finally:
        _STRICT.reset(token)


def is_strict() -> bool:
    """Whether slow explicit precisions are refused here (:func:`strict_precision`)."""
    return _STRICT.get()


def resolve_precision(precision: str, device: str | torch.device = "cpu", tolerated: Sequence[str] = ()) -> str:
    """The precision to run at on ``device`` for a computation that tolerates the lower
    precisions ``tolerated`` (:class:`Tolerates`).

    ``"fp32"`` stays (no probe). ``"auto"`` becomes the fastest of ``tolerated`` that
    :func:`support` measured faster than fp32 here, else ``"fp32"``. An explicit ``"bf16"`` or
    ``"int8"`` stays; where the probe measured it slower than fp32 a one-line
    :class:`SlowPrecisionWarning` names the ratio (once per precision and device), or inside
    :func:`strict_precision` an :class:`InputError` refuses it before any work.
    """
    check_precision(precision, auto=True)
    if precision == "fp32" or (precision == "auto" and not tolerated):
        return "fp32"
    found = support(device)
    if precision == "auto":
        return found.auto(tolerated)
    if found.slower(precision):
        message = found.slow_message(precision)
        if is_strict():
            raise InputError(message, hint="drop strict (--strict) to run it anyway")
        if (precision, found.device) not in _WARNED:
            _WARNED.add((precision, found.device))
            warnings.warn(message, SlowPrecisionWarning, stacklevel=2)
    return precision
