"""Causal tracing, activation patching and attribution patching (heedful.inside).

Oracles: a plain loop -- one forward per restored cell, with forward hooks written here on the
``transformers`` modules -- equal to the batched grid; nnsight's activation patching equal to
it on a prompt pair; AtP equal to the derivative it linearises, by central differences in
float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import heedful
from heedful.inside.patching import KINDS, restore_cells
from heedful.inside.tracing import prepare_runs
from heedful.testing import tiny_model

PROMPT = "the capital of france is"
PAIR = "the capital of movie is"  # the same token length (12) under the tiny byte-level tokenizer

# the modules whose output each kind restores, per family, named here and not through the roles
MODULES = {
    "gpt2": {"residual": "transformer.h.{}", "attn": "transformer.h.{}.attn.c_proj", "mlp": "transformer.h.{}.mlp.c_proj"},
    "llama": {"residual": "model.layers.{}", "attn": "model.layers.{}.self_attn.o_proj", "mlp": "model.layers.{}.mlp.down_proj"},
    "bert": {"residual": "bert.encoder.layer.{}", "attn": "bert.encoder.layer.{}.attention.output.dense", "mlp": "bert.encoder.layer.{}.output.dense"},
}


@pytest.fixture(scope="module")
def models():
    found = {}

    def get(family: str, task: str = "causal_lm"):
        if (family, task) not in found:
            found[family, task] = tiny_model(family, task, initializer_range=0.2)
        return found[family, task]

    return get


def _swap_output(value: torch.Tensor, new, output):
    """A module output (a tensor or a tuple whose first element is the tensor) with ``new`` in place."""
    return (new, *output[1:]) if isinstance(output, tuple) else new


def plain_loop(model, runs, kind: str, window: int = 1) -> np.ndarray:
    """One forward of the raw ``transformers`` model per (layer, position) cell, the clean value
    written in by a forward hook: restored score minus the corrupted score, ``[L, N]``."""
    hf = model.hf_model
    layers = hf.config.num_hidden_layers
    names = MODULES[model.adapter.family]
    modules = [hf.get_submodule(names[kind].format(layer)) for layer in range(layers)]
    anchor = int(runs.anchor[0])
    mask = runs.batch.attention_mask
    readout = runs.readout

    def score(embeds):
        logits = hf(inputs_embeds=embeds, attention_mask=mask.expand(embeds.shape[0], -1)).logits
        return readout(logits[:, anchor] if logits.dim() == 3 else logits).mean()  # a classifier's: [B, C]

    clean = {}
    handles = [
        m.register_forward_hook(lambda mod, args, output, layer=layer: clean.__setitem__(layer, (output[0] if isinstance(output, tuple) else output).clone()))
        for layer, m in enumerate(modules)
    ]
    with torch.no_grad():
        score(runs.clean)
    for h in handles:
        h.remove()
    with torch.no_grad():
        base = score(runs.corrupted)
    n = runs.width
    grid = np.zeros((layers, n))
    for layer in range(layers):
        for pos in range(n):
            chosen = range(max(0, layer - window // 2), min(layers, layer - window // 2 + window))

            def hook(mod, args, output, at=None, pos=pos):
                value = output[0] if isinstance(output, tuple) else output
                value = value.clone()
                value[:, pos] = clean[at][:, pos]
                return _swap_output(value, value, output)

            handles = [modules[at].register_forward_hook(lambda mod, a, o, at=at: hook(mod, a, o, at)) for at in chosen]
            with torch.no_grad():
                grid[layer, pos] = float(score(runs.corrupted) - base)
            for h in handles:
                h.remove()
    return grid


def _runs(model, **options):
    base = {"corrupt": "france", "counterfactual": None, "target": None, "contrast": None, "metric": "prob", "noise": 3.0, "samples": 3, "seed": 0}
    base.update(options)
    return prepare_runs(model.adapter, PROMPT, **base)[0]


@pytest.mark.parametrize(
    ("family", "task", "kind", "window"),
    [("gpt2", "causal_lm", "residual", 1), ("llama", "causal_lm", "mlp", 3), ("llama", "causal_lm", "attn", 1), ("bert", "classification", "residual", 1)],
)
def test_batched_grid_equals_a_plain_loop(models, family, task, kind, window):
    model = models(family, task)
    prompt = PROMPT
    trace = heedful.trace(model, prompt, corrupt="france", kind=kind, window=window, samples=3, atp=False)
    expected = plain_loop(model, _runs(model), kind, window)
    assert trace.complete and trace.passes >= 1
    assert trace.effect.shape == expected.shape
    scale = max(1e-3, float(np.abs(expected).max()))
    np.testing.assert_allclose(trace.effect, expected, atol=1e-5 * scale + 1e-7, rtol=1e-4)
    assert abs(trace.clean_score - trace.corrupted_score) > 0  # the corruption changed something


def test_grid_is_the_same_whatever_the_rows_per_pass(models, monkeypatch):
    model = models("llama")
    whole = heedful.trace(model, PROMPT, corrupt="france", samples=4, atp=False)
    import heedful.inside.patching as patching

    monkeypatch.setattr(patching, "rows_per_pass", lambda adapter, width, grad=False: 3)  # cells split across passes
    cut = heedful.trace(model, PROMPT, corrupt="france", samples=4, atp=False)
    assert cut.passes > whole.passes
    np.testing.assert_allclose(cut.effect, whole.effect, atol=1e-6)


def test_activation_patching_equals_nnsight(models):
    nnsight = pytest.importorskip("nnsight")
    model = models("llama")
    trace = heedful.trace(model, PROMPT, counterfactual=PAIR, metric="logit_diff", atp=False)
    hf, tok = model.hf_model, model.tokenizer
    wrapped = nnsight.NNsight(hf)
    clean_ids = tok([PROMPT], return_tensors="pt")["input_ids"]
    corrupt_ids = tok([PAIR], return_tensors="pt")["input_ids"]
    target = model.adapter.output_index(trace.target)
    contrast = model.adapter.output_index(trace.contrast)
    layers, width = hf.config.num_hidden_layers, clean_ids.shape[1]
    with torch.no_grad():
        clean = []
        with wrapped.trace(clean_ids):
            for layer in range(layers):
                clean.append(wrapped.model.layers[layer].output.save())
        with wrapped.trace(corrupt_ids):
            logits = wrapped.output.logits.save()
        base = float(logits[0, -1, target] - logits[0, -1, contrast])
        expected = np.zeros((layers, width))
        for layer in range(layers):
            for pos in range(width):
                with wrapped.trace(corrupt_ids):
                    wrapped.model.layers[layer].output[:, pos, :] = clean[layer][:, pos, :]
                    logits = wrapped.output.logits.save()
                expected[layer, pos] = float(logits[0, -1, target] - logits[0, -1, contrast]) - base
    np.testing.assert_allclose(trace.effect, expected, atol=1e-4, rtol=1e-4)
    assert trace.corrupted == [7, 8, 9, 10]  # the tokens the prompts differ in


def test_head_grid_restores_each_head_everywhere(models):
    """Restoring every head of a layer restores the whole attention context of that layer: the
    head cells are the columns of the context, so a grid of head cells and the plain loop over
    the attention output projection's input agree when summed ... checked per head here by a
    hook that writes one head's columns of ``o_proj``'s input."""
    model = models("llama")
    trace = heedful.trace(model, PROMPT, counterfactual=PAIR, kind="head", atp=False)
    runs = _runs(model, corrupt=None, counterfactual=PAIR)
    hf = model.hf_model
    heads = hf.config.num_attention_heads
    width = hf.config.hidden_size // heads
    projections = [layer.self_attn.o_proj for layer in hf.model.layers]
    clean = {}
    handles = [p.register_forward_pre_hook(lambda mod, args, i=i: clean.__setitem__(i, args[0].clone())) for i, p in enumerate(projections)]
    anchor = int(runs.anchor[0])
    readout = runs.readout
    with torch.no_grad():
        hf(inputs_embeds=runs.clean)
        for h in handles:
            h.remove()
        base = float(readout(hf(inputs_embeds=runs.corrupted).logits[:, anchor])[0])
        for layer, proj in enumerate(projections):
            for head in range(heads):
                cols = slice(head * width, (head + 1) * width)

                def pre(mod, args, layer=layer, cols=cols):
                    x = args[0].clone()
                    x[..., cols] = clean[layer][..., cols]
                    return (x,)

                handle = proj.register_forward_pre_hook(pre)
                got = float(readout(hf(inputs_embeds=runs.corrupted).logits[:, anchor])[0]) - base
                handle.remove()
                assert math.isclose(trace.effect[layer, head], got, rel_tol=1e-4, abs_tol=1e-6)
    assert trace.columns == [f"head {h}" for h in range(heads)]


@pytest.mark.parametrize("kind", ["residual", "mlp", "head"])
def test_atp_is_the_derivative_it_linearises(kind):
    """AtP(cell) = d/dt M(a_corrupted + t (a_clean - a_corrupted)) at t = 0, the derivative taken
    here by central differences in float64 through a replace hook on each cell."""
    model = tiny_model("gpt2", "causal_lm", initializer_range=0.2)
    model.hf_model.double()
    trace = heedful.trace(model, PROMPT, counterfactual=PAIR, kind=kind, metric="logit", samples=1)
    runs = _runs(model, corrupt=None, counterfactual=PAIR, metric="logit")
    adapter = model.adapter
    layers = len(adapter.roles().blocks)
    groups = trace.effect.shape[1] if kind == "head" else 1
    cells = restore_cells(layers, runs.width, groups, kind)
    role = KINDS[kind]
    with torch.no_grad(), adapter.intercept() as hooks:
        found = hooks.record(role)
        adapter.forward(runs.batch, runs.anchor, inputs_embeds=runs.clean)
        clean = {k: v.clone() for k, v in found.items()}
    with torch.no_grad(), adapter.intercept() as hooks:
        found = hooks.record(role)
        adapter.forward(runs.batch, runs.anchor, inputs_embeds=runs.corrupted)
        corrupt = {k: v.clone() for k, v in found.items()}
    step = 1e-4
    derivative = np.zeros(cells.shape[0])
    for c, cell in enumerate(cells):
        values = []
        for t in (step, -step):
            with torch.no_grad(), adapter.intercept() as hooks:
                for layer in range(layers):
                    where = cell[layer].any(-1) if groups == 1 else cell[layer]  # [N] or [N, H]
                    if not where.any():
                        continue

                    def shift(v, layer=layer, where=where, t=t):
                        delta = (clean[layer] - corrupt[layer]).unflatten(-1, (groups, -1)) * where[None, ..., None].reshape(1, *where.shape, 1).to(v.dtype) if groups > 1 else (clean[layer] - corrupt[layer]) * where[None, :, None].to(v.dtype)
                        return v + t * delta.flatten(-2) if groups > 1 else v + t * delta

                    hooks.replace(role, shift, layers=[layer])
                values.append(float(runs.readout(adapter.forward(runs.batch, runs.anchor, inputs_embeds=runs.corrupted).logits)[0]))
        derivative[c] = (values[0] - values[1]) / (2 * step)
    np.testing.assert_allclose(trace.atp.ravel(), derivative, rtol=1e-5, atol=1e-8)
    assert math.isfinite(trace.spearman)


def test_cells_left_unchanged_by_the_corruption_run_no_pass(models, monkeypatch):
    """In a causal model the positions before the corrupted span are the same in both runs:
    their cells run no pass and are 0, as a pass gives them."""
    import heedful.inside.tracing as tracing

    model = models("llama")
    real, ran = tracing.patch, []
    monkeypatch.setattr(tracing, "patch", lambda adapter, runs, kind, states, cells, **kw: ran.append(len(cells)) or real(adapter, runs, kind, states, cells, **kw))
    trace = heedful.trace(model, PROMPT, corrupt="france", samples=2, atp=False)
    first = trace.corrupted[0]
    layers, width = trace.effect.shape
    assert ran == [layers * (width - first)]
    assert (trace.effect[:, :first] == 0).all()
    expected = plain_loop(model, _runs(model, samples=2), "residual")
    np.testing.assert_allclose(expected[:, :first], 0, atol=1e-6)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_grid_passes_continue_the_clean_prefix_and_compute_only_the_changed_positions(models, monkeypatch, family):
    """A causal model computes the positions before the corrupted span alike in every run: the
    grid's passes continue the clean prompt's key/value cache there and run only the positions
    from the span on -- with the plain loop's grid."""
    model = models(family)
    adapter = model.adapter
    real, seen = type(adapter).forward, []

    def spy(self, batch, anchor, **kw):
        if kw.get("prefix") is not None:
            seen.append((kw["inputs_embeds"].shape[:2], kw["prefix"][2], anchor.tolist()))
        return real(self, batch, anchor, **kw)

    monkeypatch.setattr(type(adapter), "forward", spy)
    trace = heedful.trace(model, PROMPT, corrupt="france", samples=2, atp=False)
    monkeypatch.undo()
    first, layers, width = trace.corrupted[0], *trace.effect.shape
    assert seen == [((layers * (width - first) * 2, width - first), first, [width - 1 - first] * layers * (width - first) * 2)]
    expected = plain_loop(model, _runs(model, samples=2), "residual")
    scale = max(1e-3, float(np.abs(expected).max()))
    np.testing.assert_allclose(trace.effect, expected, atol=1e-5 * scale + 1e-7, rtol=1e-4)


