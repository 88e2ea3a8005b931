"""What the processor is: its model name and the instructions lower precision depends on.

bfloat16 and int8 forward passes (:mod:`heedful.engine.precision`) are fast only where the hardware
has instructions for them:

* bf16 on x86 CPUs: AVX-512 BF16 (``avx512_bf16``: Intel Cooper Lake and later, AMD Zen 4 and
  later) or AMX (``amx_bf16``, ``amx_tile``: Intel Sapphire Rapids and later). Without them
  every bfloat16 product is converted to float32 in software and runs several times slower
  than float32 itself. On ARM: the ``bf16`` feature.
* int8 (dynamically quantised linear layers, fbgemm): AVX-512 VNNI / AVX-VNNI (``avx512_vnni``,
  ``avx_vnni``) or AMX-INT8 (``amx_int8``) multiply-accumulate int8 directly; with AVX2 alone
  the kernels emulate it with wider instructions (still usually faster than float32). On ARM:
  ``asimddp`` / ``i8mm``.
* On CUDA GPUs bfloat16 arithmetic needs compute capability 8.0 (Ampere) or later; heedful's
  int8 path runs on the CPU only.

The flags are read from ``/proc/cpuinfo`` (Linux); elsewhere they are unknown and only the
measured probe of :func:`heedful.engine.precision.support` speaks.

>>> from heedful.engine.machine import native_route
>>> native_route("bf16", ("avx2", "fma"))
'no AVX-512 BF16 or AMX'
>>> native_route("bf16", ("avx2", "avx512_bf16"))
'AVX-512 BF16'
"""

from __future__ import annotations

import platform
from pathlib import Path

RELEVANT_FLAGS = (
    "amx_tile", "amx_bf16", "amx_int8", "avx512_bf16", "avx512_vnni", "avx_vnni", "avx512f", "avx2", "fma",
    "bf16", "i8mm", "asimddp", "sve",
)
"""The CPU flags (x86 ``flags``, ARM ``Features``) that decide how fast bf16 and int8 run."""

_NAMED = {
    "amx_bf16": "AMX", "amx_int8": "AMX-INT8", "avx512_bf16": "AVX-512 BF16", "avx512_vnni": "AVX-512 VNNI",
    "avx_vnni": "AVX-VNNI", "bf16": "ARM BF16", "i8mm": "ARM I8MM", "asimddp": "ARM dot product",
}
# Per precision: the flags that run it natively (best first), and what is said when none is there.
_NATIVE = {
    "bf16": (("amx_bf16", "avx512_bf16", "bf16"), "no AVX-512 BF16 or AMX"),
    "int8": (("amx_int8", "avx512_vnni", "avx_vnni", "i8mm", "asimddp"), "no VNNI or AMX"),
}
CUDA_BF16 = (8, 0)
"""The CUDA compute capability from which GPUs have bfloat16 arithmetic (Ampere)."""


def cpuinfo(path: str | Path = "/proc/cpuinfo") -> tuple[str, tuple[str, ...] | None]:
    """``(model name, flags)`` of the first processor in ``path``; the flags are ``None`` where
    the file cannot be read (not Linux), the name then what :mod:`platform` knows."""
    name, flags = "", None
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor() or platform.machine() or "unknown", None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "processor") and not name and not value.strip().isdigit():
            name = value.strip()
        elif key in ("flags", "features") and flags is None:
            flags = tuple(value.split())
        if name and flags is not None:
            break
    return name or platform.processor() or platform.machine() or "unknown", flags


def relevant_flags(flags: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """The flags of :data:`RELEVANT_FLAGS` among ``flags``, in that order (``None``: unknown)."""
    if flags is None:
        return None
    present = set(flags)
    return tuple(f for f in RELEVANT_FLAGS if f in present)


def native_route(precision: str, flags: tuple[str, ...] | None) -> str:
    """How a CPU with ``flags`` runs ``precision``: the instructions that run it natively, or why
    it does not (``"fp32"``: always native; ``None`` flags: unknown)."""
    if precision == "fp32":
        return "native"
    if flags is None:
        return "flags unknown"
    names, missing = _NATIVE[precision]
    found = [_NAMED[f] for f in names if f in flags]
    return ", ".join(found) if found else missing


def is_native(precision: str, flags: tuple[str, ...] | None) -> bool | None:
    """Whether a CPU with ``flags`` has instructions for ``precision`` (``None``: unknown)."""
    if precision == "fp32":
        return True
    if flags is None:
        return None
    return any(f in flags for f in _NATIVE[precision][0])


def cuda_route(precision: str, capability: tuple[int, int]) -> str:
    """How a CUDA GPU of compute ``capability`` runs ``precision``."""
    if precision == "fp32":
        return "native"
    if precision == "int8":
        return "CPU only"
    major, minor = capability
    if capability >= CUDA_BF16:
        return f"compute capability {major}.{minor}"
    return f"compute capability {major}.{minor}: no bfloat16 arithmetic below {CUDA_BF16[0]}.{CUDA_BF16[1]}"
