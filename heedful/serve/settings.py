"""What a ``heedful serve`` instance allows: its models, its results store and its limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from heedful.errors import InputError

LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""Hosts that only this machine can reach; any other needs an explicit ``--host`` and warns."""


def _default_models() -> list[str]:
    from heedful.zoo import DEFAULT_MODEL

    return [DEFAULT_MODEL]


@dataclass
class ServeSettings:
    """Settings of one server.

    ``models``: the models loaded at start (the first is the default of every request); any
    other zoo model is listed and built / loaded on first request. ``store``: the results store
    ``GET /api/runs`` browses (a ``heedful bench --out`` folder; ``None``: no runs).
    Limits: ``max_chars`` characters of text or prompt, ``max_methods`` methods per request,
    ``max_n_steps`` for step options (``n_steps``, ``max_steps``), ``max_n_samples`` for sample
    options (``n_samples``, ``n_masks``, ``n_ablations``, ``samples``), ``max_new_tokens``
    generated tokens, ``timeout_s`` seconds from a request's arrival to its answer, and
    ``queue_size`` requests waiting behind the one being computed. ``device``: where models run
    (``None``: cpu); ``dtype``: what they are stored and run in (``"fp32"``, ``"bf16"``,
    ``"fp16"``; :func:`heedful.load`). ``allowed_hosts``: the ``Host`` headers answered (``None``: any); a
    loopback server answers only loopback names, so a web page elsewhere cannot reach it by
    pointing a domain name at 127.0.0.1 (DNS rebinding). ``revision``, ``allow_pickle``,
    ``trust_remote_code``: how the models started with are fetched from the hub
    (:func:`heedful.load`; a ``revision`` pins the one model started with, which ``models``
    may also name as ``ORG/NAME@REV``)."""

    models: list[str] = field(default_factory=_default_models)
    store: Path | None = None
    max_chars: int = 2000
    max_methods: int = 6
    max_n_steps: int = 64
    max_n_samples: int = 512
    max_new_tokens: int = 32
    timeout_s: float = 120.0
    queue_size: int = 8
    device: str | None = None
    dtype: str = "fp32"
    allowed_hosts: list[str] | None = None
    revision: str | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if not self.models:
            raise InputError("a server needs at least one model", hint="pass --model NAME")
        for name in ("max_chars", "max_methods", "max_n_steps", "max_n_samples", "max_new_tokens", "queue_size"):
            if int(getattr(self, name)) < 1:
                raise InputError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.revision is not None and len(self.models) != 1:
            raise InputError(
                f"--revision {self.revision} pins one hub model, and {len(self.models)} are given",
                hint="pin each as --model ORG/NAME@REV instead",
            )
        from heedful.engine.precision import (
            check_dtype,  # imports torch, which serving loads anyway
        )

        check_dtype(self.dtype)
        if not self.timeout_s > 0:
            raise InputError(f"timeout_s must be positive, got {self.timeout_s}")
        if self.store is not None:
            self.store = Path(self.store).expanduser()
            if self.store.exists() and not self.store.is_dir():
                raise InputError(f"the results store {self.store} is a file", hint="pass the folder `heedful bench --out` wrote")

    def hub(self, name: str) -> dict[str, object]:
        """:func:`heedful.load`'s hub arguments for model ``name`` (those set for the models the
        server was started with; none for the zoo models it loads on request)."""
        if name not in self.models:
            return {}
        found = {"revision": self.revision, "allow_pickle": self.allow_pickle, "trust_remote_code": self.trust_remote_code}
        return {k: v for k, v in found.items() if v}

    @property
    def default_model(self) -> str:
        return self.models[0]
