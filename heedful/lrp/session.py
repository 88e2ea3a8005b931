"""``LRPSession``: a rule set attached to a model for the duration of a ``with`` block.

A thin layer over an :class:`~heedful.adapters.intercept.Interception`. Inside the block the
model computes exactly what it computes outside it (same forward values); what changes is what
flows backward. The session

* opens an interception on the model and lets the rule set attach its rules, by role, to the
  operations the adapter maps for relevance propagation (``adapter.lrp_roles()``, derived from the
  adapter's roles) -- including each block's attention computation;
* records, per layer, the attention probabilities ``[B, H, N, M]`` (kept in the graph, so
  gradients with respect to them can be asked for), every block's input ``[B, N, D]`` and the last
  block's output (for relevance-form rules the first block's input is made a leaf: relevance is
  read there, and nothing before it is back-propagated);
* holds the :class:`~heedful.lrp.rules.RelevanceState` the rules read during the backward passes
  (``mode``: ``"gradient"`` or ``"relevance"``, Mask-LRP's head mask, the recorded maps).

On exit the interception removes every hook and restores the attention implementation.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from heedful.adapters import ModelAdapter
from heedful.adapters.intercept import Interception, Kept
from heedful.adapters.roles import Site
from heedful.lrp.rules import RelevanceState, RuleSet


def _leaf(x: None, hidden: torch.Tensor) -> torch.Tensor:
    return hidden.detach().requires_grad_(True)


class LRPSession:
    """Attach ``rules`` to ``adapter``'s model (see the module docstring). ``adapter`` needs
    ``hf_model``, ``blocks`` and ``lrp_roles()``; ``state`` is what the rules read and write."""

    def __init__(self, adapter: ModelAdapter, rules: RuleSet) -> None:
        self.adapter = adapter
        self.rules = rules
        self.state = RelevanceState()
        self._inputs: list[Kept] = []
        self._probs: list[Kept] = []
        self._last = Kept()
        self._hooks: Interception | None = None

    @property
    def mode(self) -> str:
        return self.state.mode

    @mode.setter
    def mode(self, value: str) -> None:
        self.state.mode = value

    @property
    def probs(self) -> dict[int, torch.Tensor]:
        """Attention probabilities ``[B, H, N, M]`` of each layer that ran attention."""
        return _seen(self._probs)

    @property
    def block_inputs(self) -> dict[int, torch.Tensor]:
        """Each block's input ``[B, N, D]``."""
        return _seen(self._inputs)

    @property
    def last_output(self) -> torch.Tensor | None:
        """The last block's output ``[B, N, D]``."""
        return self._last.value

    def __enter__(self) -> LRPSession:
        roles = self.adapter.lrp_roles(self.rules.name)
        hooks = Interception(self.adapter.hf_model, attention=[block.attention for block in roles.blocks])
        hooks.__enter__()
        try:
            self.rules.attach(hooks, self.state, roles)
            blocks: list[nn.Module] = list(self.adapter.blocks)
            if self.rules.relevance_form:
                hooks.at(Site(blocks[0], "input"), _leaf)
            self._inputs = [hooks.keep(Site(block, "input")) for block in blocks]
            self._last = hooks.keep(Site(blocks[-1]))
            self._probs = [hooks.keep(Site(block.attention, "attention")) for block in roles.blocks]
        except BaseException:
            hooks.__exit__(*sys.exc_info())
            raise
        self._hooks = hooks
        return self

    def __exit__(self, *exc) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
            self._hooks = None


def _seen(kept: list[Kept]) -> dict[int, torch.Tensor]:
    return {i: k.value for i, k in enumerate(kept) if k.value is not None}
