"""Bounded memory (:mod:`heedful.engine.memory`): the budget and its errors, the estimator's refusals,
gradient checkpointing and chunked prefill equal to the plain passes, and the runner's chunks
keeping a measured run under a set budget (plus, slow, a 4,096-token input on smollm2-135m)."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
from conftest import run_cli
from tiny import tiny_model

import heedful
from heedful.engine import memory
from heedful.engine.memory import (
    FORWARD,
    MIN_BUDGET,
    ModelShape,
    Need,
    current_rss,
    default_budget,
    estimate,
    fit,
    parse_memory,
    peak_rss,
    reset_peak_rss,
)
from heedful.engine.problem import prepare
from heedful.engine.runner import Runner
from heedful.errors import InputError

SMOLLM2 = ModelShape(
    layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, outputs=49152, embed=576,
    decoder=True, fused=True,
)
"""smollm2-135m's shape, as its adapter reads it (checked by the slow test)."""

SAVED = Need(grad="saved")
MiB = 2**20


def wide(family: str, task: str, positions: int = 2048) -> heedful.Model:
    """A tiny model widened to ``positions`` positions (D 128, 4 blocks of 8 heads, F 256)."""
    sizes = {"n_embd": 128, "n_layer": 4, "n_head": 8, "n_positions": positions} if family == "gpt2" else {
        "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8, "intermediate_size": 256,
        "head_dim": 16, "max_position_embeddings": positions,
    }
    model = tiny_model(family, task, **sizes)
    model.tokenizer.model_max_length = positions
    return model


def long_text(model: heedful.Model, tokens: int) -> str:
    """A text of at least ``tokens`` tokens."""
    text = "the film is a charming and often affecting journey . "
    while len(model.tokenizer(text)["input_ids"]) < tokens:
        text += text
    return text


# ---------------------------------------------------------------------------- the budget
def test_parse_memory_reads_sizes():
    assert parse_memory("4GB") == 4 * 10**9
    assert parse_memory("4 GiB") == 4 * 2**30
    assert parse_memory("512MiB") == 512 * MiB
    assert parse_memory("512mb") == 512 * 10**6
    assert parse_memory("1.5G") == int(1.5 * 2**30)
    assert parse_memory("64k") == 64 * 1024
    assert parse_memory("2048") == 2048
    assert parse_memory(123456) == 123456


@pytest.mark.parametrize("bad", ["", "lots", "4XB", "-1GB", "0", "0.1", "GB", "1e9", "4 GB more", 0, -5, True, 4.5, None])
def test_parse_memory_refuses_bad_values_in_one_line(bad):
    with pytest.raises(InputError) as info:
        parse_memory(bad)
    assert "\n" not in info.value.message
    assert "max_memory" in info.value.message or "memory size" in info.value.message
    assert info.value.hint and "4GB" in info.value.hint


def test_default_budget_is_half_the_available_memory(monkeypatch):
    monkeypatch.setattr(memory, "available_memory", lambda: 10 * 2**30)
    assert default_budget() == 5 * 2**30
    monkeypatch.setattr(memory, "available_memory", lambda: 100 * MiB)
    assert default_budget() == MIN_BUDGET
    monkeypatch.setattr(memory, "available_memory", lambda: None)
    assert default_budget() == 4 * 2**30


def test_available_memory_is_meminfos_mem_available():
    try:
        with open("/proc/meminfo") as fh:
            found = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        pytest.skip("no MemAvailable in /proc/meminfo")
    assert abs(memory.available_memory() - found) < 0.2 * found


def test_budget_on_the_adapter_the_model_and_load():
    model = tiny_model("bert", "classification")
    assert 0.5 * default_budget() < model.adapter.max_memory < 2 * default_budget()
    model.max_memory = "64MiB"
    assert model.max_memory == model.adapter.max_memory == 64 * MiB
    with pytest.raises(InputError, match="memory size"):
        model.max_memory = "lots"
    assert model.max_memory == 64 * MiB
    # a bad size fails before the model is looked for (a missing directory would say so)
    with pytest.raises(InputError, match="memory size"):
        heedful.load("./no-such-model-folder", max_memory="4XB")