def test_graddrop_has_one_estimate_per_cell_and_agrees_in_magnitude(models):
    model = models("llama")
    trace = heedful.trace(model, PROMPT, corrupt="france", samples=2, gradient_dropout=True)
    assert trace.graddrop.shape == trace.effect.shape
    assert (trace.graddrop >= 0).all()
    assert trace.graddrop_spearman > 0


def test_ctrl_c_keeps_the_layers_computed(models, monkeypatch):
    model = models("llama")
    import heedful.inside.patching as patching

    monkeypatch.setattr(patching, "rows_per_pass", lambda adapter, width, grad=False: 4)
    real = patching.forward_rows
    calls = []

    def interrupted(adapter, runs, embeds):
        calls.append(1)
        if len(calls) > 5 and embeds.shape[0] == 4 and not torch.is_grad_enabled():
            raise KeyboardInterrupt
        return real(adapter, runs, embeds)

    monkeypatch.setattr(patching, "forward_rows", interrupted)  # calls: clean and corrupted, then passes of 2 cells; layer 0 has 5 changed cells
    trace = heedful.trace(model, PROMPT, corrupt="france", samples=2, atp=False)
    assert not trace.complete
    rows = np.isfinite(trace.effect).all(axis=1)
    assert rows[0] and not rows[-1]
    assert not rows[int(np.argmin(rows)) :].any()  # the layers computed are a prefix
    assert np.isfinite(trace.corrupted_score)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"corrupt": "germany"}, "'germany' is not in the prompt"),
        ({"corrupt": "France"}, "the match is case-sensitive"),
        ({"counterfactual": "the capital of the netherlands is"}, "patching needs them aligned"),
        ({"corrupt": "france", "counterfactual": PAIR}, "not both or neither"),
        ({}, "not both or neither"),
        ({"corrupt": "france", "target": " the capital"}, "a token target must be one token"),
        ({"corrupt": "france", "kind": "neuron"}, "unknown kind"),
        ({"corrupt": "france", "samples": 0}, "samples must be a positive integer"),
        ({"corrupt": "france", "metric": "logit_diff"}, "needs a contrast token"),
    ],
)
def test_bad_input_is_one_line(models, options, message):
    with pytest.raises(heedful.InputError, match=message):
        heedful.trace(models("llama"), PROMPT, **options)


