"""A small, deterministic fine-tuning loop for Hugging Face sequence models.

It works for any ``*ForSequenceClassification`` model whose forward pass
returns a loss when given ``labels`` (classification with integer labels, or
regression with float targets and ``problem_type="regression"``), encoder or
decoder. Batches are padded to their own longest text (no sorting by length);
the data order comes from a seeded ``torch.randperm`` and training runs on a
fixed number of torch threads (the float-summation order of the kernels depends
on it, and over hundreds of steps a different order lands about 1 % away), so
the same seed, data and software give the same model on any machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from rich.progress import Progress
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_linear_schedule_with_warmup

from heedful.engine.perturb import remove_tokens
from heedful.render.progress import progress_bar as render_progress
from heedful.threads import torch_threads

if TYPE_CHECKING:
    from heedful.evaluate.roar import Retrainer


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning settings (stored with every model built from them)."""

    max_length: int = 64
    batch_size: int = 32
    learning_rate: float = 1e-4
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    epochs: int = 1
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_batch_size: int = 128
    threads: int = 2
    """torch threads while training (restored after): part of what decides the weights. The
    shipped minilm-sentiment weights were trained on 2; retraining on 1 landed 0.9 % away (the
    relative norm of the difference, largest tensor) with the same held-out accuracy."""

    def to_dict(self) -> dict:
        return asdict(self)


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[Progress]:
    """A rich progress display on stderr (silent when ``enabled`` is false)."""
    progress = render_progress(transient=False, remaining=True, info=True, enabled=enabled)
    with progress:
        yield progress


def _step(loss: torch.Tensor, parameters, optimizer, scheduler, max_grad_norm: float) -> float:
    """One optimiser step on ``loss`` (gradients clipped to ``max_grad_norm``); the loss value."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(parameters, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def encode(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int
) -> dict[str, torch.Tensor]:
    """Tokenize a batch, truncated to ``max_length`` and padded to its longest text."""
    return tokenizer(
        list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt"
    )


def batch_order(n_examples: int, epochs: int, seed: int) -> list[torch.Tensor]:
    """One seeded permutation of the example indices per epoch."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randperm(n_examples, generator=generator) for _ in range(epochs)]


def _targets_tensor(targets: Sequence[float] | np.ndarray, regression: bool) -> torch.Tensor:
    values = np.asarray(targets)
    return torch.tensor(values, dtype=torch.float32 if regression else torch.long)


def fine_tune(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    targets: Sequence[float] | np.ndarray,
    config: TrainConfig,
    progress: bool = True,
    description: str = "training",
) -> dict:
    """Fine-tune ``model`` in place on (text, target) pairs; return a summary.

    Uses AdamW with a linear warm-up over ``warmup_ratio`` of the steps and a
    linear decay to zero after it. ``targets`` are class indices, or floats
    when ``model.config.problem_type == "regression"``. The seed is applied to
    the data order here; seed the model's own initialisation before building it.
    A :class:`TopLayersConfig` trains only the top blocks of a decoder classifier
    (see :func:`_fine_tune_top_layers`).
    """
    with progress_bar(progress) as bar, torch_threads(config.threads):
        if isinstance(config, RemovalTrainConfig):
            return _fine_tune_with_removal(model, tokenizer, texts, targets, config, bar)
        if isinstance(config, TopLayersConfig):
            return _fine_tune_top_layers(model, tokenizer, texts, targets, config, bar)
        return _fine_tune_all(model, tokenizer, texts, targets, config, bar, description)


def _fine_tune_all(model, tokenizer, texts, targets, config: TrainConfig, bar: Progress, description: str) -> dict:
    """Every parameter of ``model`` trained on the whole forward pass."""
    regression = model.config.problem_type == "regression"
    labels = _targets_tensor(targets, regression)
    if len(labels) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(labels)} targets")

    def batch_loss(rows: list[int]) -> torch.Tensor:
        inputs = encode(tokenizer, [texts[i] for i in rows], config.max_length)
        return model(**inputs, labels=labels[rows]).loss

    return _fit_all(model, config, len(texts), batch_loss, bar, description)


