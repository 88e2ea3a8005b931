"""Inside the model: which hidden states carry a prediction (causal tracing, activation and
attribution patching) and whether an explanation's hypotheses survive realistic edits
(counterfactual tests). Everything works through the adapters' roles
(:mod:`heedful.adapters.roles`), so every family with roles is covered and the others are
refused in one line."""
