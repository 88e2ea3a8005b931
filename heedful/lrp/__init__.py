"""Layer-wise relevance propagation for transformers, without per-model code.

Rules (:mod:`heedful.lrp.rules`) are small autograd functions (:mod:`heedful.lrp.functions`)
attached by role (:meth:`~heedful.adapters.ModelAdapter.lrp_roles`, derived from the adapter's
roles) through an interception (:mod:`heedful.adapters.intercept`) for the duration of an
:class:`~heedful.lrp.session.LRPSession`; :func:`~heedful.lrp.propagate.propagate` runs a
forward and the backward passes a method needs (:func:`~heedful.lrp.propagate.lrp_forward`, then
:func:`~heedful.lrp.propagate.lrp_backward`). Head statistics and masks for Mask-LRP live in
:mod:`heedful.lrp.heads` and :mod:`heedful.lrp.masks`.
"""

from heedful.lrp.propagate import LRPForward, RelevancePass, lrp_backward, lrp_forward, propagate
from heedful.lrp.rules import AttnLRPRules, CheferRules, RelevanceState, RuleSet, rule_set
from heedful.lrp.session import LRPSession

__all__ = [
    "AttnLRPRules",
    "CheferRules",
    "LRPForward",
    "LRPSession",
    "RelevancePass",
    "RelevanceState",
    "RuleSet",
    "lrp_backward",
    "lrp_forward",
    "propagate",
    "rule_set",
]
