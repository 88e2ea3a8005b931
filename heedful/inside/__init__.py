"""Inside the model: what a layer encodes (probes: :mod:`heedful.inside.probing`, amnesic
probing: :mod:`heedful.inside.amnesic`) and how adding a vector to the residual stream steers a
language model (:mod:`heedful.inside.steering`). Everything reads and writes hidden states
through the adapters' roles (:mod:`heedful.adapters.roles`), so every family with roles is
covered."""

from heedful.inside import amnesic, probing, properties, representations, steering, sweep

__all__ = ["amnesic", "probing", "properties", "representations", "steering", "sweep"]
