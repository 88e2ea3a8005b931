"""Attribution methods; importing this package registers every one of them."""

from heedful.attribution import (  # noqa: F401
    attention,
    attention_gradient,
    baseline,
    gradient,
    perturbation,
    vector,
)