@pytest.mark.parametrize("command", ["explain", "bench"])
def test_cli_max_memory_bad_value_is_one_line_exit_2(monkeypatch, capsys, command):
    args = ["explain", "a text"] if command == "explain" else ["bench", "--dataset", "movies", "--methods", "saliency"]
    code, out, err = run_cli(monkeypatch, capsys, *args, "--model", "./no-such-model-folder", "--max-memory", "4XB")
    assert code == 2
    assert "cannot read '4XB' as a memory size" in err
    assert "Traceback" not in err and "no-such-model-folder" not in err


def test_cli_max_memory_reaches_the_loaded_model(monkeypatch, capsys):
    seen = {}

    def load(name, device="cpu", max_memory=None):
        seen["explain"] = max_memory
        raise InputError("stopped after loading")

    def bench_load(name, **options):
        seen["bench"] = options.get("max_memory")
        raise InputError("stopped after loading")

    monkeypatch.setattr("heedful.cli.load_model", load)
    code, _, err = run_cli(monkeypatch, capsys, "explain", "a text", "--max-memory", "512MiB")
    assert code == 2 and "stopped after loading" in err
    monkeypatch.setattr(heedful, "load", bench_load)
    code, _, err = run_cli(
        monkeypatch, capsys, "bench", "--model", "m", "--dataset", "movies", "--methods", "saliency", "--max-memory", "1GiB"
    )
    assert code == 2 and "stopped after loading" in err
    assert seen == {"explain": 512 * MiB, "bench": 2**30}


# ---------------------------------------------------------------------------- the estimator
def test_estimate_grows_with_what_a_pass_keeps():
    n = 1024
    plain = estimate(SMOLLM2, 1, n)
    assert estimate(SMOLLM2, 2, n) - estimate(SMOLLM2, 1, n) == pytest.approx(plain - estimate(SMOLLM2, 0, n) - memory.FIXED, rel=1e-6)
    assert estimate(SMOLLM2, 1, n, Need(hidden_states=True)) > plain
    kept = estimate(SMOLLM2, 1, n, Need(attentions=True))
    assert kept - plain >= 30 * 9 * n * n * 4  # every layer's probabilities are kept
    assert estimate(SMOLLM2, 1, n, SAVED) > estimate(SMOLLM2, 1, n, Need(grad="checkpoint")) > plain
    assert estimate(SMOLLM2, 1, n, replace(FORWARD, eager=True)) > plain  # scores materialised
    assert estimate(SMOLLM2, 1, n, Need(queries=128)) > estimate(SMOLLM2, 1, n, Need(queries=64))
    extra = 7 * MiB
    assert estimate(SMOLLM2, 3, n, Need(extra_per_row=extra)) - estimate(SMOLLM2, 3, n) == 3 * extra
    assert SMOLLM2.cache_bytes(n) == 2 * 30 * 3 * 64 * n * 4


def test_a_4096_token_rollout_is_refused_naming_need_budget_and_fix():
    budget = parse_memory("4GB")
    with pytest.raises(InputError) as info:
        fit(SMOLLM2, 4096, budget, Need(attentions=True))
    message = info.value.message
    assert "\n" not in message
    assert "4096 positions keeping all attention probabilities" in message
    needed = float(message.split("needs about ")[1].split(" GiB")[0])
    assert needed * 2**30 >= 30 * 9 * 4096**2 * 4  # at least the kept probabilities (18 GB)
    assert "the budget is 3.7 GiB" in message
    assert "max_memory" in info.value.hint and "saliency" in info.value.hint


