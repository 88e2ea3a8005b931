"""The checks every model family passes (:func:`check_family`), as scikit-learn's
``check_estimator`` does for estimators: write a family's adapter (its roles), give a factory of
small models, and ask whether heedful's methods see the model as ``transformers`` computes it.

Each check compares what heedful reads through the family's roles with what ``transformers``
computes without heedful (its ``output_hidden_states`` and ``output_attentions``, autograd on
its own forward), or a method's result with a law it must obey:

- ``roles``: every role the blocks have is read with its shape; the residual stream entering
  and leaving each block is ``transformers``' hidden state; the probabilities are its
  ``output_attentions``; the merged heads are the probabilities times the value vectors; the
  stream adds up around the sub-layers as the roles say (pre-LN, post-LN, sandwich norms,
  parallel attention and MLP), each norm role being its module applied to the stream.
- ``gradient``: ``grad_x_input`` equals gradient x input computed by autograd on the
  ``transformers`` model's own forward, one text at a time.
- ``attention``: the adapter's attention probabilities equal ``output_attentions``.
- ``decomposition``: DecompX's token scores sum to the explained logit (families whose blocks
  decomposition follows; the others must refuse it in one line).
- ``relevance``: for each rule set the family maps (:attr:`ModelAdapter.relevance_rules`):
  Chefer's and LRP's rules conserve relevance through every block; AttnLRP's per-block change
  stays within its documented tolerance; a rule set not mapped is refused in one line.
- ``methods``: every registered method runs on the model or refuses with one line and a hint
  (:class:`~heedful.UnsupportedModelError`); nothing else escapes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from heedful.attribution import get_method
from heedful.errors import UnsupportedModelError
from heedful.lrp import propagate, rule_set
from heedful.model import Model
from heedful.registry import MethodInfo, registered

TEXTS = ("a charming and often affecting journey", "the movie was dull")
"""Texts of different lengths (the second is padded in a batch with the first)."""
MASKED = ("a charming and often {mask} journey", "the {mask} was dull")
"""Masked-LM texts (``{mask}``: the tokenizer's mask token)."""

EXACT = {"rtol": 0.0, "atol": 0.0}
CLOSE = {"rtol": 1e-5, "atol": 1e-5}
"""Float32 tolerance of values computed in another order (sums of a few dozen products)."""
GRADIENT_SHARE = 1e-4
"""``grad_x_input`` against autograd: the largest difference allowed, relative to the text's
largest score. A float32 gradient is a sum whose order moves with the thread count, so a score
near 0 carries the rounding of the large terms it sums: the gradient methods' float32 error
against float64 is at most 7.8e-5 of the largest score (``tests/data/method_outputs.json``,
bounds; 1 and 2 threads), while a tolerance relative to each score (1e-4 of it, 1e-6 at least)
failed a score of 1e-3 on the tiny StableLM with 2 threads (off by 1.7e-6, 1e-5 of the largest).
At least 1e-6 (absolute) for models whose scores are all tiny."""
DECOMPOSITION_TOLERANCE = 1e-3
"""DecompX: largest |sum of scores - logit| relative to the largest logit (``tests/test_decomposition_methods.py``)."""
CONSERVATION = 1e-4
"""Chefer / LRP rules: largest per-block change of the relevance sum (seed 1)."""
ATTNLRP_CHANGE = 0.35
"""AttnLRP: largest per-block change of the relevance sum relative to the block output's L1
mass (not conservative by design: biases, norm shifts and the softmax rule absorb part; the
tiny Mixtral classifier's second block changes it by 0.305, the same with its routing weights
detached -- the experts' own split is exact, ``tests/test_families.py``)."""

ROLE_METHODS = (
    "saliency", "grad_x_input", "leave_one_out", "raw_attention", "rollout", "attcat", "attention_gradcam",
    "gae", "grad_sam", "cam", "lrp", "partial_lrp", "chefer", "attnlrp", "mask_lrp",
    "decompx", "alti", "globenc", "alti_logit", "value_zeroing", "normxlogit", "logat", "embedding_norm",
)
"""The methods the ``methods`` check runs: a gradient, a perturbation and the attention
methods, and every method that reaches inside the blocks by role (relevance, attention
gradients, decomposition, vector methods)."""

Factory = Callable[[str], Model]
"""``factory(task) -> Model``: a small model of the family with the head for ``task``."""


def texts_for(model: Model) -> list[str]:
    if model.task != "masked_lm":
        return list(TEXTS)
    return [t.format(mask=model.tokenizer.mask_token) for t in MASKED]


def _hf_forward(model: Model, batch, **kwargs):
    """``transformers``' own forward of the backbone and the head, without heedful."""
    hf = model.hf_model
    with torch.no_grad():
        return hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, return_dict=True, **kwargs)


