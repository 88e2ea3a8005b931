"""Encoder–decoder models (T5, BART, Marian, mBART, Pegasus, M2M100 / NLLB, ...): a source side
and a target side laid out as one sequence.

An encoder–decoder reads a source ``x_1 .. x_S`` with its encoder and writes ``y_1 .. y_T`` with
its decoder, which starts from a decoder-start token ``y_0`` and attends to the encoder's last
states (cross-attention). heedful explains it as Inseq shows it: every output token is attributed
to a **source side** and a **target-prefix side**. So a :class:`~heedful.engine.batch.Batch` of such a
model holds each example as one row ``[x_1 .. x_S, y_0, y_1, .., y_t]`` whose ``token_type_ids``
say the side (0 source, 1 target); the joined text is the source, a line break, then the
target. Position ``a`` on the target side predicts the token at ``a + 1``, as in a causal
language model, so span targets (teacher forcing), contrasts and generation steps are the
causal machinery unchanged; every method that perturbs, interpolates or noises the input
embeddings of that row perturbs both sides at once, and its scores cover both.

:meth:`Seq2SeqAdapter._run_model` splits each row at its side boundary into the encoder's
``inputs_embeds`` (or ids) and the decoder's, runs the model, and lays what it returns back out
on the row: logits at the anchors (decoder positions), hidden states ``L + 1`` x ``[B, N, D]``
(encoder layer ``l`` on the source positions, decoder layer ``l`` on the target positions) and
attention probabilities ``L`` x ``[B, H, N, N]`` whose source rows are the encoder's
self-attention and whose target rows are the decoder layer's cross-attention (source columns)
beside its self-attention (target columns) -- the two matrices Inseq's attention method reads.
Such a matrix is no flow of one stack through its layers (a target row holds two softmaxes, and
cross-attention reads the encoder's *last* layer), so the methods that roll attention through the
layers refuse (the ``attention_flow`` need), as do those that need block roles, the head as a
module, relevance rules or one list of blocks.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

import torch
from torch import nn

from heedful.adapters.generic import GenericAdapter
from heedful.adapters.passes import ModelRun
from heedful.engine.batch import Batch
from heedful.engine.memory import ModelShape
from heedful.errors import Hint, InputError, UnsupportedModelError

SEQ2SEQ_TASK = "seq2seq_lm"
"""The task of an encoder–decoder language model (a ``*ForConditionalGeneration`` / ``*MTModel``)."""

SIDE_BREAK = "\n"
"""What separates the source from the target in a row's joined text."""

SEQ2SEQ_FAMILIES: dict[str, str] = {
    "t5": "T5",
    "mt5": "mT5",
    "umt5": "UMT5",
    "bart": "BART",
    "mbart": "mBART",
    "plbart": "PLBART",
    "marian": "Marian",
    "pegasus": "Pegasus",
    "m2m_100": "M2M100 / NLLB",
    "blenderbot": "Blenderbot",
    "blenderbot-small": "Blenderbot small",
}
"""The encoder–decoder families heedful checks (``config.model_type`` -> name): the tiny
configuration of each is data in :data:`heedful.tiny_seq2seq.TINY_SEQ2SEQ`. Another
encoder–decoder with a shared vocabulary loads too, with a warning."""

ENCODER_LAYERS = ("encoder_layers", "num_layers")
DECODER_LAYERS = ("decoder_layers", "num_decoder_layers", "num_layers")


def _count(config, names: Sequence[str]) -> int | None:
    found = (getattr(config, name, None) for name in names)
    return next((int(v) for v in found if isinstance(v, int) and v > 0), None)


def _layers(stack: nn.Module, count: int | None) -> list[nn.Module]:
    """The first module list of ``stack`` with ``count`` modules (its blocks)."""
    for module in stack.modules():
        if isinstance(module, nn.ModuleList) and len(module) == count:
            return list(module)
    return []