def test_fit_falls_back_to_checkpointing_and_prefill_and_refuses_when_nothing_fits():
    n, budget = 4096, parse_memory("4GB")
    assert estimate(SMOLLM2, 1, n, replace(SAVED, padded=False)) > budget
    backward = fit(SMOLLM2, n, budget, SAVED)
    assert backward.need.grad == "checkpoint" and backward.rows >= 1
    assert estimate(SMOLLM2, backward.rows, n, backward.need) <= budget
    with pytest.raises(InputError, match="forward and backward pass over 4096 positions"):
        fit(SMOLLM2, n, budget, SAVED, checkpoint=False)
    # eager attention (a family without fused attention): a forward's [H, N, N] scores are what
    # grows, and position chunks of the queries with the key/value cache shrink them
    eager = replace(SMOLLM2, fused=False)
    small = estimate(eager, 1, n, replace(FORWARD, padded=False)) - 1
    forward = fit(eager, n, small, FORWARD)
    assert forward.rows == 1 and forward.need.queries is not None and 1 <= forward.need.queries < n
    assert estimate(eager, 1, n, forward.need) <= small
    with pytest.raises(InputError, match="forward pass over 4096 positions"):
        fit(replace(eager, decoder=False), n, small, FORWARD)  # an encoder has no cache to prefill with
    with pytest.raises(InputError):
        fit(eager, n, memory.FIXED + 1024, FORWARD)
    # fused attention keeps no scores: the cache would cost more than the positions it saves
    with pytest.raises(InputError):
        fit(SMOLLM2, n, estimate(SMOLLM2, 1, n, replace(FORWARD, padded=False)) - 1, FORWARD)


def test_a_pass_that_cannot_fit_is_refused_before_any_work():
    model = wide("llama", "causal_lm")
    text = long_text(model, 1000)
    adapter = model.adapter
    width = len(model.tokenizer(text)["input_ids"])
    single = replace(FORWARD, padded=False)
    model.max_memory = estimate(adapter.shape, 1, width, single) + MiB  # a forward fits, attentions do not
    assert estimate(adapter.shape, 1, width, replace(single, attentions=True)) > model.max_memory
    adapter.counter.reset()
    with pytest.raises(InputError, match="attention probabilities"):
        model.explain(text, "rollout")
    assert adapter.counter.forward == 0
    # a backward that does not fit even checkpointed is refused before the reference pass
    assert estimate(adapter.shape, 1, width, Need(grad="checkpoint", padded=False)) > model.max_memory
    with pytest.raises(InputError, match="forward and backward"):
        model.explain(text, "saliency")
    assert adapter.counter.forward == 0


def test_a_whole_batchs_attention_probabilities_must_fit_beside_a_chunk():
    model = wide("llama", "causal_lm")
    adapter = model.adapter
    texts = [long_text(model, 300)] * 6
    width = len(model.tokenizer(texts[0])["input_ids"])
    need = Need(attentions=True, padded=False)
    # one chunk of a row or two fits, the probabilities of all six rows beside it do not
    model.max_memory = estimate(adapter.shape, 1, width, need) + memory.kept_bytes(adapter.shape, 2, width, need)
    assert adapter.fit(width, need).rows >= 1
    adapter.counter.reset()
    with pytest.raises(InputError, match=f"6 rows of a forward pass over {width} positions keeping all attention"):
        model.prepare(texts, attentions=True)
    assert adapter.counter.forward == 0
    model.max_memory = 8 * 2**30
    assert model.prepare(texts, attentions=True).reference.attentions[0].shape == (6, 8, width, width)


