"""ModelAdapter: the one place that knows how a transformers model is put together.

Methods ask the adapter for things by role -- the input embedding layer, a forward pass from
embeddings, every layer's hidden states and attention probabilities, the head-on-top applied to
any token's representation, the token that removes a token, any tensor inside a block
(:meth:`ModelAdapter.intercept`) -- and never name an architecture. Family subclasses
(``heedful.adapters.families``, ``heedful.adapters.recent``) fill in the hooks of
:class:`~heedful.adapters.family_hooks.FamilyHooks`, the family guide.

The adapter is put together from one part per concern: the family hooks
(:mod:`~heedful.adapters.family_hooks`), encoding and labels (:mod:`~heedful.adapters.encoding`),
execution and caches (:mod:`~heedful.adapters.passes`), memory fitting
(:mod:`~heedful.adapters.fitting`) and lower precision (:mod:`~heedful.adapters.lowering`); this
module holds what ties them: the wrapped model, what it provides, its roles' checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from heedful.adapters.encoding import Encoding
from heedful.adapters.family_hooks import FamilyHooks
from heedful.adapters.fitting import MemoryFitting
from heedful.adapters.intercept import Interception
from heedful.adapters.lowering import Lowering
from heedful.adapters.needs import NEEDS, refusal
from heedful.adapters.passes import PassCounter, Passes
from heedful.adapters.roles import LRPRoles
from heedful.engine.memory import default_budget, parse_memory
from heedful.errors import UnsupportedModelError


@dataclass
class ModelAdapter(FamilyHooks, Encoding, Passes, MemoryFitting, Lowering):
    """Wraps a ``transformers`` model and its tokenizer for heedful's methods.

    Subclasses fill in the family hooks (:class:`~heedful.adapters.family_hooks.FamilyHooks`:
    where the blocks are and what each block's roles are); everything else is generic.
    """

    hf_model: nn.Module
    tokenizer: object
    task: str
    name: str = "model"
    counter: PassCounter = field(default_factory=PassCounter)
    max_memory: int = field(default_factory=default_budget)
    """Bytes one pass may use on top of what the process holds (:mod:`heedful.engine.memory`);
    default :func:`~heedful.engine.memory.default_budget`, half of the memory available at load."""
    precision: str = "fp32"
    """The numeric precision this adapter's model runs at (:mod:`heedful.engine.precision`)."""
    lowered: dict = field(default_factory=dict, repr=False, compare=False)
    """Low-precision copies of this adapter by precision, built on first use (:meth:`at_precision`)."""

    def __post_init__(self) -> None:
        self.max_memory = parse_memory(self.max_memory)
        self.hf_model.eval()
        for p in self.hf_model.parameters():
            p.requires_grad_(False)
        # attention probabilities exist only in eager attention (sdpa / flash return none)
        if getattr(self.config, "_attn_implementation", "eager") != "eager" and hasattr(self.hf_model, "set_attn_implementation"):
            self.hf_model.set_attn_implementation("eager")
        self._check_roles()

    # ------------------------------------------------------------------ what methods may read
    @property
    def described(self) -> str:
        """The model as messages name it: its family and class."""
        return f"the {self.family} family ({type(self.hf_model).__name__})"

    def provides(self, need: str) -> bool:
        """Whether the model gives a method what it ``need``s (one of
        :data:`~heedful.adapters.needs.NEEDS`): a mapped family gives everything but relevance
        rules where none was checked on its blocks (:attr:`relevance_rules`; a rule set it does
        not map is refused by :meth:`lrp_roles`), plain blocks where its roles describe more
        (:meth:`~heedful.adapters.roles.BlockRoles.unplain`) and pre-LN blocks where they are
        post-LN."""
        if need not in NEEDS:
            raise ValueError(f"unknown need {need!r} (one of {', '.join(NEEDS)})")
        if need == "rules":
            return bool(self.relevance_rules)
        if need.startswith("rules."):  # one rule set (a mixture of experts: AttnLRP's only)
            return need.removeprefix("rules.") in self.relevance_rules
        if need == "plain_blocks":
            return not any(block.unplain() for block in self.roles().blocks)
        if need == "pre_ln_blocks":
            return all(block.pre_ln for block in self.roles().blocks)
        return True

    def refusal(self, method: str, missing: tuple[str, ...]) -> UnsupportedModelError:
        """The one-line error refusing ``method`` for the ``missing`` needs: what the blocks have
        where plain blocks are missing (:meth:`~heedful.adapters.roles.ModelRoles.require_plain`),
        else what each need means (:func:`heedful.adapters.needs.refusal`)."""
        if missing == ("plain_blocks",):
            try:
                self.roles().require_plain(method)
            except UnsupportedModelError as exc:
                return exc
        if missing == ("pre_ln_blocks",):  # known to heedful: the model has no such stream
            return UnsupportedModelError(
                f"{method} reads layer updates off an additive residual stream; {self.described} has post-LN blocks",
                hint="use decompx (or alti) for post-LN models",
            )
        return refusal(method, missing, self.described)

    def intercept(self) -> Interception:
        """A context in which any role can be recorded, replaced or given a rule (see
        :mod:`heedful.adapters.intercept`)::

            with adapter.intercept() as hooks:
                probs = hooks.record("probs")
                adapter.forward(batch, anchor)
        """
        return Interception(self.hf_model, self.roles())

    def lrp_roles(self, rules: str | None = None) -> LRPRoles:
        """The operations relevance propagation attaches its rules to, from :meth:`roles`;
        ``rules``: the rule set's name, refused unless in :attr:`relevance_rules` (``None``: any
        one of them)."""
        if rules not in self.relevance_rules if rules is not None else not self.relevance_rules:
            self.roles().lrp()  # a block relevance cannot pass says so itself
            what = f"the {rules} rules" if rules is not None else "relevance propagation (LRP) rules"
            mapped = ", ".join(sorted(self.relevance_rules)) or "none"
            raise UnsupportedModelError(
                f"{what} are not mapped for the {self.family} family (mapped: {mapped})",
                hint="docs/extending.md (Families) says how a family's rules are checked and mapped",
            )
        return self.roles().lrp()

    # ------------------------------------------------------------------ the model
    def _check_roles(self) -> None:
        if self.task in ("classification", "regression"):
            try:
                with torch.no_grad():
                    param = next(self.hf_model.parameters())
                    self.classification_head(torch.zeros(1, self.hidden_size, dtype=param.dtype, device=param.device))
            except (AttributeError, TypeError) as exc:
                raise UnsupportedModelError(
                    f"{type(self.hf_model).__name__} has no usable sequence-classification head ({exc})",
                    hint="load a *ForSequenceClassification checkpoint or pass the right task",
                ) from exc
        elif self.task in ("masked_lm", "causal_lm"):
            if self.lm_head_parts() is None and type(self).lm_head_full is ModelAdapter.lm_head_full:
                raise UnsupportedModelError(
                    f"{type(self.hf_model).__name__} has no language-model head",
                    hint="load a *ForMaskedLM or *ForCausalLM checkpoint",
                )

    @property
    def config(self):
        return self.hf_model.config

    @property
    def hidden_size(self) -> int:
        cfg = self.config
        return getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None) or cfg.n_embd

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device