class Seq2SeqAdapter(GenericAdapter):
    """An encoder–decoder language model, its source and target sides as one row (see the
    module docstring). Everything else is the generic adapter's: the model runs as
    ``transformers`` runs it, its head through its own ``logits``."""

    family = "seq2seq"
    token_types = True  # the side of every position travels with the rows as token type ids

    def __post_init__(self) -> None:
        config = self.hf_model.config
        if not getattr(config, "is_encoder_decoder", False):
            raise UnsupportedModelError(
                f"{type(self.hf_model).__name__} is no encoder–decoder model",
                hint="load an encoder–decoder checkpoint (T5, BART, Marian, ...) or a causal language model as causal_lm",
            )
        encoder, decoder = self.hf_model.get_encoder(), self.hf_model.get_decoder()
        shared = getattr(encoder, "embed_tokens", None), getattr(decoder, "embed_tokens", None)
        if all(isinstance(e, nn.Embedding) for e in shared) and shared[0].weight is not shared[1].weight:
            raise UnsupportedModelError(
                f"{type(self.hf_model).__name__}'s encoder and decoder have separate vocabularies",
                hint="heedful explains encoder–decoders whose sides share one embedding matrix",
            )
        model_type = getattr(config, "model_type", "")
        if model_type not in SEQ2SEQ_FAMILIES:
            warnings.warn(
                f"the encoder–decoder family {model_type!r} is not among those heedful checks ({', '.join(SEQ2SEQ_FAMILIES)})",
                stacklevel=3,
            )
        super().__post_init__()

    # ------------------------------------------------------------------ what it is
    @property
    def described(self) -> str:
        name = SEQ2SEQ_FAMILIES.get(self.model_type, self.model_type)
        return f"the {name} encoder–decoder family ({type(self.hf_model).__name__})"

    @functools.cached_property
    def _stacks(self) -> tuple[list[nn.Module], list[nn.Module]]:
        config = self.config
        return (
            _layers(self.hf_model.get_encoder(), _count(config, ENCODER_LAYERS)),
            _layers(self.hf_model.get_decoder(), _count(config, DECODER_LAYERS)),
        )

    @property
    def blocks(self) -> Sequence[nn.Module]:
        """The encoder's blocks then the decoder's (each checkpointed alike in bounded passes)."""
        encoder, decoder = self._stacks
        return [*encoder, *decoder]

    @property
    def num_layers(self) -> int:
        """The decoder's layers: the hidden states and attentions laid out on a row have one per
        decoder layer (and the encoder has as many, else the adapter gives neither)."""
        return len(self._stacks[1]) or _count(self.config, DECODER_LAYERS) or 0

    @property
    def shape(self) -> ModelShape:
        from dataclasses import replace

        encoder, decoder = self._stacks
        return replace(super().shape, layers=len(encoder) + len(decoder))

    @property
    def embed_scale(self) -> float:
        """The factor the encoder multiplies its word embeddings by when given ids (Marian,
        Pegasus: ``sqrt(d_model)``; 1 where the embedding module scales them itself, as BART's)."""
        encoder = self.hf_model.get_encoder()
        scale = getattr(encoder, "embed_scale", None)
        return float(scale) if isinstance(scale, (int, float)) and not hasattr(self.word_embeddings, "embed_scale") else 1.0

    @property
    def max_length(self) -> int:
        """The positions of a row: the source side's limit and the target side's."""
        return 2 * self.side_length

    @property
    def side_length(self) -> int:
        """Longest source (and target) the model accepts, in tokens."""
        positions = getattr(self.config, "max_position_embeddings", None) or getattr(self.config, "n_positions", None)
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        limits = [int(v) for v in (positions, tok_max) if v and v < 1_000_000]
        return min(limits) if limits else 512

    @property
    def position_limit(self) -> int:
        """Each side's positions: the source's and the target's."""
        return self.side_length

    def positions_needed(self, length: int, added: int) -> int:
        """The longer side of a row of ``length`` tokens (a source and :attr:`decoder_prefix`)
        continued by ``added`` target tokens."""
        prefix = len(self.decoder_prefix)
        return max(length - prefix, prefix + added)

    @property
    def decoder_prefix(self) -> list[int]:
        """The target side's first tokens, before any output: the decoder-start token, and the
        token the model's generation config forces first (a target-language code), if any."""
        config = self.config
        start = getattr(config, "decoder_start_token_id", None)
        if start is None:
            start = getattr(self.hf_model.generation_config, "decoder_start_token_id", None)
        if start is None:
            raise UnsupportedModelError(f"{type(self.hf_model).__name__} names no decoder-start token", hint="set config.decoder_start_token_id")
        forced = getattr(self.hf_model.generation_config, "forced_bos_token_id", None)
        return [int(start)] + ([int(forced)] if forced is not None else [])

    # ------------------------------------------------------------------ encoding
    def encode(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str | None] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
    ) -> Batch:
        """The sources encoded as the encoder reads them (special tokens included, truncated to
        the source side's limit), each followed by :attr:`decoder_prefix` on the target side:
        a row ready to be continued by an output (:func:`heedful.engine.sequences.continue_batch`)."""
        if text_pairs is not None and any(p is not None for p in text_pairs):
            raise InputError(
                "an encoder–decoder model reads one source text; a text pair has no place in it",
                hint=Hint("give the output as target='...' or continuation='...'", "give the output as --continuation '...'"),
            )
        side = self.side_length
        limit = min(max_length or side, side)
        if getattr(self.tokenizer, "is_fast", False):
            source = super().encode(texts, None, truncation, limit)
        else:
            from heedful.adapters.pieces import encode_pieces

            source = encode_pieces(self, list(texts), truncation, limit)
        prefix = self.decoder_prefix
        return _with_prefix(source, prefix, self.tokenizer.convert_ids_to_tokens(prefix), self.pad_token_id)

    def continuation_ids(self, text: str) -> list[int]:
        """``text`` tokenized as the decoder's output (the target tokenizer where it has one:
        Marian's target SentencePiece model), without special tokens."""
        return list(self.tokenizer(text_target=text, add_special_tokens=False)["input_ids"])

    # ------------------------------------------------------------------ targets
    def anchor_positions(self, batch: Batch) -> tuple[torch.Tensor, str]:
        """The last position (on the target side): its output is the next target token."""
        return batch.lengths - 1, "last"

    def output_index(self, value: int | str) -> int:
        """The vocabulary column of a target token (an id, or a string of one target token)."""
        return self.token_column(value, "give a single token, or the whole output as a span")

    def _check_roles(self) -> None:
        if self.task != SEQ2SEQ_TASK:
            raise UnsupportedModelError(
                f"an encoder–decoder model explains its output tokens (task {SEQ2SEQ_TASK}), not {self.task}",
                hint=f"use task={SEQ2SEQ_TASK!r}",
            )

    # ------------------------------------------------------------------ passes
    def _probe(self) -> frozenset[str]:
        """One pass over two rows (3 source tokens, 2 target tokens): attention probabilities of
        every kind and hidden states of every layer where the model returns them and its two
        stacks have as many layers (the laid-out matrices need one layer of each per row)."""
        vocab = int(getattr(self.config, "vocab_size", None) or self.word_embeddings.num_embeddings)
        ids = torch.tensor([[1, 2, 3, 4, 5], [1, 2, 6, 4, 5]], device=self.device) % vocab
        types = torch.tensor([[0, 0, 0, 1, 1]] * 2, device=self.device)
        kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": types}
        try:
            with torch.no_grad():
                out = self._seq2seq_pass(kwargs, torch.tensor([4, 4], device=self.device), True, True)
        except Exception as exc:  # noqa: BLE001  (a model that cannot run at all: transformers raises many kinds)
            raise UnsupportedModelError(
                f"{type(self.hf_model).__name__} does not run on a source and a target ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})",
                hint="load it with attn_implementation='eager'",
            ) from None
        _, hidden, probs = out
        given = {"embeddings"}
        encoder, decoder = self._stacks
        if len(encoder) == len(decoder) and len(decoder) > 0:
            if hidden is not None:
                given.add("hidden_states")
            if probs is not None:
                given.add("attentions")
        return frozenset(given)

    def _run_model(self, kwargs, mask, anchor, prefill, read_inside, settings, head=True):
        """The encoder–decoder's pass of the rows (see the module docstring); ``prefill`` and
        ``head`` are ignored (the model runs whole, its own head too) and no key/value cache is
        returned."""
        return ModelRun(*self._seq2seq_pass(kwargs, anchor, bool(kwargs.get("output_hidden_states")), bool(kwargs.get("output_attentions"))), None)

    def _seq2seq_pass(self, kwargs: dict, anchor: torch.Tensor, hidden_states: bool, attentions: bool):
        """``kwargs``: the rows' ``input_ids`` or ``inputs_embeds`` ``[R, N(, E)]``,
        ``attention_mask`` and ``token_type_ids`` ``[R, N]``; ``anchor`` ``[R]`` or ``[R, K]``
        positions on the target side. Returns the logits there, and the hidden states and
        attention probabilities laid out on the rows (``None`` unless asked for)."""
        embeds = kwargs.get("inputs_embeds")
        given = embeds if embeds is not None else kwargs["input_ids"]
        rows, width = given.shape[:2]
        mask = kwargs["attention_mask"]
        if mask is None:
            mask = torch.ones(rows, width, dtype=torch.long, device=self.device)
        types = kwargs.get("token_type_ids")
        if types is None:
            raise InputError("an encoder–decoder row needs the side of every position (token_type_ids)")
        sides = Sides.of(mask.to(self.device), types.to(self.device))
        call: dict = {
            "attention_mask": sides.source_mask.long(),
            "decoder_attention_mask": sides.target_mask.long(),
            "use_cache": False,
            "return_dict": True,
            "output_hidden_states": hidden_states,
            "output_attentions": attentions,
        }
        if embeds is not None:
            source, target = sides.split(embeds)
            into_encoder, into_decoder = self._rescaled
            call["inputs_embeds"] = source if into_encoder == 1.0 else source / into_encoder
            call["decoder_inputs_embeds"] = target if into_decoder == 1.0 else target / into_decoder
        else:
            call["input_ids"], call["decoder_input_ids"] = sides.split(given)
        where = anchor.to(self.device)
        where = where - (sides.source_lengths[:, None] if where.dim() == 2 else sides.source_lengths)
        if bool((where < 0).any()):
            raise InputError("an encoder–decoder's output is read on the target side", hint="explain a target-side position")
        logits, out = self._lm_pass(call, rows, where)
        hidden = probs = None
        if hidden_states and out.encoder_hidden_states is not None and out.decoder_hidden_states is not None:
            hidden = tuple(
                sides.laid_out(e, d) for e, d in zip(out.encoder_hidden_states, out.decoder_hidden_states, strict=False)
            )
        if attentions and out.encoder_attentions is not None and out.decoder_attentions is not None:
            probs = tuple(
                sides.attention(e, c, d)
                for e, c, d in zip(out.encoder_attentions, out.cross_attentions, out.decoder_attentions, strict=False)
            )
        return logits, hidden, probs

    @functools.cached_property
    def _rescaled(self) -> tuple[float, float]:
        """What the encoder and the decoder multiply embeddings passed to them by (1 where only
        ids are scaled): Marian's decoder scales ``decoder_inputs_embeds`` by ``sqrt(d_model)``
        while its encoder leaves ``inputs_embeds`` as given. Measured by one pass per side:
        embeddings that the stack scales itself are passed divided by the scale."""
        scale = self.embed_scale
        if scale == 1.0:
            return 1.0, 1.0
        ids = torch.tensor([[1, 2, 3]], device=self.device) % self.word_embeddings.num_embeddings
        embeds = self.embed(ids)
        found = []
        with torch.no_grad():
            plain = self.hf_model(input_ids=ids, decoder_input_ids=ids, use_cache=False).logits
            for side in ("encoder", "decoder"):
                given = {"inputs_embeds" if side == "encoder" else "decoder_inputs_embeds": embeds}
                rest = {"decoder_input_ids": ids} if side == "encoder" else {"input_ids": ids}
                logits = self.hf_model(**given, **rest, use_cache=False).logits
                found.append(1.0 if torch.allclose(logits, plain, atol=1e-4, rtol=1e-4) else scale)
        return found[0], found[1]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Word embeddings of ids as the encoder and decoder add them to their positions
        (times :attr:`embed_scale`): what a pass from embeddings starts from."""
        embeds = self.word_embeddings(input_ids)
        scale = self.embed_scale
        return embeds if scale == 1.0 else embeds * scale


class Sides:
    """Where each row's source and target sides are: rows ``[x_1 .. x_S, y_0 .. y_T, pad]``
    with ``mask`` and ``types`` ``[R, N]`` (0 source, 1 target). ``source_lengths`` /
    ``target_lengths`` ``[R]``; ``target_index`` ``[R, T_max]``: the row position of each target
    token (padded ones point at position 0, masked)."""

    def __init__(self, source_lengths: torch.Tensor, target_lengths: torch.Tensor, width: int) -> None:
        self.source_lengths = source_lengths
        self.target_lengths = target_lengths
        self.width = width
        device = source_lengths.device
        self.source_width = int(source_lengths.max())
        self.target_width = int(target_lengths.max())
        self.source_mask = torch.arange(self.source_width, device=device)[None, :] < source_lengths[:, None]
        self.target_mask = torch.arange(self.target_width, device=device)[None, :] < target_lengths[:, None]
        index = source_lengths[:, None] + torch.arange(self.target_width, device=device)[None, :]
        self.target_index = torch.where(self.target_mask, index, torch.zeros_like(index))

    @classmethod
    def of(cls, mask: torch.Tensor, types: torch.Tensor) -> Sides:
        real = mask.bool()
        target = real & types.bool()
        source_lengths, target_lengths = (real & ~target).sum(dim=1), target.sum(dim=1)
        if bool((source_lengths == 0).any()) or bool((target_lengths == 0).any()):
            raise InputError("every encoder–decoder row needs a source token and a target token")
        return cls(source_lengths, target_lengths, mask.shape[1])

    def split(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``[R, N(, E)]`` cut into the encoder's ``[R, S_max(, E)]`` and the decoder's
        ``[R, T_max(, E)]`` (a gather: gradients flow back to the rows)."""
        source = values[:, : self.source_width]
        index = self.target_index if values.dim() == 2 else self.target_index[..., None].expand(-1, -1, values.shape[-1])
        return source, values.gather(1, index.to(values.device))

    def _scatter_index(self) -> torch.Tensor:
        """``[R, T_max]`` row positions of the target tokens, padded ones sent to an extra
        column ``N`` (dropped)."""
        return torch.where(self.target_mask, self.target_index, torch.full_like(self.target_index, self.width))

    def laid_out(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Per-position states of the encoder ``[R, S_max, D]`` and decoder ``[R, T_max, D]`` on
        the rows ``[R, N, D]`` (0 at padding)."""
        rows = source.new_zeros(source.shape[0], self.width + 1, source.shape[-1])
        rows[:, : self.source_width] = source * self.source_mask[..., None].to(source.dtype)
        index = self._scatter_index()[..., None].expand(-1, -1, target.shape[-1])
        rows = rows.scatter(1, index, target)
        return rows[:, : self.width]

    def attention(self, encoder: torch.Tensor, cross: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
        """One layer's attention on the rows ``[R, H, N, N]`` (row = query): source rows the
        encoder's self-attention ``[R, H, S, S]``; target rows the cross-attention
        ``[R, H, T, S]`` in the source columns and the decoder's self-attention ``[R, H, T, T]``
        in the target columns; 0 elsewhere."""
        r, h = encoder.shape[:2]
        n = self.width + 1
        rows = encoder.new_zeros(r, h, n, n)
        s = self.source_width
        keep = (self.source_mask[:, None, :, None] & self.source_mask[:, None, None, :]).to(encoder.dtype)
        rows[:, :, :s, :s] = encoder * keep
        at = self._scatter_index()  # [R, T]
        target_rows = cross.new_zeros(r, h, cross.shape[2], n)
        target_rows[..., :s] = cross
        columns = at[:, None, None, :].expand(-1, h, decoder.shape[2], -1)
        target_rows = target_rows.scatter(3, columns, decoder)
        index = at[:, None, :, None].expand(-1, h, -1, n)
        rows = rows.scatter(2, index, target_rows)
        return rows[:, :, : self.width, : self.width]


def _with_prefix(source: Batch, prefix: list[int], symbols: list[str], pad: int) -> Batch:
    """The encoded sources, each followed by the target side's ``prefix`` tokens (``symbols``: the
    tokenizer's; special, no
    text of their own; token type 1); the joined texts end in :data:`SIDE_BREAK`."""
    lengths = source.lengths.tolist()
    width = max(lengths) + len(prefix)
    count = len(source)
    ids = torch.full((count, width), pad, dtype=source.input_ids.dtype)
    mask = torch.zeros(count, width, dtype=source.attention_mask.dtype)
    types = torch.zeros(count, width, dtype=torch.long)
    special = torch.zeros(count, width, dtype=torch.bool)
    tokens, offsets, words, seq = [], [], [], []
    for b, n in enumerate(lengths):
        ids[b, :n] = source.input_ids[b, :n]
        ids[b, n : n + len(prefix)] = torch.tensor(prefix, dtype=ids.dtype)
        mask[b, : n + len(prefix)] = 1
        types[b, n : n + len(prefix)] = 1
        special[b, :n] = source.special_mask[b, :n]
        special[b, n : n + len(prefix)] = True
        tokens.append(list(source.tokens[b]) + list(symbols))
        offsets.append(list(source.offsets[b]) + [None] * len(prefix))
        words.append(list(source.word_ids[b]) + [None] * len(prefix))
        seq.append(list(source.sequence_ids[b]) + [None] * len(prefix))
    return Batch(
        input_ids=ids,
        attention_mask=mask,
        token_type_ids=types,
        special_mask=special,
        texts=[t + SIDE_BREAK for t in source.texts],
        text_pairs=[None] * count,
        tokens=tokens,
        offsets=offsets,
        word_ids=words,
        sequence_ids=seq,
        truncated=list(source.truncated),
    )


def source_lengths(batch: Batch) -> list[int]:
    """How many of each row's positions are on the source side (``None`` rows of a batch without
    sides: all)."""
    if batch.token_type_ids is None:
        return batch.lengths.tolist()
    real = batch.attention_mask.bool()
    return (real & ~batch.token_type_ids.bool()).sum(dim=1).tolist()