# --------------------------------------------------------------------------- roles
def check_roles(model: Model) -> None:
    adapter = model.adapter
    batch = adapter.encode(texts_for(model))
    anchor = adapter.anchor_positions(batch)[0]
    roles = adapter.roles()
    names = [r for r in ("block_in", "query", "key", "value", "probs", "context", "attn_out", "attn_norm", "mlp_in", "mlp_gate", "mlp_up", "mlp_act", "mlp_out", "mlp_norm", "block_out") if all(b.has(r) for b in roles.blocks)]
    with adapter.intercept() as hooks, torch.no_grad():
        seen = {role: hooks.record(role) for role in names}
        post = {
            side: {layer: hooks.keep(norm.output) for layer, b in enumerate(roles.blocks) if (norm := getattr(b, side)) is not None}
            for side in ("attn_post_norm", "mlp_post_norm")
        }
        adapter.forward(batch, anchor)
    theirs = _hf_forward(model, batch, output_hidden_states=True, output_attentions=True)
    b, n = batch.input_ids.shape
    last = adapter.num_layers - 1
    for layer, block in enumerate(roles.blocks):
        get = {role: seen[role][layer] for role in names}
        assert get["block_in"].shape == (b, n, adapter.hidden_size), f"block_in of layer {layer}: {tuple(get['block_in'].shape)}"
        torch.testing.assert_close(get["block_in"], theirs.hidden_states[layer], **EXACT, msg=f"block_in of layer {layer} is not transformers' hidden state")
        if layer < last:
            torch.testing.assert_close(get["block_out"], theirs.hidden_states[layer + 1], **EXACT, msg=f"block_out of layer {layer}")
        probs = get["probs"]
        torch.testing.assert_close(probs, theirs.attentions[layer], **EXACT, msg=f"probs of layer {layer} are not output_attentions")
        value = get["value"].unflatten(-1, (block.value.heads, -1)).transpose(1, 2)
        value = value.repeat_interleave(probs.shape[1] // value.shape[1], dim=1)
        context = (probs @ value).transpose(1, 2).flatten(-2)
        torch.testing.assert_close(get["context"], context, **CLOSE, msg=f"context of layer {layer} is not probs x value")
        _check_stream(block, get, {side: kept[layer].value for side, kept in post.items() if layer in kept}, layer)


def _check_stream(block, get: dict[str, torch.Tensor], post: dict[str, torch.Tensor], layer: int) -> None:
    """The residual stream around the sub-layers, as the block's roles say it flows."""
    x = get["block_in"]
    attn = post.get("attn_post_norm", get["attn_out"])
    mlp = post.get("mlp_post_norm", get["mlp_out"])
    if block.attn_post_norm is not None:
        torch.testing.assert_close(attn, block.attn_post_norm.module(get["attn_out"]), **EXACT, msg=f"attn_post_norm of layer {layer}")
    if block.mlp_post_norm is not None:
        torch.testing.assert_close(mlp, block.mlp_post_norm.module(get["mlp_out"]), **EXACT, msg=f"mlp_post_norm of layer {layer}")
    if not block.pre_ln:  # post-LN: norm(x + f(x))
        torch.testing.assert_close(get["attn_norm"], block.attn_norm.module(attn + x), **EXACT, msg=f"post-LN attn_norm of layer {layer}")
        torch.testing.assert_close(get["mlp_in"], get["attn_norm"], **EXACT, msg=f"mlp_in of layer {layer}")
        torch.testing.assert_close(get["block_out"], block.mlp_norm.module(mlp + get["attn_norm"]), **CLOSE, msg=f"block_out of layer {layer}")
        return
    middle = x if block.parallel else x + attn
    if "attn_norm" in get:
        torch.testing.assert_close(get["attn_norm"], block.attn_norm.module(x), **EXACT, msg=f"attn_norm of layer {layer}")
    mlp_stream = block.mlp_norm.module(middle) if block.mlp_norm is not None else middle
    torch.testing.assert_close(get["mlp_in"], mlp_stream, **EXACT, msg=f"mlp_in of layer {layer}")
    out = x + attn + mlp if block.parallel else middle + mlp
    torch.testing.assert_close(get["block_out"], out, **CLOSE, msg=f"block_out of layer {layer} is not the sum of its sub-layers")


# --------------------------------------------------------------------------- gradient
def check_gradient(model: Model) -> None:
    """``grad_x_input`` against autograd on the ``transformers`` model's forward, per text."""
    hf = model.hf_model
    for text in texts_for(model):
        e = model.explain(text, "grad_x_input", quantity="logit")
        problem = model.prepare(text)
        batch, anchor = problem.batch, int(problem.target.anchor[0])
        column = int(problem.target.classes[0, 0])
        embeds = model.adapter.embed(batch.input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            out = hf(inputs_embeds=embeds, attention_mask=batch.attention_mask, return_dict=True).logits
            logit = out[0, column] if out.dim() == 2 else out[0, anchor, column]
            (grad,) = torch.autograd.grad(logit, embeds)
        expected = (grad * embeds).sum(-1)[0].detach()
        scale = float(expected.abs().max())
        torch.testing.assert_close(torch.as_tensor(e.scores, dtype=expected.dtype), expected, rtol=0, atol=max(GRADIENT_SHARE * scale, 1e-6),
                                   msg=lambda m, text=text, scale=scale: f"grad_x_input of {text!r} (largest score {scale:.3g}): {m}")


# --------------------------------------------------------------------------- attention
def check_attention(model: Model) -> None:
    adapter = model.adapter
    batch = adapter.encode(texts_for(model))
    with torch.no_grad():
        ours = adapter.forward(batch, adapter.anchor_positions(batch)[0], attentions=True).attentions
    theirs = _hf_forward(model, batch, output_attentions=True).attentions
    assert len(ours) == len(theirs) == adapter.num_layers, f"{len(ours)} layers of attention, transformers gives {len(theirs)}"
    for layer, (a, t) in enumerate(zip(ours, theirs, strict=True)):
        torch.testing.assert_close(a, t, **EXACT, msg=f"attention probabilities of layer {layer}")


# --------------------------------------------------------------------------- decomposition
def check_decomposition(model: Model) -> None:
    """DecompX's scores sum to the explained logit, or DecompX refuses in one line."""
    try:
        model.adapter.roles().require_plain("decompx")
    except UnsupportedModelError as refused:
        _refuses(model, "decompx", str(refused).splitlines()[0])
        return
    for text in texts_for(model):
        problem = model.prepare(text)
        logit = float(problem.target.score(problem.reference.logits)[0])
        scale = float(problem.reference.logits.abs().max())
        e = model.explain(text, "decompx")
        error = abs(float(e.scores.sum()) - logit) / max(scale, 1e-6)
        assert error <= DECOMPOSITION_TOLERANCE, f"decompx scores of {text!r} sum to {float(e.scores.sum()):.6g}, the logit is {logit:.6g}"


# --------------------------------------------------------------------------- relevance
def check_relevance(model: Model) -> None:
    adapter = model.adapter
    problem = model.prepare(texts_for(model))
    for name in ("chefer", "lrp", "attnlrp"):
        if name not in adapter.relevance_rules:
            _refuses(model, name)
            continue
        found = propagate(adapter, problem.batch, problem.target, rule_set(name), blocks=True)
        torch.testing.assert_close(found.score, problem.target.score(problem.reference.logits), **CLOSE, msg=f"{name}: the explained score")
        sums = torch.stack([r.sum(dim=(1, 2)) for r in found.blocks], dim=1).double()
        if name == "attnlrp":
            mass = torch.stack([r.abs().sum(dim=(1, 2)) for r in found.blocks[1:]], dim=1).double()
            change = float(((sums[:, :-1] - sums[:, 1:]).abs() / mass).max())
            assert change < ATTNLRP_CHANGE, f"attnlrp: a block changes the relevance sum by {change:.3g} of its mass"
        else:
            seed = float(problem.target.weights.sum())
            worst = float((sums - seed).abs().max())
            assert worst < CONSERVATION, f"{name}: relevance sums per block {sums.tolist()}, seeded with {seed}"


def _refuses(model: Model, method: str, expected: str = "") -> None:
    """``method`` refuses ``model`` with an :class:`UnsupportedModelError` of one line (and a
    hint) that says ``expected``, before any pass."""
    counter = model.adapter.counter
    before = counter.forward
    try:
        model.explain(texts_for(model)[1], method)
    except UnsupportedModelError as exc:
        message = str(exc).splitlines()[0]
        assert expected in message, f"{method} refused with {message!r}, not saying {expected!r}"
        assert exc.hint, f"{method} refused without a hint: {message!r}"
        assert counter.forward == before, f"{method} refused after {counter.forward - before} forward pass(es)"
        return
    raise AssertionError(f"{method} ran on a model whose family does not map it")


# --------------------------------------------------------------------------- every method
def check_methods(
    model: Model, methods: Sequence[str] | None = ROLE_METHODS, options: Callable[[MethodInfo, Model], Mapping[str, Any]] | None = None
) -> None:
    """Every method of ``methods`` (``None``: every registered method) that serves the model's
    task runs and returns finite scores, or refuses with one line and a hint; ``options(info,
    model)``: options to run it with (cheap settings)."""
    infos = [get_method(m) for m in methods] if methods is not None else list(registered().values())
    problems = []
    text = texts_for(model)[0]
    for info in infos:
        if not info.supports(model.task) or info.needs_sources:
            continue
        given = dict(options(info, model)) if options is not None else {}
        try:
            e = model.explain(text, info.name, **given)
        except UnsupportedModelError as exc:
            if not exc.hint or "\n" in exc.args[0]:
                problems.append(f"{info.name}: refused without a one-line message and hint: {exc!s}")
            continue
        except Exception as exc:  # a crash is what this check reports
            problems.append(f"{info.name}: raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        if not torch.isfinite(torch.as_tensor(e.scores)).all():
            problems.append(f"{info.name}: non-finite scores")
    assert not problems, "; ".join(problems)


CHECKS: dict[str, Callable[[Model], None]] = {
    "roles": check_roles,
    "gradient": check_gradient,
    "attention": check_attention,
    "decomposition": check_decomposition,
    "relevance": check_relevance,
    "methods": check_methods,
}
"""The checks of :func:`check_family`, by name, in the order they run."""


def family_checks(
    factory: Factory, tasks: Sequence[str], options: Callable[[MethodInfo, Model], Mapping[str, Any]] | None = None
) -> Iterator[tuple[str, Callable[[], None]]]:
    """``(name, check)`` for every check on every task's model (``name``: ``"task/check"``;
    ``check()`` builds the model on first use and runs; ``options``: the ``methods`` check's
    option function). The parametrize form lists them."""
    built: dict[str, Model] = {}

    def model_for(task: str) -> Model:
        if task not in built:
            built[task] = factory(task)
        return built[task]

    for task in tasks:
        for name, check in CHECKS.items():
            if name == "decomposition" and task == "regression":
                continue  # the logit of a regression head is its value: the classification case checks the sum
            if name == "methods":
                yield f"{task}/{name}", lambda task=task: check_methods(model_for(task), options=options)
            else:
                yield f"{task}/{name}", lambda check=check, task=task: check(model_for(task))


def check_family(
    factory: Factory,
    tasks: Sequence[str] = ("classification", "causal_lm"),
    options: Callable[[MethodInfo, Model], Mapping[str, Any]] | None = None,
) -> list[str]:
    """Run every check (:data:`CHECKS`) on ``factory(task)`` for each of ``tasks``; raise an
    ``AssertionError`` listing every failure, or return the checks passed (``"task/check"``).

    ``factory(task)`` returns a small :class:`~heedful.Model` of the family with the head for
    ``task`` (a decoder's language-model task is ``causal_lm``, an encoder's ``masked_lm``);
    :func:`heedful.testing.tiny_family_factory` gives one for every family heedful ships."""
    failures, passed = [], []
    for name, check in family_checks(factory, tasks, options):
        try:
            check()
        except AssertionError as exc:
            failures.append(f"{name}: {str(exc).splitlines()[0]}")
        else:
            passed.append(name)
    if failures:
        raise AssertionError(f"{len(failures)} family check(s) failed:\n  " + "\n  ".join(failures))
    return passed
