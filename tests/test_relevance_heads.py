"""Mask-LRP head statistics and masks: statistics on designed attention, selection thresholds,
JSON round trip, ablations, the ``heedful heads`` command, and spaCy parsing (slow)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tiny import tiny_hf

from heedful import cli
from heedful.errors import InputError
from heedful.lrp.heads import Arc, HeadStatistics, _token_positions, head_statistics, plot_head_map
from heedful.lrp.masks import (
    RELATIONS,
    HeadMask,
    as_head_mask,
    cache_path,
    corrupted_mask,
    random_mask,
    without_positional,
    without_syntactic,
)

TEXTS = [
    "the movie was dull",
    "a charming and often affecting journey",
    "the sister of the doctors writes a letter",
    "we watched it twice and loved an intelligent , funny and moving film",
]


def _span(text: str, word: str) -> tuple[int, int]:
    start = text.index(word)
    return start, start + len(word)


def _arc(t: int, dep: str, rel: str, gov: str) -> Arc:
    return Arc(_span(TEXTS[t], dep), RELATIONS.index(rel), _span(TEXTS[t], gov))


# every relation at two different offsets, so that no fixed offset is right more than half the time
ARCS = [
    [_arc(0, "movie", "nsubj", "dull")],
    [_arc(1, "charming", "amod", "journey"), _arc(1, "often", "advmod", "affecting")],
    [_arc(2, "sister", "nsubj", "writes")],
    [_arc(3, "twice", "advmod", "watched"), _arc(3, "intelligent", "amod", "film")],
]


class DesignedHeads:
    """A one-layer stand-in whose three heads attend: the previous token, the governor of each
    dependent (else the first token), and itself. Encoding comes from a real tiny BERT adapter."""

    num_layers = 1
    config = SimpleNamespace(num_attention_heads=3)
    task = "classification"

    def __init__(self, adapter) -> None:
        self.inner = adapter

    def encode(self, texts):
        return self.inner.encode(texts)

    def anchor_positions(self, batch):
        return self.inner.anchor_positions(batch)

    def fit(self, width, need, **options):  # the memory plan of the real tiny adapter
        return self.inner.fit(width, need, **options)

    @property
    def shape(self):
        return self.inner.shape

    @property
    def max_memory(self):
        return self.inner.max_memory

    def output_name(self, index: int) -> str:
        return str(index)

    def forward(self, batch, anchor, attentions=True, **kwargs):
        bsz, seq = batch.input_ids.shape
        attn = torch.zeros(bsz, 3, seq, seq)
        rows = torch.arange(seq)
        attn[:, 0, rows, (rows - 1).clamp(min=0)] = 1.0
        attn[:, 1, rows, 0] = 1.0
        attn[:, 2, rows, rows] = 1.0
        for b, text in enumerate(batch.texts):
            for arc in ARCS[TEXTS.index(text)]:
                dep = _token_positions(batch.offsets[b], arc.span)[0]
                gov = _token_positions(batch.offsets[b], arc.governor)[0]
                attn[b, 1, dep] = 0.0
                attn[b, 1, dep, gov] = 1.0
        return SimpleNamespace(logits=torch.zeros(bsz, 2), attentions=(attn,))


@pytest.fixture()
def designed(tiny):
    return DesignedHeads(tiny("bert").adapter)


def test_statistics_of_designed_heads(designed):
    stats = head_statistics(designed, TEXTS, arcs=ARCS, max_offset=8)
    assert stats.texts == 4
    assert list(stats.totals) == [2, 0, 2, 2]  # nsubj, obj, amod, advmod
    acc = stats.accuracy[0]
    assert acc[1].tolist() == [1.0, 0.0, 1.0, 1.0]  # the governor head
    assert acc[2].tolist() == [0.0, 0.0, 0.0, 0.0]  # the self head
    # fixed-offset baseline: each relation's two arcs have different offsets
    assert stats.baseline.max(axis=1).tolist() == [0.5, 0.0, 0.5, 0.5]
    lengths = [len(designed.encode([t]).tokens[0]) for t in TEXTS]
    assert stats.queries == sum(lengths)
    freq = stats.positional_frequency[0]
    zero = stats.max_offset
    assert freq[2, zero] == pytest.approx(1.0)
    assert freq[0, zero - 1] == pytest.approx((sum(lengths) - len(TEXTS)) / sum(lengths))
    sums = freq.sum(axis=-1)  # offsets beyond max_offset (head 1 -> first token) are not counted
    assert sums[[0, 2]] == pytest.approx([1.0, 1.0]) and sums[1] < 1


def test_selection_follows_equations_7_and_8(designed):
    stats = head_statistics(designed, TEXTS, arcs=ARCS, max_offset=8)
    mask = stats.select(xi_synt=0.1, xi_pos=0.8)
    assert mask.syntactic[0, 1].tolist() == [True, False, True, True]
    assert mask.positional[0].tolist() == [True, False, True]  # previous-token head, self head
    assert mask.mask[0].tolist() == [True, True, True]
    no_self = stats.select(xi_synt=0.1, xi_pos=0.8, include_self=False)
    assert no_self.positional[0].tolist() == [True, False, False]
    strict = stats.select(xi_synt=0.1, xi_pos=1.0)
    assert not strict.positional.any()
    thresholds = stats.thresholds(0.1)
    assert thresholds[0] == pytest.approx(stats.baseline[0].max() + 0.1)


def test_mask_json_round_trip_and_statistics_reselection(designed, tmp_path):
    stats = head_statistics(designed, TEXTS, arcs=ARCS, max_offset=8, meta={"model": "designed", "dataset": "toy"})
    mask = stats.select()
    path = mask.save(tmp_path / "m.json")
    data = json.loads(path.read_text())
    assert data["format"] == "heedful-head-mask/1" and data["rate"] == mask.rate and data["model"] == "designed"
    back = HeadMask.load(path)
    assert (back.mask == mask.mask).all() and (back.syntactic == mask.syntactic).all()
    again = HeadStatistics.from_dict(back.statistics, back.meta).select(xi_pos=1.0)
    assert again.positional.sum() == 0 and again.meta["dataset"] == "toy"


def test_ablations_keep_their_promises():
    rng = np.random.default_rng(0)
    synt = rng.random((6, 12, 4)) < 0.05
    pos = rng.random((6, 12)) < 0.1
    mask = HeadMask(synt.any(-1) | pos, synt, pos, {"model": "m"})
    for seed in range(3):
        random = random_mask(mask, seed)
        assert random.mask.sum() == mask.mask.sum()
        assert (random.mask == random_mask(mask, seed).mask).all()
    assert not (random_mask(mask, 0).mask == random_mask(mask, 1).mask).all()
    off = (~mask.mask).sum()
    for rate in (0.0, 0.1, 0.5, 1.0):
        corrupted = corrupted_mask(mask, rate, seed=1)
        assert (corrupted.mask >= mask.mask).all()
        assert corrupted.mask.sum() - mask.mask.sum() == round(rate * off)
    assert corrupted_mask(mask, 1.0).mask.all()
    assert (without_positional(mask).mask == synt.any(-1)).all()
    assert (without_syntactic(mask).mask == pos).all()
    with pytest.raises(InputError):
        corrupted_mask(mask, 1.5)


def test_mask_inputs_and_cache_path(tmp_path, monkeypatch, tiny):
    assert as_head_mask(torch.ones(2, 3)).mask.all()
    with pytest.raises(InputError, match="layers, heads"):
        as_head_mask([1, 0, 1])
    with pytest.raises(InputError, match="not a heedful head-mask"):
        (tmp_path / "x.json").write_text("{}")
        HeadMask.load(tmp_path / "x.json")
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    path = cache_path(tiny("bert"))  # keyed by the model's fingerprint and the data settings
    assert path.parent == tmp_path / "head_masks" and path.name.startswith("tiny-bert-classification-")
    assert cache_path(tiny("bert").adapter) == path and cache_path(tiny("bert"), split="test") != path
    with pytest.raises(TypeError, match="fingerprint"):
        cache_path("/some/dir/model")


def test_head_map_png(designed, tmp_path):
    mask = head_statistics(designed, TEXTS, arcs=ARCS).select()
    picture = plot_head_map(mask, tmp_path / "map.png")
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------- the command
@dataclass
class _Token:
    text: str
    idx: int
    i: int
    dep_: str = "ROOT"
    head: _Token | None = None
    like_num: bool = False

    def __len__(self) -> int:
        return len(self.text)


class _ChainParser:
    """Stands in for spaCy: every word is an ``amod`` of the next, the last is the root."""

    def pipe(self, texts, batch_size=256):
        for text in texts:
            tokens, start = [], 0
            for i, word in enumerate(text.split()):
                start = text.index(word, start)
                tokens.append(_Token(word, start, i))
                start += len(word)
            for tok, nxt in zip(tokens, tokens[1:], strict=False):
                tok.dep_, tok.head = "amod", nxt
            tokens[-1].head = tokens[-1]
            yield tokens


def test_heads_command_writes_mask_and_map(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path / "home"))
    hf_model, tokenizer = tiny_hf("bert", "classification")
    folder = tmp_path / "model"
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "texts.csv"
    data.write_text("text\n" + "\n".join(["the movie was dull", "a charming and often affecting journey"] * 3) + "\n")
    monkeypatch.setattr("heedful.lrp.heads.load_parser", lambda: _ChainParser())
    out = tmp_path / "mask.json"
    monkeypatch.setattr(sys, "argv", ["heedful", "heads", "--model", str(folder), "--dataset", str(data), "--out", str(out)])
    try:
        cli.main()
    except SystemExit as exc:
        assert not exc.code
    printed = capsys.readouterr().out
    assert "mask rate" in printed and "amod" in printed
    mask = HeadMask.load(out)
    assert mask.shape == (2, 4)
    # chain arcs: "the movie was" and "charming and often affecting" ("a" is one character)
    assert mask.statistics["relation_counts"]["amod"] == 7 * 3
    assert out.with_suffix(".png").is_file()
    assert len(list((tmp_path / "home" / "head_masks" / "parses").glob("*.json"))) == 1  # parses are cached


def test_heads_command_rejects_bad_threshold(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(sys, "argv", ["heedful", "heads", "--model", str(tmp_path), "--xi-pos", "1.5"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2
    assert "xi-pos" in capsys.readouterr().err


@pytest.mark.slow
def test_spacy_arcs_on_a_real_sentence():
    """The pinned parser (fetched and checked on first use) finds the four relations."""
    from heedful.lrp.heads import load_parser, parse_arcs

    text = "The old car quickly passed the slow truck."
    (arcs,) = parse_arcs(load_parser(), [text])
    found = {(text[a.span[0] : a.span[1]], RELATIONS[a.relation], text[a.governor[0] : a.governor[1]]) for a in arcs}
    assert ("car", "nsubj", "passed") in found
    assert ("truck", "obj", "passed") in found
    assert ("old", "amod", "car") in found
    assert ("quickly", "advmod", "passed") in found