def test_family_without_roles_is_refused_in_one_line():
    import transformers as tf

    from heedful.testing import bytelevel_tokenizer

    tok = bytelevel_tokenizer()
    torch.manual_seed(0)
    hf = tf.BloomForCausalLM(tf.BloomConfig(vocab_size=len(tok), hidden_size=32, n_layer=2, n_head=4))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = heedful.from_pretrained_objects(hf, tok)
    with pytest.raises(heedful.UnsupportedModelError, match="not mapped") as info:
        heedful.trace(model, PROMPT, corrupt="france")
    assert "\n" not in info.value.message


def test_outputs_json_frame_and_html(models):
    import json

    trace = heedful.trace(models("llama"), PROMPT, corrupt="france", samples=2)
    data = json.loads(trace.to_json())
    assert len(data["effect"]) == trace.layers and data["columns"] == trace.columns
    frame = trace.to_frame()
    assert list(frame.columns) == ["layer", "position", "token", "effect", "atp"]
    assert len(frame) == trace.effect.size
    page = trace.html()
    assert page.startswith("<!DOCTYPE html>") and "Spearman" in page


def test_cli_trace_prints_both_grids_and_refuses_bad_spans(tmp_path, monkeypatch, capsys):
    from conftest import run_cli, saved_tiny

    folder = saved_tiny(tmp_path / "m", "llama", "causal_lm", initializer_range=0.2)
    code, out, err = run_cli(monkeypatch, capsys, "trace", PROMPT, "--model", folder, "--corrupt", "france", "--samples", "2", "--html", str(tmp_path / "t.html"))
    assert code == 0, err
    assert "exact (patching)" in out and "AtP (gradient)" in out and "Spearman" in out
    assert (tmp_path / "t.html").exists()
    code, out, err = run_cli(monkeypatch, capsys, "trace", PROMPT, "--model", folder, "--corrupt", "germany")
    assert code == 2 and "error: 'germany' is not in the prompt" in err and "Traceback" not in err
