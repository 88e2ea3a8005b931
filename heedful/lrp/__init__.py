"""Layer-wise relevance propagation for transformers, without per-model code.

Rules (:mod:`heedful.lrp.rules`) are small autograd functions (:mod:`heedful.lrp.functions`)
attached by role (:mod:`heedful.adapters.lrp_roles`) for the duration of an
:class:`~heedful.lrp.session.LRPSession`; :func:`~heedful.lrp.propagate.propagate` runs a
forward and the backward passes a method needs. Head statistics and masks for Mask-LRP live in
:mod:`heedful.lrp.heads` and :mod:`heedful.lrp.masks`.
"""

from heedful.lrp.propagate import RelevancePass, propagate
from heedful.lrp.rules import AttnLRPRules, CheferRules, RuleSet, rule_set
from heedful.lrp.session import LRPSession

__all__ = ["AttnLRPRules", "CheferRules", "LRPSession", "RelevancePass", "RuleSet", "propagate", "rule_set"]
