"""Attribution methods; importing this package registers every one of them."""

from heedful.attribution import (  # noqa: F401
    attention,
    attention_gradient,
    baseline,
    coperturbation,
    gradient,
    individual_perturbation,
    perturbation,
    relevance,
    rise,
    surrogate,
    tdd,
    vector,
)
