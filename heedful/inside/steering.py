"""Steering vectors: a vector added to the residual stream of one layer changes what a language
model writes.

A :class:`SteeringVector` lives at the output of block ``layer`` (role ``block_out``, i.e.
``hidden_states[layer + 1]``; the convention of the ``steering-vectors`` package's
``layer_type="decoder_block"``) and is added, times a ``coefficient``, at every position of
every forward pass inside :meth:`SteeringVector.applied` -- the prompt's and each generated
token's. Three ways to get one:

* :func:`contrastive` -- contrastive activation addition (Rimsky et al. 2024, *Steering Llama 2
  via Contrastive Activation Addition*; Turner et al. 2023, *Activation Addition*): the mean over
  prompt pairs of ``h_layer(positive)[-1] - h_layer(negative)[-1]``, the difference of the
  residual streams at each prompt's last token (``read="mean"``: of the mean over its tokens);
* :func:`mean_difference` -- the difference of the mean activations of two labelled sets of
  texts (the mean-difference / "diff-in-means" vector);
* :func:`extract` -- extraction by optimisation (Subramani et al. 2022, *Extracting Latent
  Steering Vectors from Pretrained Language Models*; the lecture's Algorithm 1): ``z`` drawn
  ``xavier_normal``, added at ``layer`` at timestep ``timestep`` (or at every timestep), is
  optimised (Adam on the cross-entropy of the target sentence under teacher forcing; the
  algorithm's ``z + lr * dL/dz`` is the descent step with the sign of a loss to *minimise*)
  until greedy decoding from the sentence's first token with ``z`` reproduces the sentence.
  Offsets between extracted vectors (``mean z(negative) - mean z(positive)``) added to a
  sentence's own ``z`` give the lecture's table (:func:`transfer`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch

from heedful.errors import InputError
from heedful.generation import Generation, generate
from heedful.progress import task

READS = ("last", "mean")


class Steerer:
    """What steers generation: :meth:`applied` opens a block inside which every forward pass of
    the model is steered, ``coefficient`` times; :meth:`generate` writes under it. A
    :class:`SteeringVector` and an inference-time intervention
    (:class:`heedful.inside.iti.HeadIntervention`) are both steerers, so the sweep
    (:mod:`heedful.inside.sweep`) and ``heedful steer`` take either."""

    kind: str
    layer: int | None
    """The block a one-layer steerer acts at (``None``: several)."""

    def applied(self, model, coefficient: float = 1.0) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    @property
    def where(self) -> str:
        """Where it acts, for people (e.g. ``"block 6"``)."""
        raise NotImplementedError

    def generate(self, model, prompts: str | Sequence[str], coefficient: float = 1.0, max_new_tokens: int = 20, **options) -> Generation:
        """Greedy continuations of ``prompts`` steered with ``coefficient`` (``options``: any
        ``transformers`` generation option)."""
        batch = model.encode(prompts)
        with self.applied(model, coefficient):
            return generate(model.adapter, batch, max_new_tokens, **options)


@dataclass
class SteeringVector(Steerer):
    """``vector`` ``[D]`` added at the output of block ``layer``; ``kind`` says how it was made."""

    layer: int
    vector: torch.Tensor
    kind: str = "caa"
    meta: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"block {self.layer}"

    @contextlib.contextmanager
    def applied(self, model, coefficient: float = 1.0, timestep: int | None = None) -> Iterator[None]:
        """Inside the block every forward pass of ``model`` adds ``coefficient * vector`` to block
        ``layer``'s output at every position (``timestep``: only at that position of a pass over
        whole sequences)."""
        adapter = model.adapter
        shift = (coefficient * self.vector).to(device=adapter.device, dtype=adapter.word_embeddings.weight.dtype)
        with adapter.intercept() as hooks:
            hooks.replace("block_out", _adder(shift, timestep), [self.layer])
            yield


def _adder(shift: torch.Tensor, timestep: int | None):
    def add(h: torch.Tensor) -> torch.Tensor:
        if timestep is None:
            return h + shift
        if h.shape[1] <= timestep:  # a cached decoding step: past the injected timestep
            return h
        out = h.clone()
        out[:, timestep] = out[:, timestep] + shift
        return out

    return add


def check_layer(model, layer: int) -> int:
    if model.task != "causal_lm":
        raise InputError(f"steering changes what a language model writes; {model.name} is a {model.task} model", hint="use a causal LM such as smollm2-135m")
    count = model.adapter.num_layers
    if not -count <= layer < count:
        raise InputError(f"layer {layer} does not exist: the model has blocks 0 to {count - 1}", hint=f"a layer between 0 and {count - 1}")
    return layer % count


def activations(model, texts: Sequence[str], layer: int, read: str = "last", batch_size: int = 16) -> torch.Tensor:
    """``[len(texts), D]`` float32: block ``layer``'s output at each text's last token
    (``read="mean"``: averaged over its tokens), in batches."""
    return states(model, texts, "block_out", [layer], read, batch_size)[:, 0]


def states(
    model, texts: Sequence[str], role: str, layers: Sequence[int], read: str = "last", batch_size: int = 16, description: str | None = None
) -> torch.Tensor:
    """``[len(texts), len(layers), W]`` float32 (on the CPU): ``role``'s tensor ``[B, N, W]`` in
    each of ``layers`` at each text's last token (``read="mean"``: averaged over its tokens), in
    batches of right-padded texts (``description``: shown as a progress bar)."""
    if read not in READS:
        raise InputError(f"unknown read {read!r}", hint=f"choose one of {', '.join(READS)}")
    if not texts or any(not t.strip() for t in texts):
        raise InputError("steering needs non-empty texts", hint="give each prompt some words")
    adapter = model.adapter
    found = []
    starts = range(0, len(texts), batch_size)
    with task(description or "reading states", len(texts), shown=description is not None and len(starts) > 1) as progress:
        for start in starts:
            batch = model.encode(list(texts[start : start + batch_size]))
            anchor, _ = adapter.anchor_positions(batch)
            with torch.no_grad(), adapter.intercept() as hooks:
                outs = hooks.record(role, layers)
                adapter.forward(batch, anchor)
            h = torch.stack([outs[layer % adapter.num_layers] for layer in layers], dim=2).float()  # [B, N, L, W]
            mask = batch.attention_mask.to(h.device)
            if read == "last":
                found.append(h[torch.arange(len(batch)), (batch.lengths - 1).to(h.device)].cpu())
            else:
                found.append(((h * mask[..., None, None]).sum(1) / mask.sum(1)[:, None, None]).cpu())
            progress.advance(len(batch))
    return torch.cat(found)


def contrastive(
    model, positive: str | Sequence[str], negative: str | Sequence[str], layer: int, read: str = "last"
) -> SteeringVector:
    """Contrastive activation addition: the mean over pairs of the difference of block
    ``layer``'s outputs at the positive and the negative prompt's last token."""
    layer = check_layer(model, layer)
    pos = [positive] if isinstance(positive, str) else list(positive)
    neg = [negative] if isinstance(negative, str) else list(negative)
    if len(pos) != len(neg):
        raise InputError(f"{len(pos)} positive and {len(neg)} negative prompts", hint="give them in pairs")
    diff = (activations(model, pos, layer, read) - activations(model, neg, layer, read)).mean(0)
    return SteeringVector(layer, diff, "caa", {"positive": pos, "negative": neg, "read": read})


def mean_difference(
    model, positive: Sequence[str], negative: Sequence[str], layer: int, read: str = "mean"
) -> SteeringVector:
    """The mean activation of the ``positive`` texts minus that of the ``negative`` texts."""
    layer = check_layer(model, layer)
    if not positive or not negative:
        raise InputError("a mean-difference vector needs texts of both sets", hint="give positive and negative examples")
    diff = activations(model, list(positive), layer, read).mean(0) - activations(model, list(negative), layer, read).mean(0)
    return SteeringVector(layer, diff, "mean", {"positive": len(positive), "negative": len(negative), "read": read})


@dataclass
class Extracted:
    """An extracted vector, its last loss (nats per token), the steps taken, and whether greedy
    decoding with it reproduces the sentence (``decoded``: what it decodes to)."""

    vector: SteeringVector
    loss: float
    steps: int
    reproduced: bool
    decoded: str


def _start_ids(model, sentence: str) -> tuple[torch.Tensor, int, int]:
    """``[1, T]`` ids of the sentence as the tokenizer encodes it alone (with the special
    tokens it puts in front, e.g. BERT-style ``[CLS]`` or Llama's BOS; trailing ones dropped),
    the number of leading ids decoding starts from (the special tokens in front, else the
    sentence's first token) and the number of special tokens in front (not part of the text)."""
    tokenizer = model.tokenizer
    plain = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    if not plain:
        raise InputError("the sentence to extract a vector for is empty", hint="give a sentence")
    full = tokenizer(sentence)["input_ids"]
    front = next((k for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain), 0)
    ids = full[: front + len(plain)]
    return torch.tensor([ids]), max(front, 1), front


def extract(
    model,
    sentence: str,
    layer: int,
    *,
    timestep: int | None = 0,
    steps: int = 300,
    lr: float = 0.1,
    seed: int = 0,
    check_every: int = 20,
) -> Extracted:
    """Subramani et al.'s extraction (module docstring): ``z`` ``[D]`` such that greedy decoding
    from the sentence's first token, with ``z`` added at block ``layer``'s output at
    ``timestep`` (``None``: every position), writes exactly ``sentence``."""
    layer = check_layer(model, layer)
    adapter = model.adapter
    ids, lead, front = _start_ids(model, sentence)
    ids = ids.to(adapter.device)
    generator = torch.Generator().manual_seed(seed)
    z = torch.empty(1, adapter.hidden_size)
    torch.nn.init.xavier_normal_(z, generator=generator)
    z = z[0].to(adapter.device).requires_grad_(True)
    optimiser = torch.optim.Adam([z], lr=lr)
    params = [p for p in adapter.hf_model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    vector = SteeringVector(layer, z, "extracted", {"sentence": sentence, "timestep": timestep})
    loss = torch.tensor(float("nan"))
    done, decoded = 0, ""
    try:
        with task("extracting a steering vector", steps) as progress:
            for done in range(1, steps + 1):
                with torch.enable_grad(), adapter.intercept() as hooks:
                    hooks.replace("block_out", lambda h: _added(h, z, timestep), [layer])
                    logits = adapter.hf_model(input_ids=ids, use_cache=False).logits
                    loss = torch.nn.functional.cross_entropy(logits[0, lead - 1 : -1].float(), ids[0, lead:])
                    optimiser.zero_grad()
                    loss.backward()
                    optimiser.step()
                progress.advance()
                if done % check_every == 0 or done == steps:
                    decoded = _decode(model, vector, ids, lead, timestep, front)
                    if decoded == sentence:
                        break
    finally:
        for p in params:
            p.requires_grad_(True)
    vector.vector = z.detach().cpu()
    return Extracted(vector, float(loss.detach()), done, decoded == sentence, decoded)


def _added(h: torch.Tensor, z: torch.Tensor, timestep: int | None) -> torch.Tensor:
    if timestep is None:
        return h + z.to(h.dtype)
    if h.shape[1] <= timestep:
        return h
    pad = torch.zeros_like(h)
    pad[:, timestep] = z.to(h.dtype)
    return h + pad


def _decode(model, vector: SteeringVector | None, ids: torch.Tensor, lead: int, timestep: int | None, front: int = 0) -> str:
    """Greedy decoding of as many tokens as the sentence ``ids`` has, from its first ``lead``
    ids, with ``vector`` injected (``None``: the model alone; the injected timestep counts from
    the start of the sequence, so every step is a full pass); the ``front`` special tokens are
    not part of the text."""
    adapter = model.adapter
    with torch.no_grad(), adapter.intercept() as hooks:
        if vector is not None:
            z = vector.vector.detach()
            hooks.replace("block_out", lambda h: _added(h, z, timestep), [vector.layer])
        out = ids[:, :lead]
        for _ in range(ids.shape[1] - lead):
            nxt = adapter.hf_model(input_ids=out, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            out = torch.cat([out, nxt], dim=1)
    return model.tokenizer.decode(out[0, front:].tolist())


def unsteered(model, sentence: str) -> str:
    """What greedy decoding writes from ``sentence``'s start without a vector (as many tokens)."""
    ids, lead, front = _start_ids(model, sentence)
    return _decode(model, None, ids.to(model.adapter.device), lead, None, front)


def transfer(model, extracted: Extracted, offset: torch.Tensor, coefficient: float) -> str:
    """What greedy decoding writes with ``extracted``'s vector plus ``coefficient * offset`` (the
    lecture's table: ``z(sentence) + k * z_tonegative``)."""
    ids, lead, front = _start_ids(model, extracted.vector.meta["sentence"])
    moved = SteeringVector(extracted.vector.layer, extracted.vector.vector + coefficient * offset, "extracted")
    return _decode(model, moved, ids.to(model.adapter.device), lead, extracted.vector.meta["timestep"], front)
