"""Model interest (co-perturbation): studies, and the helpers the applications build on.

- :func:`layer_map` -- interest at every layer of a sentence (the paper's Figure 5);
- :func:`lambda_sweep` -- interest of chosen words and the distortion against lambda (Figure 4);
- :func:`top_fraction` / :func:`suppress` -- pick the top-r fraction of tokens by interest and
  erase them (the paper's Section 5.4.1 rectification);
- :func:`downweight` -- scale chosen tokens' input representations;
- :func:`steer` -- suppress prompt words by down-weighting, generate with and without, and
  compare interest before and after (Section 5.4.2 steering, Figure 9).

Interest over a causal LM's prompt is ``model.explain(prompt, method="coperturbation")``
(distortion of the next-token logits) or with ``layer=-1`` (all prompt tokens' last states).
"""

from heedful.interest.steer import Steering, steer
from heedful.interest.studies import LambdaSweep, LayerMap, lambda_sweep, layer_map
from heedful.interest.suppress import downweight, suppress, top_fraction

__all__ = [
    "LambdaSweep", "LayerMap", "Steering", "downweight", "lambda_sweep", "layer_map", "steer", "suppress", "top_fraction",
]
