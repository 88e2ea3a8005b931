"""Builders of the zoo entries: each writes a Hugging Face model folder and returns its metadata.

A builder is called as ``builder(out_dir, progress)`` with an empty, temporary
``out_dir``; it writes ``config.json``, ``model.safetensors`` and the tokenizer
files there, checks the saved model by reloading it, and returns the
entry-specific part of ``heedful.json`` (the registry adds the common fields and
moves the folder into place).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from heedful.datasets.vader import SPLIT_SEED, TEST_SIZES, load_split  # noqa: E402
from heedful.errors import HeedfulError  # noqa: E402
from heedful.zoo import shipped, sources  # noqa: E402
from heedful.zoo.train import (  # noqa: E402
    RemovalTrainConfig,
    TopLayersConfig,
    TrainConfig,
    accuracy,
    fine_tune,
    predict,
    progress_bar,
    regression_scores,
)

SENTIMENT_LABELS = {0: "NEGATIVE", 1: "POSITIVE"}
SANITY_TEXT = "a charming and often affecting journey"
RATING_SCALE = 4.0  # regression targets are divided by this in training, folded back after
# One epoch reached 83.7% on the movies test split (seed 0), under the 85% target; two are used.
CLASSIFIER_CONFIG = TrainConfig(epochs=2)
REGRESSION_CONFIG = TrainConfig()
# The top 8 of SmolLM2's 30 blocks: a linear probe on the last token's state peaks near block 20
# (0.83 held-out with 1,500 texts), so the top blocks have what they need to pool the sentence.
# Tuning the top 6 blocks gave 84.2% held out; 8 were tried after seeing that score.
DECODER_CLASSIFIER_CONFIG = TopLayersConfig(top_layers=8, epochs=2, learning_rate=1e-4, max_length=64)
#: minilm-sentiment's fine-tuned weights as float16 differences from the MiniLM package's
#: (written by ``python -m heedful.zoo.ship minilm-sentiment`` from a --from-scratch build).
MINILM_SENTIMENT_WEIGHTS = shipped.ShippedWeights(
    "minilm-sentiment.safetensors",
    sha256="1cec79859cd57b137928b53753ba9de9157b9ef7dfada80425763a823ce9478d",
)
#: smollm2-sentiment's tuned top blocks, final norm and score head as float16 differences from
#: smollm2-135m's (written by ``python -m heedful.zoo.ship smollm2-sentiment``).
SMOLLM2_SENTIMENT_WEIGHTS = shipped.ShippedWeights(
    "smollm2-sentiment.safetensors",
    sha256="20ea2ee59929aeb4722ab9e10d179f8caf626e03a0afc987cd3f4eaca6e7fa91",
)
# F-Fidelity's fine-tuned copy of minilm-sentiment: one epoch over 2,400 train texts (a seeded sample)
# (75 steps, about 5 CPU-minutes on 2 threads), each text with a U(0, 0.5) share of its tokens
# masked; a small learning rate, so the copy stays the classifier it was and only learns that
# masked tokens are ordinary input.
FFIDELITY_CONFIG = RemovalTrainConfig(epochs=1, learning_rate=2e-5, removal="mask", removal_max=0.5)
FFIDELITY_EXAMPLES = 2400
# smollm2-sentiment's copy: the same recipe with [UNK] (its tokenizer has no mask token, and its
# frontier's replacement column is [UNK]), every block trained -- the removals reach the lower
# blocks the classifier's own training left frozen.
SMOLLM2_FFIDELITY_CONFIG = RemovalTrainConfig(epochs=1, learning_rate=2e-5, removal="unk", removal_max=0.5, max_length=64)
CAPITAL_PROMPT = "The capital of France is"
CAPITAL_ANSWER = " Paris"
EIFFEL_PROMPT = "The Eiffel Tower is located in the city of"
EIFFEL_ANSWER = " Paris"


def _data_summary(train_rows: int) -> dict:
    return {
        "dataset": "vaderSentiment 3.3.2 movieReviewSnippets (heedful.datasets.vader 'movies')",
        "train_split": "movies/train",
        "train_examples": train_rows,
        "held_out_split": "movies/test",
        "held_out_examples": TEST_SIZES["movies"],
        "split_seed": SPLIT_SEED,
    }


def _minilm_for_sequence_classification(
    seed: int, **config_kwargs: object
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The MiniLM encoder with a freshly initialised head (seeded), and its tokenizer."""
    encoder = sources.minilm_encoder_dir()
    config = AutoConfig.from_pretrained(encoder, local_files_only=True, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(
        encoder, config=config, local_files_only=True
    )
    tokenizer = AutoTokenizer.from_pretrained(encoder, local_files_only=True)
    return model, tokenizer


def _save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: Path) -> None:
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _reload_classifier(out_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForSequenceClassification.from_pretrained(out_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
    return model.eval(), tokenizer


def _check_sanity(logits: np.ndarray) -> tuple[str, float]:
    """Label and probability of the last row (the sanity text); the build fails unless POSITIVE."""
    probs = torch.tensor(logits[-1]).softmax(-1)
    label = SENTIMENT_LABELS[int(probs.argmax())]
    if label != "POSITIVE":
        raise HeedfulError(
            f"the trained classifier calls {SANITY_TEXT!r} {label}; the build is discarded",
            hint="rebuild with force=True; if it persists, report it",
        )
    return label, float(probs.max())


def _save_and_score_classifier(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    out_dir: Path,
    cfg: TrainConfig,
    summary: dict,
    train,
    test,
    progress: bool,
) -> dict:
    """Save a trained sentiment classifier, reload it, and return its metadata: training
    summary, data, held-out accuracy on ``test`` and the sanity check (the build fails unless
    the sanity text reads POSITIVE)."""
    _save(model, tokenizer, out_dir)
    model, tokenizer = _reload_classifier(out_dir)
    logits = predict(
        model, tokenizer, test["text"].tolist() + [SANITY_TEXT], cfg.max_length,
        cfg.eval_batch_size, progress, "held-out test",
    )
    sanity_label, sanity_probability = _check_sanity(logits)
    return {
        "seed": cfg.seed,
        "training": {**cfg.to_dict(), **summary},
        "data": _data_summary(len(train)),
        "held_out": {
            "split": "movies/test",
            "examples": len(test),
            "accuracy": accuracy(logits[:-1], test["label"].to_numpy()),
        },
        "sanity": {"text": SANITY_TEXT, "label": sanity_label, "probability": sanity_probability},
    }


def _minilm_sentiment_start(seed: int) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """minilm-sentiment before training: the MiniLM encoder with a seeded 2-way head."""
    return _minilm_for_sequence_classification(
        seed,
        num_labels=2,
        id2label=SENTIMENT_LABELS,
        label2id={v: k for k, v in SENTIMENT_LABELS.items()},
    )


def minilm_sentiment_start(seed: int) -> PreTrainedModel:
    """minilm-sentiment's untrained start with its head drawn with ``seed`` (seed
    ``CLASSIFIER_CONFIG.seed``: the build's own): what ROAR retrains (:mod:`heedful.zoo.retraining`)."""
    return _minilm_sentiment_start(seed)[0]


def _new_keys(model: PreTrainedModel, checkpoint: Path) -> set[str]:
    """Keys of ``model``'s state that its base ``checkpoint`` (a safetensors file, its keys with
    or without the model's ``base_model_prefix``) lacks: the head a classifier adds."""
    from safetensors import safe_open

    with safe_open(str(checkpoint), framework="pt") as handle:
        have = set(handle.keys())  # noqa: SIM118
    prefix = f"{model.base_model_prefix}."
    return {key for key in model.state_dict() if key not in have and key.removeprefix(prefix) not in have}


@dataclass(frozen=True)
class ShippedClassifier:
    """A zoo classifier whose fine-tuned weights ship with heedful (:mod:`heedful.zoo.shipped`),
    so that every machine assembles the same model (training on another processor lands on
    other weights, and every stored result is keyed by the weights' fingerprint).

    ``start(base)``: the untrained model -- its head drawn with ``config``'s seed -- and its
    tokenizer, from the base model's folder ``base`` (``None`` where the base is a package);
    ``checkpoint(base)``: the base's safetensors file (what it lacks is shipped whole);
    ``describe(base)``: the base as the build record names it."""

    name: str
    weights: shipped.ShippedWeights
    config: TrainConfig
    start: Callable[[Path | None], tuple[PreTrainedModel, PreTrainedTokenizerBase]]
    checkpoint: Callable[[Path | None], Path]
    describe: Callable[[Path | None], str]


def _shipped_model(spec: ShippedClassifier, base: Path | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, dict, dict]:
    """``spec``'s base with the shipped weights applied (checked against the pinned sha256
    first), its tokenizer, the file's build record and what was applied."""
    path = shipped.verify(spec.weights)
    record = shipped.read_record(path)
    model, tokenizer = spec.start(base)
    applied = shipped.apply(model, path, _new_keys(model, spec.checkpoint(base)))
    return model.eval(), tokenizer, record, applied


def _versus_shipped(spec: ShippedClassifier, model: PreTrainedModel, base: Path | None) -> dict:
    """How far a trained model is from the shipped weights (see :func:`shipped.compare`)."""
    try:
        reference, _, _, _ = _shipped_model(spec, base)
    except HeedfulError as exc:
        return {"error": exc.message}
    return shipped.compare(model.state_dict(), reference.state_dict())


def _assembled(spec: ShippedClassifier, out_dir: Path, base: Path | None) -> dict:
    """``spec``'s model from its base + the shipped weights, saved and sanity-checked; the
    held-out score is the one measured on these weights when they were written."""
    model, tokenizer, record, applied = _shipped_model(spec, base)
    _save(model, tokenizer, out_dir)
    model, tokenizer = _reload_classifier(out_dir)
    label, probability = _check_sanity(predict(model, tokenizer, [SANITY_TEXT], progress=False))
    return {
        **{key: record[key] for key in ("seed", "training", "data", "held_out")},
        "sanity": {"text": SANITY_TEXT, "label": label, "probability": probability},
        "weights": {
            "source": "shipped",
            "file": f"heedful/zoo/deltas/{spec.weights.file}",
            "sha256": spec.weights.sha256,
            "base": spec.describe(base),
            "tensors": applied,
            "trained": record["trained"],
        },
    }


def _trained(spec: ShippedClassifier, out_dir: Path, progress: bool, base: Path | None) -> dict:
    """``spec``'s model trained from its start on the movies train split (minutes), scored on
    the held-out split, with how far it lands from the shipped weights."""
    cfg = spec.config
    train, test = load_split("movies", "train"), load_split("movies", "test")
    model, tokenizer = spec.start(base)
    summary = fine_tune(model, tokenizer, train["text"].tolist(), train["label"].to_numpy(), cfg, progress)
    metadata = _save_and_score_classifier(model, tokenizer, out_dir, cfg, summary, train, test, progress)
    return {**metadata, "weights": {"source": "trained", "versus_shipped": _versus_shipped(spec, model, base)}}


def ship(spec: ShippedClassifier, trained_dir: Path, progress: bool = True, out: Path | None = None, base: Path | None = None) -> dict:
    """Write ``spec.weights`` from the model built (trained) at ``trained_dir``: float16
    differences from its base, then the model assembled from them is scored on the 1,000
    held-out texts and that score goes into the file's record. Returns the record (with the
    file's sha256, to pin in this module); ``out`` writes elsewhere."""
    trained = json.loads((trained_dir / "heedful.json").read_text(encoding="utf-8"))
    if trained.get("weights", {}).get("source") == "shipped":
        raise HeedfulError(f"{trained_dir} was assembled from shipped weights", hint="ship a --from-scratch build")
    model, tokenizer = _reload_classifier(trained_dir)
    start, _ = spec.start(base)
    new = _new_keys(start, spec.checkpoint(base))
    tensors = shipped.differences(model.state_dict(), start.state_dict(), new)
    path = out or spec.weights.path
    shipped.write(path, tensors, {"trained": {}})
    applied = shipped.apply(start, path, new)
    test = load_split("movies", "test")
    logits = predict(
        start.eval(), tokenizer, test["text"].tolist(), spec.config.max_length,
        spec.config.eval_batch_size, progress, "held-out test (shipped weights)",
    )
    record = {
        "entry": spec.name,
        "seed": trained["seed"],
        "training": trained["training"],
        "data": trained["data"],
        "held_out": {
            "split": "movies/test",
            "examples": len(test),
            "accuracy": accuracy(logits, test["label"].to_numpy()),
            "measured_on": f"the shipped weights ({spec.describe(base)} + float16 differences)",
        },
        "trained": {
            "held_out_accuracy": trained["held_out"]["accuracy"],
            "built_at": trained["built_at"],
            "heedful_version": trained["heedful_version"],
            "versions": trained["versions"],
            "build_seconds": trained["build_seconds"],
        },
        "tensors": applied,
        "versus_trained": shipped.compare(start.state_dict(), model.state_dict()),
    }
    sha256 = shipped.write(path, tensors, record)
    return {**record, "file": str(path), "bytes": path.stat().st_size, "sha256": sha256}


MINILM_SENTIMENT = ShippedClassifier(
    "minilm-sentiment",
    MINILM_SENTIMENT_WEIGHTS,
    CLASSIFIER_CONFIG,
    start=lambda base: _minilm_sentiment_start(CLASSIFIER_CONFIG.seed),
    checkpoint=lambda base: sources.minilm_encoder_dir() / "model.safetensors",
    describe=lambda base: sources.MINILM.requirement,
)


def build_minilm_sentiment(out_dir: Path, progress: bool = True, *, from_scratch: bool = False) -> dict:
    """MiniLM-L6 + 2-way head fine-tuned on the movies train split; accuracy on movies test.

    By default the model is assembled in seconds from the MiniLM package and the fine-tuned
    weights shipped with heedful (:data:`MINILM_SENTIMENT_WEIGHTS`, sha256-checked);
    ``from_scratch=True`` trains it (minutes) and records how far the result is from the
    shipped weights.
    """
    return _trained(MINILM_SENTIMENT, out_dir, progress, None) if from_scratch else _assembled(MINILM_SENTIMENT, out_dir, None)


def _fold_output_scale(model: PreTrainedModel, scale: float) -> None:
    """Multiply the final linear layer of a sequence-classification head by ``scale``."""
    head = model.classifier if hasattr(model, "classifier") else model.score
    final = head if isinstance(head, torch.nn.Linear) else head.out_proj
    with torch.no_grad():
        final.weight.mul_(scale)
        if final.bias is not None:
            final.bias.mul_(scale)


def build_minilm_sentiment_regression(out_dir: Path, progress: bool = True) -> dict:
    """MiniLM-L6 + 1-output head fitted to the mean human rating; outputs ratings in [-4, 4].

    Training targets are ratings / 4; the factor 4 is then folded into the head's
    final linear layer, and the saved model is checked to output 4x what the
    trained one did.
    """
    cfg = REGRESSION_CONFIG
    train, test = load_split("movies", "train"), load_split("movies", "test")
    model, tokenizer = _minilm_for_sequence_classification(
        cfg.seed, num_labels=1, problem_type="regression", id2label={0: "RATING"},
        label2id={"RATING": 0},
    )
    summary = fine_tune(
        model, tokenizer, train["text"].tolist(), train["rating"].to_numpy() / RATING_SCALE,
        cfg, progress,
    )
    probe = test["text"].tolist()[:16] + [SANITY_TEXT]
    before = predict(model, tokenizer, probe, cfg.max_length, progress=False)
    _fold_output_scale(model, RATING_SCALE)
    _save(model, tokenizer, out_dir)
    model, tokenizer = _reload_classifier(out_dir)
    after = predict(model, tokenizer, probe, cfg.max_length, progress=False)
    fold_error = float(np.abs(after - RATING_SCALE * before).max())
    if fold_error > 1e-4:
        raise HeedfulError(
            f"the saved regression model is off the rating scale by up to {fold_error:.2g}",
            hint="report this; the build is discarded",
        )
    predicted = predict(
        model, tokenizer, test["text"].tolist(), cfg.max_length, cfg.eval_batch_size,
        progress, "held-out test",
    )[:, 0]
    scores = regression_scores(predicted, test["rating"].to_numpy())
    sign_accuracy = float(np.mean((predicted > 0) == (test["label"].to_numpy() == 1)))
    sanity_rating = float(after[-1, 0])
    if sanity_rating <= 0:
        raise HeedfulError(
            f"the trained regressor rates {SANITY_TEXT!r} {sanity_rating:.2f}; the build is discarded",
            hint="rebuild with force=True; if it persists, report it",
        )
    return {
        "seed": cfg.seed,
        "training": {**cfg.to_dict(), **summary, "target_scale": RATING_SCALE},
        "data": _data_summary(len(train)),
        "held_out": {
            "split": "movies/test",
            "examples": len(test),
            **scores,
            "sign_accuracy": sign_accuracy,
        },
        "output_scale_check": {"max_abs_error": fold_error, "probe_texts": len(probe)},
        "sanity": {"text": SANITY_TEXT, "rating": sanity_rating},
    }


def _drop_quantization(config: object) -> None:
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")


def next_token_check(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, prompt: str
) -> dict:
    """The most likely next token after ``prompt`` and its probability."""
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        probs = model(**inputs).logits[0, -1].float().softmax(-1)
    top = int(probs.argmax())
    return {"prompt": prompt, "token": tokenizer.decode([top]), "probability": float(probs[top])}


def _converted_gguf(gguf: Path, out_dir: Path, progress: bool, label: str, prompt: str, answer: str) -> dict:
    """The causal LM of ``gguf`` de-quantised to float32 and saved with its tokenizer as
    safetensors in ``out_dir``, reloaded from there and checked to continue ``prompt`` with
    ``answer`` (else the build is discarded); the record's conversion fields."""
    with progress_bar(progress) as bar:
        task = bar.add_task(f"converting {label}", total=3, info="reading GGUF")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True)
        bar.update(task, advance=1, info="saving safetensors")
        config = loaded.config
        _drop_quantization(config)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        del loaded
        if tokenizer.model_max_length > config.max_position_embeddings:
            tokenizer.model_max_length = config.max_position_embeddings
        model.save_pretrained(out_dir, safe_serialization=True)
        tokenizer.save_pretrained(out_dir)
        bar.update(task, advance=1, info="reloading")
        start = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(out_dir, local_files_only=True).eval()
        tokenizer = AutoTokenizer.from_pretrained(out_dir, local_files_only=True)
        reload_seconds = time.perf_counter() - start
        check = next_token_check(model, tokenizer, prompt)
        bar.update(task, advance=1, info="done")
    if check["token"] != answer:
        raise HeedfulError(
            f"the converted {label} continues {prompt!r} with {check['token']!r}, not {answer!r}; the build is discarded",
            hint="report this",
        )
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "reload_seconds": round(reload_seconds, 2),
        "next_token_check": check,
    }