def _fit_all(
    model: PreTrainedModel, config: TrainConfig, n_examples: int, batch_loss: Callable[[list[int]], torch.Tensor], bar: Progress, description: str
) -> dict:
    """Every parameter of ``model`` trained by :func:`_train` on ``batch_loss`` (train mode while
    it runs, eval mode after); the run's :func:`_summary`."""
    start = time.perf_counter()
    model.train()
    losses = _train(config, n_examples, list(model.parameters()), batch_loss, bar, description)
    model.eval()
    return _summary(config, n_examples, losses, start)


def _train(
    config: TrainConfig,
    n_examples: int,
    parameters: list[torch.nn.Parameter],
    batch_loss: Callable[[list[int]], torch.Tensor],
    bar: Progress,
    description: str,
) -> list[float]:
    """Seeded AdamW steps on ``batch_loss(rows)`` over ``config.epochs`` shuffled passes of
    ``config.batch_size`` rows, with linear warm-up and decay; the loss of every step."""
    torch.manual_seed(config.seed)
    orders = batch_order(n_examples, config.epochs, config.seed)
    total_steps = _steps_per_epoch(config, n_examples) * config.epochs
    optimizer = torch.optim.AdamW(parameters, lr=config.learning_rate, weight_decay=config.weight_decay)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(config.warmup_ratio * total_steps), total_steps)
    losses: list[float] = []
    task = bar.add_task(description, total=total_steps, info="")
    for order in orders:
        for first in range(0, len(order), config.batch_size):
            rows = order[first : first + config.batch_size].tolist()
            losses.append(_step(batch_loss(rows), parameters, optimizer, scheduler, config.max_grad_norm))
            bar.update(task, advance=1, info=f"loss {np.mean(losses[-50:]):.3f}")
    return losses


def _steps_per_epoch(config: TrainConfig, n_examples: int) -> int:
    return math.ceil(n_examples / config.batch_size)


