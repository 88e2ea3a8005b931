"""What a method can need from a model, and the refusal when the model does not give it.

Every registered method declares its needs (:func:`heedful.registry.register`, ``needs=``);
every adapter says which it provides (:meth:`heedful.adapters.ModelAdapter.provides`). A mapped
family provides all of them but the relevance rules of families they were not checked on (and
the block shapes its roles do not have: plain or pre-LN blocks); the
generic adapter of an unknown family (:mod:`heedful.adapters.generic`) provides only what
``transformers`` exposes for every model. A method whose needs the model does not meet is
refused before any work (:func:`refusal`).
"""

from __future__ import annotations

from heedful.errors import UnsupportedModelError

NEEDS: dict[str, str] = {
    "embeddings": "the input embeddings and a forward pass from them",
    "attentions": "the attention probabilities (output_attentions under eager attention)",
    "hidden_states": "every layer's hidden states (output_hidden_states)",
    "attention_flow": "one stack's attention probabilities, each layer mixing the previous layer's outputs, in the graph of the output (to roll them out through the layers or differentiate them)",
    "blocks": "the transformer blocks as one list of modules (to perturb the first block's input)",
    "head": "the head as a module applied to any token's representation (the logit lens)",
    "roles": "the block roles (where each block's query, key, value, attention output, norms and MLP live)",
    "plain_blocks": "plain pre-LN or post-LN blocks (no query/key, sandwich or post norms, parallel sub-layers or experts)",
    "pre_ln_blocks": "an additive residual stream (every block pre-LN), whose layer updates add up to the output",
    "rules": "a relevance (LRP) rule set checked on the family's blocks",
    **{f"rules.{name}": f"the {name} relevance rules checked on the family's blocks" for name in ("chefer", "lrp", "attnlrp")},
}
"""Every need a method can declare, and what it means (the refusal names it)."""

EXTENDING = "docs/extending.md, 'Add an architecture'"
"""Where the refusal sends the user: how a family is given what a method needs."""


def check_needs(needs: tuple[str, ...], owner: str) -> tuple[str, ...]:
    """``needs`` in a fixed order, each one of :data:`NEEDS` (a ``ValueError`` naming ``owner``
    otherwise)."""
    unknown = [n for n in needs if n not in NEEDS]
    if unknown:
        raise ValueError(f"{owner}: unknown need(s) {', '.join(map(repr, unknown))} (one of {', '.join(NEEDS)})")
    return tuple(n for n in NEEDS if n in needs)


def refusal(method: str, missing: tuple[str, ...], model: str) -> UnsupportedModelError:
    """The one-line error refusing ``method`` on ``model`` (its family and class) for the needs
    it lacks."""
    wanted = "; ".join(NEEDS[n] for n in missing)
    return UnsupportedModelError(
        f"{method} needs {wanted}, which heedful does not know for {model}",
        hint=f"use a method this model allows (heedful methods --model NAME), or map the family: {EXTENDING}",
    )
