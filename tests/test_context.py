"""Context attribution: sources, leave-one-source-out (with and without the key/value cache),
ContextCite's surrogate and hierarchical refinement, each against a plain computation that runs
the transformers model directly on the edited token ids."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging

import numpy as np
import pytest
import torch
import transformers
from conftest import cached_model, run_cli, saved_tiny

import heedful
from heedful import InputError
from heedful.engine.reuse import prefix_chunks
from heedful.engine.sources import SourceSpec, split_text, token_sources

DOC = "It rained all day. We stayed in and read. The cat slept on the mat. Then the sun came out!"
SHORT = "Rain fell. We read. Cats slept."


# ---------------------------------------------------------------------------- sources
def test_sentences_paragraphs_and_spans_keep_their_offsets():
    text = "First one. Second? Yes!\n\n1. Third line here.\nFourth."
    sentences = split_text(text, SourceSpec.parse("sentences"))
    assert [text[a:b] for a, b in sentences] == ["First one.", "Second?", "Yes!", "1. Third line here.", "Fourth."]
    paragraphs = split_text(text, SourceSpec.parse("paragraphs"))
    assert [text[a:b] for a, b in paragraphs] == ["First one. Second? Yes!", "1. Third line here.\nFourth."]
    within = split_text(text, SourceSpec.parse("sentences", within=(0, 23)))
    assert [text[a:b] for a, b in within] == ["First one.", "Second?", "Yes!"]
    assert split_text(text, SourceSpec.parse([(0, 5), (11, 18)])) == [(0, 5), (11, 18)]


def test_a_letterless_piece_joins_the_sentence_before_it_or_opening_a_line_the_one_after():
    text = "See the list. 1. ... Then more.\n... a good look at war. 2.\n3."
    assert [text[a:b] for a, b in split_text(text, SourceSpec())] == [
        "See the list. 1. ...", "Then more.", "... a good look at war. 2.", "3.",
    ]


@pytest.mark.parametrize("spec", ["words", "tokens:0", "tokens:x", "sentences:3", [(3, 1)], [], [("a", "b")]])
def test_bad_sources_are_one_line_errors(spec):
    with pytest.raises(InputError):
        SourceSpec.parse(spec)


def test_tokens_belong_to_the_source_holding_their_last_character():
    offsets = [None, (0, 3), (3, 7), (7, 8), (8, 12), None]
    assert token_sources(offsets, [(0, 7), (8, 12)]) == [-1, 0, 0, -1, 1, -1]


def test_token_windows_and_the_span_target_is_no_source():
    lm = cached_model("llama", "causal_lm")
    problem = lm.prepare(SHORT, target=" a b", sources="tokens:3")
    sources = problem.sources
    members = sources.ids[0]
    n_text = int(problem.target.positions[0, 0]) + 1
    assert (members[n_text:] == -1).all(), "the span's tokens are no source"
    counts = torch.bincount(members[members >= 0])
    assert counts[:-1].eq(3).all() and 1 <= int(counts[-1]) <= 3


def test_source_scores_pool_any_method_and_round_trip():
    lm = cached_model("llama", "causal_lm")
    e = lm.explain(DOC, "grad_x_input", sources="sentences")
    pooled = e.source_scores()
    assert len(pooled.words) == 4 and pooled.words[0] == "It rained all day."
    owner = np.array(token_sources(e.offsets, e.sources))
    for s in range(4):
        assert pooled.scores[s] == pytest.approx(e.scores[owner == s].sum())
    again = heedful.Explanation.from_dict(json.loads(e.to_json()))
    assert again.sources == e.sources
    np.testing.assert_allclose(again.source_scores().scores, pooled.scores)
    with pytest.raises(ValueError, match="no sources"):
        lm.explain(DOC, "grad_x_input").source_scores()


# ---------------------------------------------------------------------------- oracle
def _plain_output(lm, ids: list[int], target_ids: list[int] | None, column: int, kind: str = "log_prob") -> float:
    """log p of ``column`` after ``ids`` (or of the span ``target_ids``), by the model itself."""
    full = ids + (target_ids or [])
    with torch.no_grad():
        logits = lm.hf_model(input_ids=torch.tensor([full])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    if target_ids:
        start = len(ids) - 1
        total = float(sum(logp[start + k, t] for k, t in enumerate(target_ids)))
    else:
        total = float(logp[len(ids) - 1, column])
    if kind == "logit_prob":
        return total - float(np.log(-np.expm1(total)))
    return total


@pytest.fixture(params=["llama", "gpt2"])
def lm(request):
    return cached_model(request.param, "causal_lm")


@pytest.mark.parametrize("target", [" the", " a b c"])
def test_source_loo_with_and_without_the_cache_equals_removing_each_source_by_hand(lm, target):
    texts = [DOC, SHORT] if target == " the" else [SHORT, "Sun. Then rain came."]
    cached = lm.explain(texts, "source_loo", target=target)
    plain = lm.explain(texts, "source_loo", target=target, kv_cache=False)
    span = lm.tokenizer(target, add_special_tokens=False)["input_ids"]
    for c, p, text in zip(cached, plain, texts, strict=True):
        np.testing.assert_allclose(c.scores, p.scores, atol=1e-5)
        ids = lm.tokenizer(text)["input_ids"]
        owner = token_sources(lm.encode(text).offsets[0], c.sources)
        single = len(span) == 1
        full = _plain_output(lm, ids, None if single else span, span[0])
        for s, got in enumerate(c.source_scores().scores):
            kept = [t for t, o in zip(ids, owner, strict=True) if o != s]
            expected = full - _plain_output(lm, kept, None if single else span, span[0])
            assert got == pytest.approx(expected, abs=2e-5)


def test_reusing_the_cache_leaves_transformers_no_deprecated_keyword_to_warn_about(lm):
    # transformers 5.24 renamed ``past_key_values`` to ``cache`` (in and out) and warns once per
    # process on the old name: forget what it warned so far, so an earlier test cannot hide it
    logging.Logger.warning_once.cache_clear()
    said: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_warning()  # the suite runs transformers at errors only
    try:
        lm.explain(DOC, "source_loo")
        batch = lm.encode(DOC)
        with torch.no_grad():  # positions in chunks over a growing cache
            lm.adapter.forward(batch, lm.adapter.anchor_positions(batch)[0], prefill=3)
    finally:
        transformers.logging.set_verbosity(verbosity)
        logger.removeHandler(handler)
    assert not [line for line in said if "deprecated" in line]


def test_the_cache_runs_fewer_positions(lm, monkeypatch):
    # no rows merged to save passes: each chunk computes only its rows' own positions
    monkeypatch.setattr("heedful.engine.reuse.PASS_POSITIONS", 0)
    seen = []
    original = lm.adapter.forward

    def counted(batch, anchor, **kwargs):
        ids = kwargs.get("input_ids")
        seen.append(0 if ids is None else ids.numel())
        return original(batch, anchor, **kwargs)

    lm.adapter.forward = counted
    try:
        lm.explain(DOC, "source_loo")
        with_cache = sum(seen)
        seen.clear()
        lm.explain(DOC, "source_loo", kv_cache=False)
        without = sum(seen)
    finally:
        del lm.adapter.forward
    assert with_cache < 0.75 * without


def test_prefix_chunks_share_a_prefix_and_respect_the_budget():
    start = torch.tensor([0, 10, 20, 30, 31, 32])
    lengths = torch.tensor([40, 40, 40, 40, 40, 40])
    chunks = prefix_chunks(start, lengths, budget=40)
    assert sorted(torch.cat(chunks).tolist()) == list(range(6))
    for rows in chunks:
        cells = len(rows) * int(lengths[rows].max() - start[rows].min())
        assert cells <= 40 or len(rows) == 1
    assert any(set(c.tolist()) == {3, 4, 5} for c in chunks), "the three late rows share one chunk"


def test_context_cite_with_every_mask_equals_an_exact_least_squares_fit(lm):
    target = " the"
    e = lm.explain(SHORT, "context_cite", target=target, ablations="all", alpha=0.0, output="logit_prob", folds=0)
    column = lm.tokenizer(target, add_special_tokens=False)["input_ids"][0]
    ids = lm.tokenizer(SHORT)["input_ids"]
    owner = token_sources(lm.encode(SHORT).offsets[0], e.sources)
    n = len(e.sources)
    rows, ys = [], []
    for mask in itertools.product([0, 1], repeat=n):
        kept = [t for t, o in zip(ids, owner, strict=True) if o == -1 or mask[o]]
        rows.append([1.0, *mask])
        ys.append(_plain_output(lm, kept, None, column, "logit_prob"))
    solution, *_ = np.linalg.lstsq(np.array(rows), np.array(ys), rcond=None)
    np.testing.assert_allclose(e.source_scores().scores, solution[1:], atol=1e-4)
    assert e.details["intercept"] == pytest.approx(solution[0], abs=1e-4)


def test_context_cite_is_seeded_sparse_and_reports_its_fit(lm):
    first = lm.explain(DOC, "context_cite", n_ablations=40, seed=3)
    again = lm.explain(DOC, "context_cite", n_ablations=40, seed=3)
    other = lm.explain(DOC, "context_cite", n_ablations=40, seed=4)
    np.testing.assert_array_equal(first.scores, again.scores)
    assert not np.array_equal(first.scores, other.scores)
    assert set(first.details) == {"intercept", "r2", "lds"}
    assert np.isfinite(first.details["r2"]) and -1 <= first.details["lds"] <= 1
    dense = lm.explain(DOC, "context_cite", n_ablations=40, seed=3, alpha=0.0)
    assert (np.abs(first.source_scores().scores) < 1e-12).sum() >= (np.abs(dense.source_scores().scores) < 1e-12).sum()
    with pytest.raises(InputError, match="2\\^"):
        lm.explain(" ".join(f"S{i}." for i in range(20)), "context_cite", ablations="all")


def test_hierarchical_leaves_out_the_top_sources_exactly_and_ranks_the_rest_below_them(lm):
    text = DOC
    e = lm.explain(text, "hierarchical", keep=2)
    coarse = np.array(e.details["coarse_source_scores"])
    kept = e.details["kept_sources"]
    assert sorted(kept) == sorted(np.argsort(-coarse)[:2].tolist())
    scores = e.source_scores().scores
    ids = lm.tokenizer(text)["input_ids"]
    owner = token_sources(lm.encode(text).offsets[0], e.sources)
    column = e.target.indices[0]
    full = _plain_output(lm, ids, None, column)
    for s in kept:
        expected = full - _plain_output(lm, [t for t, o in zip(ids, owner, strict=True) if o != s], None, column)
        assert scores[s] == pytest.approx(expected, abs=2e-5)
    rest = [s for s in range(len(scores)) if s not in kept]
    floor = min(abs(scores[s]) for s in kept)
    assert max(abs(scores[s]) for s in rest) == pytest.approx(0.5 * floor, rel=1e-5)
    assert np.argsort(-scores[rest]).tolist() == np.argsort(-coarse[rest]).tolist()


def test_every_coarse_method_hierarchical_offers_is_registered_and_ranks_the_sources(lm):
    from typing import get_args

    from heedful.attribution.hierarchical import Coarse

    for coarse in get_args(Coarse):
        heads = {"heads": "uniform"} if coarse == "at2" else {}
        e = lm.explain(DOC, "hierarchical", coarse=coarse, keep=1, **heads)
        assert e.details["kept_sources"] == [int(np.argmax(e.details["coarse_source_scores"]))], coarse
        assert e.details["coarse"] == ("saliency" if coarse == "auto" else coarse)  # no AT2 weights for the tiny model


def test_hierarchical_ranks_by_at2_in_its_reference_pass_and_refines_from_that_passs_cache(lm, tmp_path, monkeypatch):
    from heedful.attribution import at2
    from heedful.fingerprint import model_fingerprint

    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    blocks = len(lm.adapter.roles().blocks)
    weights = np.random.default_rng(0).uniform(0.1, 1.0, (blocks, lm.adapter.config.num_attention_heads))
    fingerprint = model_fingerprint(lm.adapter).weights
    at2.HeadWeights(weights, fingerprint).save(at2.cache_path(fingerprint))  # learned weights in the cache: "auto" takes AT2
    texts = [DOC, SHORT]
    found = lm.explain(texts, "hierarchical", keep=2)
    for text, e in zip(texts, found, strict=True):
        assert e.details["coarse"] == "at2"
        alone = lm.explain(text, "at2")
        np.testing.assert_allclose(e.details["coarse_source_scores"], alone.source_scores().scores, atol=1e-6)
        ids = lm.tokenizer(text)["input_ids"]
        owner = token_sources(lm.encode(text).offsets[0], e.sources)
        column = e.target.indices[0]
        full = _plain_output(lm, ids, None, column)
        scores = e.source_scores().scores
        for s in e.details["kept_sources"]:
            expected = full - _plain_output(lm, [t for t, o in zip(ids, owner, strict=True) if o != s], None, column)
            assert scores[s] == pytest.approx(expected, abs=2e-5)
    # one pass over each text (the reference, which ranks and keeps the cache), one per kept source, no backward
    kept = sum(len(e.details["kept_sources"]) for e in found)
    assert sum(e.cost.forward_passes for e in found) == pytest.approx(len(texts) + kept)
    assert sum(e.cost.backward_passes for e in found) == 0
    saliency = lm.explain(texts, "hierarchical", keep=2, coarse="saliency")
    assert sum(e.cost.forward_passes for e in saliency) == pytest.approx(2 * len(texts) + kept)  # + the cache's own pass


def test_encoders_remove_sources_without_a_cache():
    model = cached_model("bert", "classification")
    e = model.explain(DOC, "source_loo", removal="mask")
    assert len(e.source_scores().scores) == 4 and np.abs(e.scores).sum() > 0


def test_context_methods_refuse_generation_steps():
    lm = cached_model("llama", "causal_lm")
    with pytest.raises(InputError, match="span"):
        lm.explain_generation(SHORT, "context_cite", max_new_tokens=2)


# ---------------------------------------------------------------------------- command line
@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory) -> str:
    return saved_tiny(tmp_path_factory.mktemp("tiny-llama"), "llama", "causal_lm")


def test_cli_ranks_sources_of_a_document(monkeypatch, capsys, lm_dir, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("It rained all day.\nWe stayed in and read.\n\nThe cat slept on the mat.\n", encoding="utf-8")
    page = tmp_path / "page.html"
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "--file", str(doc), "--model", lm_dir, "--target", " the",
        "--method", "source_loo", "--sources", "sentences", "--query", "So the",
    )
    assert code == 0
    assert "rank" in out and "The cat slept on the mat." in out and "3 sources" in out and "So the" in out
    code, _, _ = run_cli(
        monkeypatch, capsys, "explain", "--file", str(doc), "--model", lm_dir, "--target", " the",
        "--method", "source_loo", "--sources", "sentences", "--query", "So the", "--html", str(page),
    )
    html = page.read_text(encoding="utf-8")
    assert html.count('class="hf-source"') == 3 and "rank 1" in html
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "--file", str(doc), "--model", lm_dir, "--target", " the",
        "--method", "context_cite", "--sources", "paragraphs", "--json",
    )
    data = json.loads(out)
    assert code == 0 and len(data["source_scores"]["scores"]) == 2 and set(data["details"]) == {"intercept", "r2", "lds"}


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sources", "clauses"], "unknown sources"),
        (["--query", "Why?"], "--query goes with --sources"),
        (["--sources", "sentences", "--continuation", "x"], "--continuation with --sources"),
        (["--sources", "sentences", "--generate", "2", "--target", "x"], "--generate writes the answer"),
    ],
)
def test_cli_bad_source_options_exit_2(monkeypatch, capsys, lm_dir, args, message):
    code, _, err = run_cli(monkeypatch, capsys, "explain", "It rained. We read.", "--model", lm_dir, "--method", "source_loo", *args)
    assert code == 2 and message in err


def test_cli_ranks_the_sources_of_the_answer_the_model_writes(monkeypatch, capsys, lm_dir):
    code, out, _ = run_cli(
        monkeypatch, capsys, "explain", "It rained all day. We stayed in and read.", "--model", lm_dir,
        "--sources", "sentences", "--generate", "3", "--json",
    )
    data = json.loads(out)
    assert code == 0 and data["method"] == "context_cite"
    assert len(data["target"]["indices"]) == 3, "the three written tokens are one span target"
    assert len(data["source_scores"]["scores"]) == 2


@pytest.mark.parametrize("share", [0.0, 2.0])
def test_copies_that_share_little_of_their_prefix_run_as_full_passes_with_the_same_scores(lm, monkeypatch, share):
    # share 0: every copy continues the cache; share 2: none does
    reference = lm.explain(DOC, "context_cite", target=" the", n_ablations=16, folds=0)
    monkeypatch.setattr("heedful.engine.reuse.REUSE_SHARE", share)
    other = lm.explain(DOC, "context_cite", target=" the", n_ablations=16, folds=0)
    np.testing.assert_allclose(other.scores, reference.scores, atol=1e-5)


@contextlib.contextmanager
def _continued_passes(lm):
    """Collects ``(attention_mask, shared prefix length)`` of every pass that continues a cached
    prefix while the block runs."""
    seen = []
    original = lm.adapter.forward

    def spied(batch, anchor, **kwargs):
        if "prefix" in kwargs:
            seen.append((kwargs["attention_mask"], kwargs["prefix"][2]))
        return original(batch, anchor, **kwargs)

    lm.adapter.forward = spied
    try:
        yield seen
    finally:
        del lm.adapter.forward


def test_only_copies_that_share_enough_of_their_prefix_continue_the_cache(lm):
    from heedful.engine.reuse import REUSE_SHARE

    with _continued_passes(lm) as seen:
        lm.explain(DOC, "source_loo", target=" the")
        lm.explain(DOC, "context_cite", target=" the", n_ablations=16, folds=0)
    assert seen and all(bool(shared >= REUSE_SHARE * mask.sum(dim=1).min()) for mask, shared in seen)


def test_continuing_passes_stay_within_the_budget_beside_the_cache(lm, monkeypatch):
    from heedful.engine.memory import Need, estimate

    reference = lm.explain(DOC, "source_loo", target=" the", kv_cache=False)
    shape = lm.adapter.shape
    n = lm.prepare([DOC], " the").batch.seq_len
    held = shape.cache_bytes(n)
    # room beside the cache for one row computing half the document against it: late sources continue, early ones cannot
    budget = held + estimate(shape, 1, n, Need(queries=n // 2))
    monkeypatch.setattr(lm.adapter, "max_memory", budget)
    with _continued_passes(lm) as seen:
        cached = lm.explain(DOC, "source_loo", target=" the")
    np.testing.assert_allclose(cached.scores, reference.scores, atol=1e-5)
    assert seen, "some copies continue the cache"
    assert sum(mask.shape[0] for mask, _ in seen) < len(cached.sources), "the early sources' copies run as full passes"
    for mask, shared in seen:
        rows, width = mask.shape
        assert estimate(shape, rows, width, Need(queries=width - shared)) + held <= budget


def test_no_copy_continues_the_cache_where_none_fits_beside_it(lm, monkeypatch):
    reference = lm.explain(DOC, "source_loo", target=" the", kv_cache=False)
    monkeypatch.setattr("heedful.engine.reuse._held", lambda problem: problem.adapter.max_memory)
    with _continued_passes(lm) as seen:
        cached = lm.explain(DOC, "source_loo", target=" the")
    assert seen == []
    np.testing.assert_allclose(cached.scores, reference.scores, atol=1e-5)


def test_hierarchical_bad_options_and_prepare_options_are_one_line_refusals(tmp_path):
    lm = cached_model("llama", "causal_lm")
    cases = [
        (lambda: lm.prepare(DOC, method="hierarchical", options={"coarse": "bogus"}), "coarse"),
        (lambda: lm.prepare(DOC, options={"coarse": "at2"}), "no method"),
        (lambda: lm.explain(DOC, "hierarchical", coarse="at2", heads=str(tmp_path / "missing.json")), "cannot read AT2 head weights"),
        (lambda: lm.explain(DOC, "hierarchical", coarse="at2"), "no learned head weights"),
    ]
    for call, words in cases:
        with pytest.raises(heedful.HeedfulError) as info:
            call()
        assert words in info.value.message and "\n" not in info.value.message and info.value.hint, words