def _summary(config: TrainConfig, n_examples: int, losses: list[float], start: float, **extra: object) -> dict:
    """What a training run reports: its size, first loss, mean loss over its last tenth of an
    epoch, and its duration."""
    tail = losses[-max(1, _steps_per_epoch(config, n_examples) // 10) :]
    return {
        "examples": n_examples,
        **extra,
        "steps": len(losses),
        "first_loss": losses[0],
        "final_loss": float(np.mean(tail)),
        "seconds": round(time.perf_counter() - start, 1),
    }


@torch.no_grad()
def predict(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    max_length: int = 64,
    batch_size: int = 128,
    progress: bool = True,
    description: str = "evaluating",
) -> np.ndarray:
    """Logits (or regression outputs) of ``model`` for ``texts``, shape [n, num_labels]."""
    texts = list(texts)
    return _predict_batches(
        model, len(texts), lambda rows: encode(tokenizer, [texts[i] for i in rows], max_length), batch_size, progress, description
    )


@torch.no_grad()
def _predict_batches(
    model: PreTrainedModel,
    n_examples: int,
    inputs_of: Callable[[list[int]], Mapping[str, torch.Tensor]],
    batch_size: int,
    progress: bool | Progress,
    description: str,
) -> np.ndarray:
    """Logits ``[n, num_labels]`` of ``model`` (eval mode) on ``inputs_of(rows)`` for consecutive
    rows, ``batch_size`` at a time."""
    model.eval()
    outputs: list[np.ndarray] = []
    with _shown(progress) as bar:
        task = bar.add_task(description, total=n_examples, info="")
        for first in range(0, n_examples, batch_size):
            rows = list(range(first, min(first + batch_size, n_examples)))
            outputs.append(model(**inputs_of(rows)).logits.float().numpy())
            bar.update(task, advance=len(rows))
    return np.concatenate(outputs, axis=0)


def accuracy(logits: np.ndarray, labels: Sequence[int] | np.ndarray) -> float:
    """Share of rows whose arg-max class equals the label."""
    return float(np.mean(logits.argmax(axis=-1) == np.asarray(labels)))


def regression_scores(predicted: np.ndarray, truth: Sequence[float] | np.ndarray) -> dict:
    """Pearson r and mean squared error of predictions against the truth."""
    pred = np.asarray(predicted, dtype=np.float64).reshape(-1)
    true = np.asarray(truth, dtype=np.float64).reshape(-1)
    return {
        "pearson_r": float(np.corrcoef(pred, true)[0, 1]),
        "mse": float(np.mean((pred - true) ** 2)),
    }


@dataclass(frozen=True)
class TopLayersConfig(TrainConfig):
    """Settings of :func:`fine_tune` that train the top layers only: ``top_layers`` blocks (and the final norm and
    score head) are trained; the blocks below stay frozen and run once per text."""

    top_layers: int = 4
    cache_batch_size: int = 64


def _run_blocks(backbone: torch.nn.Module, blocks: list[torch.nn.Module], final_norm: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    """Hidden states ``[B, T, D]`` of a decoder backbone restricted to ``blocks`` and ``final_norm``.

    The backbone's own forward builds the causal/padding mask and rotary positions; only its
    block list and final norm are swapped for the call (and restored after).
    """
    saved_layers, saved_norm = backbone.layers, backbone.norm
    backbone.layers, backbone.norm = torch.nn.ModuleList(blocks), final_norm
    try:
        return backbone(**inputs).last_hidden_state
    finally:
        backbone.layers, backbone.norm = saved_layers, saved_norm


@torch.no_grad()
def _frozen_states(
    backbone: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    n_frozen: int,
    config: TopLayersConfig,
    bar: Progress,
) -> list[torch.Tensor]:
    """Per text, the ``[T_i, D]`` hidden states after the first ``n_frozen`` blocks.

    Texts are run in length-sorted batches so that little padding is computed; right padding
    keeps every text's positions at 0..T_i-1, as in the later training passes.
    """
    encoded = tokenizer(list(texts), truncation=True, max_length=config.max_length)["input_ids"]
    order = sorted(range(len(texts)), key=lambda i: len(encoded[i]))
    states: list[torch.Tensor | None] = [None] * len(texts)
    blocks = list(backbone.layers[:n_frozen])
    task = bar.add_task("frozen blocks", total=len(texts), info=f"{n_frozen} blocks")
    for first in range(0, len(order), config.cache_batch_size):
        rows = order[first : first + config.cache_batch_size]
        inputs = tokenizer.pad({"input_ids": [encoded[i] for i in rows]}, return_tensors="pt")
        hidden = _run_blocks(backbone, blocks, torch.nn.Identity(), **inputs)
        for row, i in enumerate(rows):
            states[i] = hidden[row, : len(encoded[i])].clone()
        bar.update(task, advance=len(rows))
    return states  # type: ignore[return-value]


def _pad_states(states: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``[B, T, D]`` states, ``[B, T]`` attention mask and ``[B]`` last positions."""
    lengths = torch.tensor([len(s) for s in states])
    padded = torch.nn.utils.rnn.pad_sequence(states, batch_first=True)
    mask = (torch.arange(padded.shape[1])[None, :] < lengths[:, None]).long()
    return padded, mask, lengths - 1


def _fine_tune_top_layers(model, tokenizer, texts, labels, config: TopLayersConfig, bar: Progress) -> dict:
    """Fine-tune the top ``config.top_layers`` blocks, final norm and score head of a
    Llama-style ``*ForSequenceClassification`` decoder (``model.model.layers``,
    ``model.model.norm``, ``model.score``), in place.

    The frozen blocks run once per text (their outputs are cached), so an epoch costs
    ``top_layers / n_layers`` of a full forward and backward. The classification logit is the
    score head at each text's last token, as the model computes it at inference. AdamW with
    linear warm-up and decay; seeded data order.
    """
    backbone = model.model
    n_frozen = len(backbone.layers) - config.top_layers
    if not 0 < config.top_layers <= len(backbone.layers):
        raise ValueError(f"top_layers must be in 1..{len(backbone.layers)}, got {config.top_layers}")
    targets = torch.tensor(np.array(labels), dtype=torch.long)
    top = list(backbone.layers[n_frozen:])
    trainable = [p for block in top for p in block.parameters()]
    trainable += list(backbone.norm.parameters()) + list(model.score.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in trainable:
        p.requires_grad_(True)
    start = time.perf_counter()
    model.eval()
    states = _frozen_states(backbone, tokenizer, texts, n_frozen, config, bar)
    cache_seconds = time.perf_counter() - start

    def batch_loss(rows: list[int]) -> torch.Tensor:
        padded, mask, last = _pad_states([states[i] for i in rows])
        hidden = _run_blocks(backbone, top, backbone.norm, inputs_embeds=padded, attention_mask=mask)
        logits = model.score(hidden[torch.arange(len(rows)), last])
        return torch.nn.functional.cross_entropy(logits.float(), targets[rows])

    model.train()
    losses = _train(config, len(texts), trainable, batch_loss, bar, "training top blocks")
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    return _summary(
        config,
        len(texts),
        losses,
        start,
        trained_blocks=f"{n_frozen}..{len(backbone.layers) - 1}",
        frozen_pass_seconds=round(cache_seconds, 1),
    )


@dataclass(frozen=True)
class RemovalTrainConfig(TrainConfig):
    """Settings of :func:`fine_tune` that train on texts with random tokens removed (F-Fidelity's
    explanation-agnostic fine-tuning, Zheng et al. 2024 §4.1): each text of each batch loses a
    ``U(0, removal_max)`` share of its content tokens, drawn uniformly, removed by ``removal``
    (``"mask"``, ``"unk"`` or ``"delete"``) as an evaluation removes them."""

    removal: str = "mask"
    removal_max: float = 0.5


def removal_token(tokenizer: PreTrainedTokenizerBase, removal: str) -> int | None:
    """The id that replaces a removed token under ``removal`` (``None``: deleted)."""
    if removal == "delete":
        return None
    token = {"mask": tokenizer.mask_token_id, "unk": tokenizer.unk_token_id}.get(removal)
    if token is None:
        raise ValueError(f"removal {removal!r}: this tokenizer has no such token (use mask, unk or delete)")
    return int(token)


def randomly_removed(
    inputs: dict[str, torch.Tensor], special: torch.Tensor, removal_max: float, replacement: int | None, pad_id: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """``inputs`` (``input_ids``, ``attention_mask``, optional ``token_type_ids`` ``[B, N]``) with
    a ``U(0, removal_max)`` share of each row's content tokens (real, not ``special``) removed:
    the ``floor(share * n)`` with the smallest uniform keys."""
    content = inputs["attention_mask"].bool() & ~special.bool()
    share = torch.rand(content.shape[0], generator=generator) * removal_max  # [B]
    count = torch.floor(share * content.sum(dim=1)).long()
    keys = torch.where(content, torch.rand(content.shape, generator=generator), torch.full(content.shape, 2.0))
    rank = keys.argsort(dim=1, stable=True).argsort(dim=1)
    remove = content & (rank < count[:, None])
    anchor = torch.zeros(content.shape[0], dtype=torch.long)
    out = remove_tokens(inputs["input_ids"], inputs["attention_mask"], remove, anchor, "first", replacement, pad_id, inputs.get("token_type_ids"))
    found = {"input_ids": out.input_ids, "attention_mask": out.attention_mask}
    if out.token_type_ids is not None:
        found["token_type_ids"] = out.token_type_ids
    return found


def _fine_tune_with_removal(model, tokenizer, texts, targets, config: RemovalTrainConfig, bar: Progress) -> dict:
    """Every parameter trained, as :func:`_fine_tune_all`, on batches with random tokens removed
    (:func:`randomly_removed`; the removals drawn from a generator seeded with ``config.seed``)."""
    labels = _targets_tensor(targets, model.config.problem_type == "regression")
    replacement = removal_token(tokenizer, config.removal)
    generator = torch.Generator().manual_seed(config.seed)

    def batch_loss(rows: list[int]) -> torch.Tensor:
        enc = tokenizer([texts[i] for i in rows], padding=True, truncation=True, max_length=config.max_length,
                        return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask")
        inputs = randomly_removed(dict(enc), special, config.removal_max, replacement, tokenizer.pad_token_id, generator)
        return model(**inputs, labels=labels[rows]).loss

    return _fit_all(model, config, len(texts), batch_loss, bar, "training with removal")


# ---------------------------------------------------------------------------- encoded inputs
def encoded_rows(inputs: Mapping[str, torch.Tensor], rows: Sequence[int]) -> dict[str, torch.Tensor]:
    """The ``rows`` of encoded ``inputs`` (``input_ids``, ``attention_mask``, optional
    ``token_type_ids``, each ``[M, N]``), cut to the positions one of them uses: a batch padded
    to its own longest row, as :func:`encode` pads texts."""
    picked = {name: tensor[list(rows)] for name, tensor in inputs.items()}
    used = picked["attention_mask"].bool().any(dim=0)
    return {name: tensor[:, used] for name, tensor in picked.items()}


@contextmanager
def _shown(progress: bool | Progress) -> Iterator[Progress]:
    """``progress`` itself when it is a running display (its tasks join it), else a new one
    (silent when false)."""
    if isinstance(progress, Progress):
        yield progress
        return
    with progress_bar(bool(progress)) as bar:
        yield bar


def fine_tune_encoded(
    model: PreTrainedModel,
    inputs: Mapping[str, torch.Tensor],
    targets: Sequence[float] | np.ndarray,
    config: TrainConfig,
    progress: bool | Progress = True,
    description: str = "training",
) -> dict:
    """Fine-tune every parameter of ``model`` in place, as :func:`fine_tune` does with a
    :class:`TrainConfig`, on inputs already encoded (``[M, N]`` tensors, :func:`encoded_rows`):
    token ids no text decodes back to -- an evaluation's ``[MASK]`` replacements in ROAR
    (:mod:`heedful.evaluate.roar`). ``progress``: show bars, or a running display to add them to."""
    labels = _targets_tensor(targets, model.config.problem_type == "regression")
    n_examples = int(inputs["input_ids"].shape[0])
    if len(labels) != n_examples:
        raise ValueError(f"{n_examples} encoded rows but {len(labels)} targets")

    def batch_loss(rows: list[int]) -> torch.Tensor:
        return model(**encoded_rows(inputs, rows), labels=labels[rows]).loss

    with _shown(progress) as bar, torch_threads(config.threads):
        return _fit_all(model, config, n_examples, batch_loss, bar, description)


def predict_encoded(
    model: PreTrainedModel,
    inputs: Mapping[str, torch.Tensor],
    batch_size: int = 128,
    progress: bool | Progress = True,
    description: str = "evaluating",
) -> np.ndarray:
    """Logits of ``model`` for encoded ``inputs`` (``[M, N]`` tensors), shape ``[M, num_labels]``."""
    n_examples = int(inputs["input_ids"].shape[0])
    return _predict_batches(model, n_examples, lambda rows: encoded_rows(inputs, rows), batch_size, progress, description)


def encoded_retrainer(name: str, fresh: Callable[[int], PreTrainedModel], config: TrainConfig) -> Retrainer:
    """A :class:`~heedful.evaluate.roar.Retrainer` that builds ``fresh(seed)`` and trains it with
    ``config`` (its seed replaced by the retrain's) by :func:`fine_tune_encoded`, and predicts by
    :func:`predict_encoded`. ``name`` says what ``fresh`` starts from (it enters the store's keys
    with ``config``)."""
    from heedful.evaluate.roar import Retrainer

    settings = {k: v for k, v in config.to_dict().items() if k != "seed"}

    def fit(model, inputs, targets, seed: int, progress) -> dict:
        return fine_tune_encoded(model, inputs, targets, replace(config, seed=seed), progress, "retraining")

    def predict(model, inputs, progress) -> np.ndarray:
        with torch_threads(config.threads):
            return predict_encoded(model, inputs, config.eval_batch_size, progress, "degraded test")

    return Retrainer(name, settings, config.max_length, fresh, fit, predict)
