"""Any device: every tensor a method makes is made where it is meant to be.

heedful runs on the model's device; a tensor made without ``device=`` lands on the CPU, which on
a GPU either fails (mixing devices) or silently copies. Without a GPU that cannot be observed,
so this test holds the code to the rule that makes it hold: every factory call in heedful
(``torch.zeros``, ``arange``, ``tensor``, ``randn``, ...) names its device -- the model's, or
``"cpu"`` where the CPU is meant (seeded draws, bookkeeping read back with ``.tolist()``). Each
registered method runs on a tiny encoder classifier and a tiny decoder LM under a
:class:`torch.overrides.TorchFunctionMode` that records every factory call made from heedful's
own code without ``device=``.

What it cannot catch: code paths these two runs do not reach (other options, tasks, families);
tensors that reach the CPU otherwise (``torch.from_numpy``, ``.cpu()``, numpy round trips)
without being moved back; CPU-made tensors used as indices (which PyTorch accepts on any
device) are flagged though harmless; and factories inside ``transformers`` itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import heedful
from heedful.testing import MASKED_TEXTS, SOURCES, TEXTS, conformance_model, fast_options

FACTORIES = frozenset({
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor, torch.as_tensor,
    torch.rand, torch.randn, torch.randint, torch.randperm, torch.eye, torch.linspace, torch.logspace,
})
"""Functions that make a tensor on the default device unless told another."""
PACKAGE = Path(heedful.__file__).parent
EXEMPT = {PACKAGE / "testing.py"}
"""heedful's test helpers make the tests' inputs; they are not methods."""


class DeviceAudit(TorchFunctionMode):
    """Records ``file:line`` of every factory call from heedful's code without ``device=``."""

    def __init__(self) -> None:
        super().__init__()
        self.found: dict[str, str] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and kwargs.get("device") is None:
            caller = sys._getframe(1)
            where = Path(caller.f_code.co_filename)
            if where.is_relative_to(PACKAGE) and where not in EXEMPT:
                self.found.setdefault(f"{where.relative_to(PACKAGE.parent)}:{caller.f_lineno}", func.__name__)
        return func(*args, **kwargs)


def test_the_audit_sees_a_factory_without_a_device():
    audit = DeviceAudit()
    with audit:
        torch.zeros(2)  # from tests/: not heedful's
        from heedful.adapters.passes import right_padded

        right_padded(torch.ones(2, 3, dtype=torch.long))  # no factory inside
    assert audit.found == {}
    with audit:
        heedful.attribution.attention._layer_index(0, 1)  # pure Python: nothing recorded
    assert audit.found == {}


@pytest.mark.parametrize(("family", "task"), [("bert", "classification"), ("llama", "causal_lm")])
def test_every_method_makes_its_tensors_on_a_named_device(family, task):
    model = conformance_model(family, task)
    texts = list(TEXTS)
    if task == "masked_lm":
        texts = [t.format(mask=model.tokenizer.mask_token) for t in MASKED_TEXTS]
    audit = DeviceAudit()
    for info in heedful.methods(task=task):
        if info.missing(model.adapter):
            continue
        options = fast_options(info, model)
        sources = {"sources": SOURCES} if info.needs_sources else {}
        try:
            with audit:
                model.explain(texts, info.name, **sources, **options)
        except heedful.UnsupportedModelError:
            continue  # declined for this model with a hint (e.g. alti_logit on post-LN blocks)
    assert not audit.found, "factory calls without device=:\n" + "\n".join(f"{k} ({v})" for k, v in sorted(audit.found.items()))