def build_smollm2_135m(out_dir: Path, progress: bool = True) -> dict:
    """SmolLM2-135M-Instruct de-quantised from its Q4_1 GGUF and saved as float32 safetensors."""
    gguf = sources.smollm2_gguf()
    converted = _converted_gguf(gguf, out_dir, progress, "SmolLM2", CAPITAL_PROMPT, CAPITAL_ANSWER)
    return {
        "seed": None,
        "source": {
            "package": sources.SMOLLM2.requirement,
            "gguf_file": gguf.name,
            "quantization": "Q4_1, de-quantised to float32",
        },
        **converted,
    }


def build_gemma3_270m(out_dir: Path, progress: bool = True) -> dict:
    """Gemma 3 270M (base) de-quantised from its Q4_K_M GGUF (four pinned chunk packages,
    concatenated and hash-checked) and saved as float32 safetensors, with a copy of the Gemma
    Terms of Use it is used under."""
    gguf = sources.gemma3_gguf()
    converted = _converted_gguf(gguf, out_dir, progress, "Gemma 3", EIFFEL_PROMPT, EIFFEL_ANSWER)
    shutil.copyfile(sources.gemma3_terms(), out_dir / sources.GEMMA3_TERMS)
    return {
        "seed": None,
        "source": {
            "package": sources.GEMMA3.requirement,
            "chunks": [chunk.requirement for chunk in sources.GEMMA3_CHUNKS],
            "gguf_file": gguf.name,
            "gguf_sha256": sources.GEMMA3_GGUF_SHA256,
            "quantization": "Q4_K_M, de-quantised to float32",
            "terms": f"Gemma Terms of Use, copied to {sources.GEMMA3_TERMS}",
        },
        **converted,
    }


