"""Inside the model: what a layer encodes (probes: :mod:`heedful.inside.probing`, amnesic
probing: :mod:`heedful.inside.amnesic`), how adding a vector to the residual stream steers a
language model (:mod:`heedful.inside.steering`), which hidden states carry a prediction (causal
tracing, activation and attribution patching: :mod:`heedful.inside.tracing`) and whether an
explanation's hypotheses survive realistic edits (:mod:`heedful.inside.counterfactual`).
Everything reads and writes hidden states through the adapters' roles
(:mod:`heedful.adapters.roles`), so every family with roles is covered and the others are
refused in one line."""

from heedful.inside import amnesic, probing, properties, representations, steering, sweep

__all__ = ["amnesic", "probing", "properties", "representations", "steering", "sweep"]