# ---------------------------------------------------------------------------- equal results
@pytest.mark.parametrize(("family", "task"), [("llama", "causal_lm"), ("gpt2", "causal_lm"), ("bert", "classification")])
def test_checkpointed_gradient_equals_the_plain_gradient(family, task):
    model = tiny_model(family, task, initializer_range=0.2)
    adapter = model.adapter
    batch = model.encode(["a charming , unbelievably affecting journey", "dull"])
    anchor, _ = adapter.anchor_positions(batch)
    calls = []
    hook = adapter.blocks[0].register_forward_hook(lambda *_: calls.append(1))
    found = []
    for checkpoint in (False, True):
        calls.clear()
        embeds = adapter.embed(batch.input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            fwd = adapter.forward(batch, anchor, inputs_embeds=embeds, checkpoint=checkpoint)
            found.append(adapter.grad(fwd.logits[:, 0], embeds))
        found.append(len(calls))
    hook.remove()
    plain, plain_calls, checkpointed, checkpointed_calls = found
    assert plain.abs().max() > 1e-4
    torch.testing.assert_close(checkpointed, plain, atol=1e-5, rtol=1e-5)
    # the block's inner modules run again in the backward; the block itself is called once
    assert plain_calls == checkpointed_calls == 1
    assert not any("forward" in block.__dict__ for block in adapter.blocks)  # the patch is gone


def test_checkpointing_recomputes_each_block_in_the_backward():
    model = tiny_model("llama", "causal_lm")
    adapter = model.adapter
    batch = model.encode(["a charming journey"])
    anchor, _ = adapter.anchor_positions(batch)
    runs = []
    hook = adapter.blocks[1].mlp.register_forward_pre_hook(lambda *_: runs.append(1))
    for checkpoint in (False, True):
        runs.clear()
        embeds = adapter.embed(batch.input_ids).detach().requires_grad_(True)
        with torch.enable_grad():
            adapter.grad(adapter.forward(batch, anchor, inputs_embeds=embeds, checkpoint=checkpoint).logits[:, 0], embeds)
        assert len(runs) == (2 if checkpoint else 1)
    hook.remove()


def test_the_runner_checkpoints_rows_too_long_to_keep_and_gets_the_same_gradients():
    model = wide("llama", "causal_lm")
    text = long_text(model, 400)
    adapter = model.adapter
    found = {}
    for label, budget in (("plain", None), ("checkpointed", "tight")):
        problem = model.prepare([text, "a short text"])
        width = problem.batch.seq_len
        if budget == "tight":
            budget = estimate(adapter.shape, 1, width, Need(grad="checkpoint", padded=False)) + MiB
            assert estimate(adapter.shape, 1, width, replace(SAVED, padded=False)) > budget
            model.max_memory = budget
            assert Runner.for_problem(problem).fit(width, SAVED).need.grad == "checkpoint"
        found[label] = heedful.get_method("integrated_gradients")(problem, n_steps=3)
        model.max_memory = 8 * 2**30
    torch.testing.assert_close(found["checkpointed"], found["plain"], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", ["llama", "gpt2", "opt"])
def test_chunked_prefill_equals_the_plain_forward(family):
    model = tiny_model(family, "causal_lm", initializer_range=0.2)
    adapter = model.adapter
    batch = model.encode(["a charming , unbelievably affecting journey through it", "dull"])
    anchor, _ = adapter.anchor_positions(batch)
    real = batch.attention_mask.bool()
    with torch.no_grad():
        plain = adapter.forward(batch, anchor, hidden_states=True)
        for size in (1, 3, 5):
            chunked = adapter.forward(batch, anchor, hidden_states=True, prefill=size)
            torch.testing.assert_close(chunked.logits, plain.logits, atol=1e-5, rtol=1e-5)
            for got, want in zip(chunked.hidden_states, plain.hidden_states, strict=True):
                torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    with pytest.raises(InputError):
        adapter.forward(batch, anchor, attentions=True, prefill=2)


def test_reference_pass_prefills_a_row_too_long_for_one_pass():
    model = wide("llama", "causal_lm")
    text = long_text(model, 600)
    adapter = model.adapter
    adapter.kernel_attention = False  # eager attention: the [H, N, N] scores are what grows
    assert not adapter.shape.fused
    batch = model.encode([text, "a short text"])
    plain = prepare(adapter, batch, hidden_states=True)
    whole = prepare(adapter, batch, " journey through it")  # a span: several positions read per row
    assert whole.target.is_span
    width = batch.seq_len
    model.max_memory = estimate(adapter.shape, 1, width, Need(hidden_states=True, padded=False)) - 1
    assert adapter.fit(width, Need(hidden_states=True)).need.queries is not None
    chunked = prepare(adapter, batch, hidden_states=True)
    torch.testing.assert_close(chunked.reference.logits, plain.reference.logits, atol=1e-5, rtol=1e-5)
    real = batch.attention_mask.bool()
    for got, want in zip(chunked.reference.hidden_states, plain.reference.hidden_states, strict=True):
        torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)
    model.max_memory = estimate(adapter.shape, 1, width, replace(FORWARD, padded=False)) // 2
    assert adapter.fit(whole.batch.seq_len, Need(anchors=whole.target.positions.shape[1])).need.queries is not None
    span = prepare(adapter, batch, " journey through it")
    torch.testing.assert_close(span.reference.logits, whole.reference.logits, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------------------- a measured run
ESTIMATE_FACTOR = 3.0
"""The estimate of the largest chunk is at least the measured peak of the run and at most this
many times it."""


def test_the_estimators_chunks_keep_a_run_under_the_budget():
    if not reset_peak_rss():
        pytest.skip("the peak resident memory cannot be reset here (no /proc/self/clear_refs)")
    model = wide("llama", "causal_lm")
    adapter = model.adapter
    text = long_text(model, 1000)
    steps = 16
    model.explain("a warm-up text", "integrated_gradients", n_steps=2)  # lazy set-up off the books
    width = len(model.tokenizer(text)["input_ids"])
    budget = 128 * MiB
    need = replace(SAVED, padded=False)  # copies of one example: all rows of one length
    unchunked = estimate(adapter.shape, steps, width, need)
    assert unchunked > 3 * budget  # one pass of all rows would not fit
    model.max_memory = budget
    planned = Runner(adapter, model.encode(text), None).fit(width, need)
    assert planned.need.grad == "saved" and 1 < planned.rows < steps
    chunk = estimate(adapter.shape, planned.rows, width, need)
    assert chunk <= budget
    reset_peak_rss()
    base = current_rss()
    start = time.perf_counter()
    found = model.explain(text, "integrated_gradients", n_steps=steps)
    peak = peak_rss() - base
    print(
        f"\nintegrated gradients, {steps} rows x {width} positions: budget {budget / MiB:.0f} MiB, "
        f"{planned.rows} rows per chunk estimated at {chunk / MiB:.0f} MiB, measured peak +{peak / MiB:.0f} MiB "
        f"(all rows at once: {unchunked / MiB:.0f} MiB) in {time.perf_counter() - start:.1f} s"
    )
    assert torch.isfinite(torch.as_tensor(found.scores)).all()
    assert found.cost.forward_passes >= steps
    assert peak < budget
    assert chunk / ESTIMATE_FACTOR <= peak <= chunk


# ---------------------------------------------------------------------------- smollm2-135m, 4,096 tokens
@pytest.mark.slow
def test_a_4096_token_input_on_smollm2_runs_within_4gb():
    budget = "4GB"
    model = heedful.load("smollm2-135m", max_memory=budget)
    adapter = model.adapter
    assert adapter.shape == SMOLLM2
    text = long_text(model, 4200)
    model.explain("warm up: page the weights in", "saliency")
    assert adapter.fit(4096, SAVED).need.grad == "checkpoint"  # a 4,096-token backward keeps too much
    for method in ("saliency", "normxlogit"):
        reset_peak_rss()
        base = current_rss()
        start = time.perf_counter()
        with pytest.warns(UserWarning, match="truncated"):
            found = model.explain(text, method, max_length=4096)
        peak = peak_rss() - base
        print(
            f"\n{method}: {len(found.tokens)} tokens under max_memory={budget}: peak RSS +{peak / MiB:.0f} MiB "
            f"above the loaded model ({peak_rss() / MiB:.0f} MiB in all), {time.perf_counter() - start:.0f} s"
        )
        assert len(found.tokens) == 4096
        assert torch.isfinite(torch.as_tensor(found.scores)).all()
        assert peak < parse_memory(budget)
    with pytest.raises(InputError, match="attention probabilities"), pytest.warns(UserWarning, match="truncated"):
        model.explain(text, "rollout", max_length=4096)