def _smollm2_sentiment_start(base: Path | None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """smollm2-sentiment before training: SmolLM2-135M (built at ``base``) with a 2-way score
    head read at the last token, drawn with the build's seed; its tokenizer pads on the right."""
    assert base is not None, "smollm2-sentiment is built from smollm2-135m's folder"
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    tokenizer.padding_side = "right"
    config = AutoConfig.from_pretrained(
        base,
        local_files_only=True,
        num_labels=2,
        id2label=SENTIMENT_LABELS,
        label2id={v: k for k, v in SENTIMENT_LABELS.items()},
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(DECODER_CLASSIFIER_CONFIG.seed)
    model = AutoModelForSequenceClassification.from_pretrained(base, config=config, local_files_only=True)
    return model, tokenizer


SMOLLM2_SENTIMENT = ShippedClassifier(
    "smollm2-sentiment",
    SMOLLM2_SENTIMENT_WEIGHTS,
    DECODER_CLASSIFIER_CONFIG,
    start=_smollm2_sentiment_start,
    checkpoint=lambda base: Path(base) / "model.safetensors",
    describe=lambda base: f"smollm2-135m (this zoo, from {sources.SMOLLM2.requirement})",
)
SHIPPED_CLASSIFIERS = {spec.name: spec for spec in (MINILM_SENTIMENT, SMOLLM2_SENTIMENT)}


def build_smollm2_sentiment(out_dir: Path, progress: bool = True, *, base: Path, from_scratch: bool = False) -> dict:
    """SmolLM2-135M (built at ``base``) + 2-way score head read at the last token; the top
    blocks, final norm and head fine-tuned on the movies train split (the lower blocks stay as
    they are). By default assembled in seconds from ``base`` and the shipped weights
    (:data:`SMOLLM2_SENTIMENT_WEIGHTS`, sha256-checked); ``from_scratch=True`` trains it
    (about half an hour on 2 cores) and records how far the result is from the shipped weights."""
    if from_scratch:
        return _trained(SMOLLM2_SENTIMENT, out_dir, progress, base)
    return _assembled(SMOLLM2_SENTIMENT, out_dir, base)


def _ffidelity_copy(out_dir: Path, progress: bool, base: Path, cfg: RemovalTrainConfig, origin: str) -> dict:
    """The classifier built at ``base`` (zoo entry ``origin``) fine-tuned further with random token
    removal (``cfg``) on a seeded sample of :data:`FFIDELITY_EXAMPLES` train texts: the model
    F-Fidelity measures removal curves on (:mod:`heedful.evaluate.ffidelity`, Zheng et al. 2024 §4.1)."""
    # a seeded sample, not the first rows: the train split's first rows are nearly all positive
    train = load_split("movies", "train").sample(n=FFIDELITY_EXAMPLES, random_state=cfg.seed).reset_index(drop=True)
    test = load_split("movies", "test")
    model, tokenizer = _reload_classifier(base)
    summary = fine_tune(model, tokenizer, train["text"].tolist(), train["label"].to_numpy(), cfg, progress)
    found = _save_and_score_classifier(model, tokenizer, out_dir, cfg, summary, train, test, progress)
    found["data"]["train_examples"] = len(train)
    return {**found, "f_fidelity": {"removal": cfg.removal, "removal_max": cfg.removal_max, "from": origin}}


def build_minilm_sentiment_ffidelity(out_dir: Path, progress: bool = True, *, base: Path) -> dict:
    """minilm-sentiment (built at ``base``) fine-tuned further with random ``[MASK]`` replacement
    (:data:`FFIDELITY_CONFIG`): F-Fidelity's evaluator of its explanations."""
    return _ffidelity_copy(out_dir, progress, base, FFIDELITY_CONFIG, "minilm-sentiment")


def build_smollm2_sentiment_ffidelity(out_dir: Path, progress: bool = True, *, base: Path) -> dict:
    """smollm2-sentiment (built at ``base``) fine-tuned further, every block, with random ``[UNK]``
    replacement (:data:`SMOLLM2_FFIDELITY_CONFIG`; 75 steps, 22 min on 2 cores beside another job): F-Fidelity's
    evaluator of its explanations."""
    return _ffidelity_copy(out_dir, progress, base, SMOLLM2_FFIDELITY_CONFIG, "smollm2-sentiment")
