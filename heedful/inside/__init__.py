"""Inside the model: what a layer encodes (probes: :mod:`heedful.inside.probing`, amnesic
probing: :mod:`heedful.inside.amnesic`), how adding a vector to the residual stream steers a
language model (:mod:`heedful.inside.steering`; shifting probe-chosen heads instead:
:mod:`heedful.inside.iti`), which hidden states carry a prediction (causal
tracing, activation and attribution patching: :mod:`heedful.inside.tracing`) and whether an
explanation's hypotheses survive realistic edits (:mod:`heedful.inside.counterfactual`).
Everything reads and writes hidden states through the adapters' roles
(:mod:`heedful.adapters.roles`), so every family with roles is covered and the others are
refused in one line."""

from heedful.inside import amnesic, iti, probing, properties, representations, steering, sweep

__all__ = ["amnesic", "iti", "probing", "properties", "representations", "steering", "sweep"]
