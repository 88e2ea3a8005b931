"""ModelAdapter: the one place that knows how a transformers model is put together.

Methods ask the adapter for things by role -- the input embedding layer, a forward pass from
embeddings, every layer's hidden states and attention probabilities, the head-on-top applied to
any token's representation, the token that removes a token, any tensor inside a block
(:meth:`ModelAdapter.intercept`) -- and never name an architecture. Family subclasses
(``heedful.adapters.families``) fill in the roles.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import ClassVar

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint as checkpoint_call

from heedful.adapters.anchored import anchored_last_block, hooked
from heedful.adapters.causal import CAUSAL_ATTENTION
from heedful.adapters.intercept import Interception, intercepting
from heedful.adapters.needs import NEEDS, refusal
from heedful.adapters.roles import BlockRoles, HeadRoles, LRPRoles, ModelRoles, NormSite
from heedful.batch import Batch
from heedful.errors import Hint, InputError, UnsupportedModelError, did_you_mean
from heedful.interrupt import interruptible
from heedful.memory import (
    FORWARD,
    Fit,
    ModelShape,
    Need,
    default_budget,
    fit,
    parse_memory,
    release_heap,
)
from heedful.precision import active_precision, lowered_model
from heedful.readable import readable_tokens


@dataclass
class Forward:
    """One forward pass. ``logits`` ``[B, C]``: head output at each example's anchor position;
    ``hidden_states``: ``L + 1`` tensors ``[B, N, D]`` (0 = embedding module output, L = the
    representation the head reads, after any final norm); ``attentions``: ``L`` tensors
    ``[B, H, N, N]`` (row = query); ``inputs_embeds``: when set, the word embeddings
    ``[B, N, E]`` the pass started from, with the autograd graph from them to ``logits`` kept
    (a gradient method back-propagates through it instead of running the model again)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    inputs_embeds: torch.Tensor | None = None


@dataclass
class PrefixStates:
    """The attention keys and values every layer computed for a batch (a decoder's key/value
    cache): ``keys[l]`` / ``values[l]`` ``[B, H_kv, N, d]``. A causal model's states at
    positions before ``p`` do not depend on later tokens, so any copy of example ``b`` that
    agrees with it on its first ``p`` tokens can start from ``keys[l][b, :, :p]`` and run only
    the rest (:meth:`ModelAdapter.forward` with ``prefix=``)."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@contextlib.contextmanager
def _attention_set(config, implementation: str | None) -> Iterator[None]:
    """``config``'s attention implementation set to ``implementation`` while inside."""
    before = getattr(config, "_attn_implementation", None)
    if implementation is None or implementation == before:
        yield
        return
    config._attn_implementation = implementation
    try:
        yield
    finally:
        config._attn_implementation = before


def _released(grad: torch.Tensor) -> None:
    """Gradient hook: give the heap's free pages back (:func:`heedful.memory.release_heap`)."""
    release_heap()


@dataclass
class PassCounter:
    """Counts sequences sent through the model forward and backward (cost bookkeeping)."""

    forward: int = 0
    backward: int = 0

    def reset(self) -> None:
        self.forward = 0
        self.backward = 0


@dataclass
class LMHeadParts:
    """A language-model head split as ``logits = cap(transform(h) @ weight.T + bias)``, so that a
    few vocabulary columns can be computed without the full vocabulary projection; ``softcap``
    ``c``: the logits are soft-capped, ``cap(z) = tanh(z / c) * c`` (Gemma 2), else ``cap`` is
    the identity."""

    transform: Callable[[torch.Tensor], torch.Tensor]
    weight: torch.Tensor
    bias: torch.Tensor | None
    softcap: float | None = None

    def capped(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.softcap is None else torch.tanh(logits / self.softcap) * self.softcap


@functools.cache
def _cache_keyword(backbone: type[nn.Module]) -> str:
    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


def right_padded(mask: torch.Tensor) -> bool:
    """Whether every row of an attention mask ``[B, N]`` is its real positions followed by
    padding only (no hole inside a row), so that a causal model's real positions never attend
    to a padded one."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all())


@dataclass
class ModelAdapter:
    """Wraps a ``transformers`` model and its tokenizer for heedful's methods.

    Subclasses set the architecture roles; everything here is generic.
    """

    hf_model: nn.Module
    tokenizer: object
    task: str
    name: str = "model"
    counter: PassCounter = field(default_factory=PassCounter)
    max_memory: int = field(default_factory=default_budget)
    """Bytes one pass may use on top of what the process holds (:mod:`heedful.memory`);
    default :func:`~heedful.memory.default_budget`, half of the memory available at load."""
    precision: str = "fp32"
    """The numeric precision this adapter's model runs at (:mod:`heedful.precision`)."""
    lowered: dict = field(default_factory=dict, repr=False, compare=False)
    """Low-precision copies of this adapter by precision, built on first use (:meth:`at_precision`)."""

    family: ClassVar[str] = "generic"
    is_decoder: ClassVar[bool] = False
    blocks_at: ClassVar[str] = ""
    """Where the blocks are: an attribute path below the backbone (``"encoder.layer"``)."""
    final_norm_at: ClassVar[str] = ""
    """Where a pre-LN decoder's final norm is, below the backbone (``"norm"``); empty: none."""
    token_types: ClassVar[bool | None] = None
    """Whether the model embeds segment (token type) ids; ``None``: its config says."""
    relevance_rules: ClassVar[frozenset[str]] = frozenset()
    """The relevance rule sets (:data:`heedful.lrp.rules.RULE_SETS` names) checked against this
    family's blocks (by ``heedful.testing.check_family``); the others are refused."""
    kernel_attention: ClassVar[bool] = True
    """Passes without attention probabilities may run fused attention (``sdpa``)."""
    anchored_blocks: ClassVar[bool] = False
    """The blocks are post-LN encoder blocks that :mod:`heedful.adapters.anchored` computes at
    the anchor positions only (forward-only passes of a classifier or regressor)."""

    def __post_init__(self) -> None:
        self.max_memory = parse_memory(self.max_memory)
        self.hf_model.eval()
        for p in self.hf_model.parameters():
            p.requires_grad_(False)
        # attention probabilities exist only in eager attention (sdpa / flash return none)
        if getattr(self.config, "_attn_implementation", "eager") != "eager" and hasattr(self.hf_model, "set_attn_implementation"):
            self.hf_model.set_attn_implementation("eager")
        self._check_roles()

    # ------------------------------------------------------------------ what methods may read
    @property
    def described(self) -> str:
        """The model as messages name it: its family and class."""
        return f"the {self.family} family ({type(self.hf_model).__name__})"

    def provides(self, need: str) -> bool:
        """Whether the model gives a method what it ``need``s (one of
        :data:`~heedful.adapters.needs.NEEDS`): a mapped family gives everything but relevance
        rules where none was checked on its blocks (:attr:`relevance_rules`; a rule set it does
        not map is refused by :meth:`lrp_roles`) and plain blocks where its roles describe more
        (:meth:`~heedful.adapters.roles.BlockRoles.unplain`)."""
        if need not in NEEDS:
            raise ValueError(f"unknown need {need!r} (one of {', '.join(NEEDS)})")
        if need == "rules":
            return bool(self.relevance_rules)
        if need == "plain_blocks":
            return not any(block.unplain() for block in self.roles().blocks)
        return True

    def refusal(self, method: str, missing: tuple[str, ...]) -> UnsupportedModelError:
        """The one-line error refusing ``method`` for the ``missing`` needs: what the blocks have
        where plain blocks are missing (:meth:`~heedful.adapters.roles.ModelRoles.require_plain`),
        else what each need means (:func:`heedful.adapters.needs.refusal`)."""
        if missing == ("plain_blocks",):
            try:
                self.roles().require_plain(method)
            except UnsupportedModelError as exc:
                return exc
        return refusal(method, missing, self.described)

    # ------------------------------------------------------------------ roles (per family)
    @property
    def backbone(self) -> nn.Module:
        """The transformer without its head; accepts ``input_ids`` or ``inputs_embeds``."""
        return self.hf_model.base_model

    @property
    def cache_keyword(self) -> str:
        """The name under which the backbone takes and returns a key/value cache: ``cache`` from
        transformers 5.24, ``past_key_values`` before (the old name still works there, with a
        deprecation warning on every first use)."""
        return _cache_keyword(type(self.backbone))

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.hf_model.get_input_embeddings()

    @property
    def final_norm(self) -> nn.Module | None:
        """Norm that pre-LN decoders apply after the last block (``None`` for post-LN encoders):
        the module at :attr:`final_norm_at` below the backbone."""
        return attrgetter(self.final_norm_at)(self.backbone) if self.final_norm_at else None

    @property
    def blocks(self) -> Sequence[nn.Module]:
        """The transformer blocks, in forward order: the module at :attr:`blocks_at` below the
        backbone."""
        if not self.blocks_at:
            raise UnsupportedModelError(f"the {self.family} adapter does not say where its blocks are")
        return attrgetter(self.blocks_at)(self.backbone)

    def classification_head(self, h: torch.Tensor) -> torch.Tensor:
        """Head-on-top of a sequence classifier applied to representations ``[M, D]`` -> ``[M, C]``."""
        raise UnsupportedModelError(f"{self.family} adapter has no classification head role")

    def lm_head_parts(self) -> LMHeadParts | None:
        """The LM head split into transform and projection (``None``: only the full head is known)."""
        return None

    def lm_head_full(self, h: torch.Tensor) -> torch.Tensor:
        """Full LM head ``[M, D] -> [M, V]``."""
        parts = self.lm_head_parts()
        if parts is None:
            raise UnsupportedModelError(f"{self.family} adapter has no language-model head role")
        logits = parts.transform(h) @ parts.weight.T
        return parts.capped(logits if parts.bias is None else logits + parts.bias)

    @property
    def uses_token_types(self) -> bool:
        if self.token_types is not None:
            return self.token_types
        return getattr(self.hf_model.config, "type_vocab_size", 0) > 0

    def roles(self) -> ModelRoles:
        """Where each role lives in the model (see :mod:`heedful.adapters.roles`): one
        :meth:`block_roles` per block, the embedding norms, the final norm and the head."""
        return ModelRoles(
            blocks=[self.block_roles(layer) for layer in self.blocks],
            embedding_norms=self.embedding_norm_sites(),
            final_norm=self.final_norm_site(),
            head=self.head_roles(),
        )

    def block_roles(self, layer: nn.Module) -> BlockRoles:
        """Where each role of one block lives (a family fills this in)."""
        raise UnsupportedModelError(f"the roles of the {self.family} family are not mapped")

    def embedding_norm_sites(self) -> list[NormSite]:
        """Norms between the word embeddings and the first block."""
        return []

    def final_norm_site(self) -> NormSite | None:
        """The norm pre-LN decoders apply after the last block, as a role."""
        return None

    def head_roles(self) -> HeadRoles:
        """The modules of the head-on-top."""
        return HeadRoles()

    def intercept(self) -> Interception:
        """A context in which any role can be recorded, replaced or given a rule (see
        :mod:`heedful.adapters.intercept`)::

            with adapter.intercept() as hooks:
                probs = hooks.record("probs")
                adapter.forward(batch, anchor)
        """
        return Interception(self.hf_model, self.roles())

    def lrp_roles(self, rules: str | None = None) -> LRPRoles:
        """The operations relevance propagation attaches its rules to, from :meth:`roles`;
        ``rules``: the rule set's name, refused unless in :attr:`relevance_rules` (``None``: any
        one of them)."""
        if rules not in self.relevance_rules if rules is not None else not self.relevance_rules:
            self.roles().lrp()  # a block relevance cannot pass says so itself
            what = f"the {rules} rules" if rules is not None else "relevance propagation (LRP) rules"
            mapped = ", ".join(sorted(self.relevance_rules)) or "none"
            raise UnsupportedModelError(
                f"{what} are not mapped for the {self.family} family (mapped: {mapped})",
                hint="docs/extending.md (Families) says how a family's rules are checked and mapped",
            )
        return self.roles().lrp()

    # ------------------------------------------------------------------ generic behaviour
    def _check_roles(self) -> None:
        if self.task in ("classification", "regression"):
            try:
                with torch.no_grad():
                    param = next(self.hf_model.parameters())
                    self.classification_head(torch.zeros(1, self.hidden_size, dtype=param.dtype, device=param.device))
            except (AttributeError, TypeError) as exc:
                raise UnsupportedModelError(
                    f"{type(self.hf_model).__name__} has no usable sequence-classification head ({exc})",
                    hint="load a *ForSequenceClassification checkpoint or pass the right task",
                ) from exc
        elif self.task in ("masked_lm", "causal_lm"):
            if self.lm_head_parts() is None and type(self).lm_head_full is ModelAdapter.lm_head_full:
                raise UnsupportedModelError(
                    f"{type(self.hf_model).__name__} has no language-model head",
                    hint="load a *ForMaskedLM or *ForCausalLM checkpoint",
                )

    @property
    def config(self):
        return self.hf_model.config

    @property
    def hidden_size(self) -> int:
        cfg = self.config
        return getattr(cfg, "hidden_size", None) or getattr(cfg, "dim", None) or cfg.n_embd

    @property
    def num_layers(self) -> int:
        return len(self.blocks)

    # ------------------------------------------------------------------ memory
    @property
    def shape(self) -> ModelShape:
        """The model's shape as the memory estimator reads it (:mod:`heedful.memory`): blocks,
        widths, heads, key/value heads, MLP width, the head's output columns, bytes per value."""
        cfg = self.config

        def first(*names: str) -> int | None:
            found = [getattr(cfg, n, None) for n in names]
            return next((int(v) for v in found if isinstance(v, int) and v > 0), None)

        hidden = self.hidden_size
        heads = first("num_attention_heads", "n_head", "n_heads") or 1
        outputs = len(self.labels) if self.task in ("classification", "regression") else first("vocab_size") or 1
        param = next(self.hf_model.parameters())
        return ModelShape(
            layers=self.num_layers,
            hidden=hidden,
            heads=heads,
            kv_heads=first("num_key_value_heads") or heads,
            head_dim=first("head_dim") or hidden // heads,
            intermediate=first("intermediate_size", "ffn_dim", "n_inner", "hidden_dim") or 4 * hidden,
            outputs=outputs,
            embed=self.word_embeddings.embedding_dim,
            element=param.element_size(),
            decoder=self.is_decoder,
            fused=(
                self.kernel_attention
                and getattr(cfg, "_attn_implementation", None) == "eager"
                and bool(getattr(self.hf_model, "_supports_sdpa", False))
                and not intercepting(self.hf_model)
            ),
        )

    def fit(self, width: int, need: Need = FORWARD, budget: int | None = None, **options) -> Fit:
        """How passes over rows of ``width`` positions keeping ``need`` fit :attr:`max_memory`
        (or a smaller ``budget``; :func:`heedful.memory.fit`: rows per pass, with gradient
        checkpointing or chunked prefill where one row does not fit; ``options``:
        ``checkpoint``, ``prefill``, ``group``). An :class:`InputError` when nothing fits."""
        return fit(self.shape, width, self.max_memory if budget is None else budget, need, **options)

    @contextlib.contextmanager
    def checkpointed(self, checkpoint: bool = True, release: bool = True) -> Iterator[None]:
        """Blocks in bounded memory while inside. With ``checkpoint``, in a pass with gradients,
        each block runs with per-block gradient checkpointing: its forward keeps only its inputs
        and runs again during the backward (``torch.utils.checkpoint``, non-reentrant,
        recomputed with the attention the forward ran; the model is in eval mode, no dropout,
        so the gradients equal the plain backward's). With ``release``, each block gives the
        heap's free pages back after its forward and, with gradients, after its backward
        (:func:`heedful.memory.release_heap`: the tensors a pass keeps for later -- saved
        activations, block inputs, a growing key/value cache -- split the heap, and the next
        block's temporaries do not fit the holes; the pages are faulted in again, about 10% of
        a short pass's time, so only passes near the budget ask for it)."""
        blocks = list(self.blocks)
        own = [block.__dict__.get("forward") for block in blocks]
        config = self.config

        def contexts() -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
            # the recomputation runs during the backward, after the pass's attention setting
            # (fused or eager, :meth:`_kernel_attention`) was restored: run it as the forward ran
            return contextlib.nullcontext(), _attention_set(config, getattr(config, "_attn_implementation", None))

        for block in blocks:
            plain = block.forward

            def run(*args, _plain=plain, **kwargs):
                grad = torch.is_grad_enabled()
                if checkpoint and grad:
                    out = checkpoint_call(_plain, *args, use_reentrant=False, context_fn=contexts, **kwargs)
                else:
                    out = _plain(*args, **kwargs)
                if release:
                    release_heap()
                    entering = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a) and a.requires_grad), None)
                    if grad and entering is not None:  # once the block's backward is done, so are its temporaries
                        entering.register_hook(_released)
                return out

            block.forward = run
        try:
            yield
        finally:
            for block, before in zip(blocks, own, strict=True):
                if before is None:
                    del block.forward
                else:
                    block.forward = before

    @property
    def device(self) -> torch.device:
        return next(self.hf_model.parameters()).device

    @property
    def labels(self) -> list[str]:
        """Output names: class labels for classifiers, ``["value"]`` for regression."""
        if self.task == "regression":
            return ["value"]
        if self.task == "classification":
            id2label = getattr(self.config, "id2label", None) or {}
            n = self.config.num_labels
            return [str(id2label.get(i, f"LABEL_{i}")) for i in range(n)]
        return []

    @property
    def max_length(self) -> int:
        """Longest input the model accepts, in tokens."""
        # RoBERTa reserves padding_idx + 1 position embeddings (514 positions -> 512 tokens);
        # the tokenizer's model_max_length already counts tokens.
        offset = 2 if self.family == "roberta" else 0
        positions = getattr(self.config, "max_position_embeddings", None)
        limits = [positions - offset if positions else None] + [
            getattr(self.config, attr, None) for attr in ("n_positions", "max_seq_len")
        ]
        tok_max = getattr(self.tokenizer, "model_max_length", None)
        if tok_max and tok_max < 1_000_000:
            limits.append(tok_max)
        limits = [int(x) for x in limits if x]
        return min(limits) if limits else 512

    @property
    def removal_token_id(self) -> int | None:
        """Token that stands for a removed token: ``[MASK]`` where the vocabulary has one;
        ``None`` means removal is deletion (causal LMs, which see no mask token in training)."""
        if self.is_decoder:
            return None
        mask_id = getattr(self.tokenizer, "mask_token_id", None)
        if mask_id is not None:
            return int(mask_id)
        unk = getattr(self.tokenizer, "unk_token_id", None)
        return None if unk is None else int(unk)

    @property
    def pad_token_id(self) -> int:
        for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
            value = getattr(self.tokenizer, attr, None)
            if value is not None:
                return int(value)
        return 0

    # ------------------------------------------------------------------ encoding
    def encode(
        self,
        texts: Sequence[str],
        text_pairs: Sequence[str | None] | None = None,
        truncation: bool = True,
        max_length: int | None = None,
    ) -> Batch:
        """Tokenize texts (and optional second segments) into a right-padded :class:`Batch`.

        Raises :class:`InputError` for empty texts, and for texts longer than the model accepts
        when ``truncation`` is False; truncation otherwise happens with a warning.
        """
        texts = list(texts)
        if not texts:
            raise InputError("no text given", hint="pass at least one non-empty text")
        pairs = list(text_pairs) if text_pairs is not None else [None] * len(texts)
        if len(pairs) != len(texts):
            raise InputError(f"{len(texts)} texts but {len(pairs)} text pairs")
        for i, text in enumerate(texts):
            if not isinstance(text, str) or not text.strip():
                raise InputError(
                    f"text {i} is empty" if len(texts) > 1 else "the text is empty",
                    hint="give a text with at least one word",
                )
            bad = _lone_surrogate(text)
            if bad is not None:
                raise InputError(
                    f"{'text ' + str(i) if len(texts) > 1 else 'the text'} holds an unpaired surrogate (U+{ord(text[bad]):04X}) at character {bad}",
                    hint="the text is not valid Unicode: decode it from its bytes again (e.g. errors='replace')",
                )
        for i, pair in enumerate(pairs):
            if pair is not None and (not isinstance(pair, str) or _lone_surrogate(pair) is not None):
                raise InputError(f"text pair {i} is not a valid Unicode string", hint="give each text pair as a str")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
            raise InputError(f"max_length must be a positive integer, got {max_length!r}", hint=f"e.g. max_length={self.max_length}, or leave it unset")
        limit = min(max_length or self.max_length, self.max_length)
        has_pairs = any(p is not None for p in pairs)
        if has_pairs and any(p is None for p in pairs):
            raise InputError("either every text has a pair or none does")

        args = (texts, pairs) if has_pairs else (texts,)
        lengths = [len(ids) for ids in self.tokenizer(*args, truncation=False)["input_ids"]]
        too_long = [i for i, n in enumerate(lengths) if n > limit]
        if too_long and not truncation:
            raise InputError(
                f"text {too_long[0]} has {lengths[too_long[0]]} tokens; the model accepts at most {limit}",
                hint=Hint("shorten the text, or allow truncation (truncation=True)", "shorten the text, or allow truncation (drop --no-truncate)"),
            )
        if too_long:
            warnings.warn(
                f"{len(too_long)} text(s) longer than {limit} tokens were truncated",
                stacklevel=2,
            )
        enc = self.tokenizer(
            *args,
            padding=True,
            truncation=True,
            max_length=limit,
            return_tensors="pt",
            return_offsets_mapping=True,
            return_special_tokens_mask=True,
            # models that embed segment types get them even if the tokenizer does not return
            # them by default (its model_input_names)
            return_token_type_ids=True if self.uses_token_types else None,
            padding_side="right",
        )
        return self._batch_from_encoding(enc, texts, pairs, [i in too_long for i in range(len(texts))])

    def _batch_from_encoding(self, enc, texts, pairs, truncated) -> Batch:
        ids = enc["input_ids"]
        mask = enc["attention_mask"]
        tokens, offsets, word_ids, seq_ids = [], [], [], []
        special = enc["special_tokens_mask"].bool() & mask.bool()
        for b in range(ids.shape[0]):
            n = int(mask[b].sum())
            tokens.append(self.tokenizer.convert_ids_to_tokens(ids[b, :n].tolist()))
            sids = enc.sequence_ids(b)[:n]
            wids = enc.word_ids(b)[:n]
            offs = enc["offset_mapping"][b, :n].tolist()
            seen: dict[tuple[int, int], int] = {}
            words: list[int | None] = []
            for s, w in zip(sids, wids, strict=True):
                if s is None or w is None:
                    words.append(None)
                else:
                    words.append(seen.setdefault((s, w), len(seen)))
            tokens_special = special[b, :n].tolist()
            offsets.append(
                [None if sp else (int(o[0]), int(o[1])) for o, sp in zip(offs, tokens_special, strict=True)]
            )
            word_ids.append([None if sp else w for w, sp in zip(words, tokens_special, strict=True)])
            seq_ids.append(sids)
        token_types = enc.get("token_type_ids") if self.uses_token_types else None
        return Batch(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=token_types,
            special_mask=special,
            texts=texts,
            text_pairs=pairs,
            tokens=tokens,
            offsets=offsets,
            word_ids=word_ids,
            sequence_ids=seq_ids,
            truncated=truncated,
        )

    # ------------------------------------------------------------------ targets
    def anchor_positions(self, batch: Batch) -> tuple[torch.Tensor, str]:
        """Position whose head output is explained, ``[B]``, and how it moves under deletion."""
        last = batch.lengths - 1
        if self.task == "causal_lm":
            return last, "last"
        if self.task == "masked_lm":
            mask_id = getattr(self.tokenizer, "mask_token_id", None)
            found = batch.input_ids == mask_id
            missing = (~found.any(dim=1)).nonzero().flatten().tolist()
            if missing:
                raise InputError(
                    f"text {missing[0]} has no {self.tokenizer.mask_token} token to explain",
                    hint=f"put {self.tokenizer.mask_token} where the word to predict goes",
                )
            return found.int().argmax(dim=1), "fixed"
        if self.is_decoder:
            return last, "last"
        return torch.zeros(len(batch), dtype=torch.long, device=batch.input_ids.device), "first"

    def output_index(self, value: int | str) -> int:
        """Column of a class (index or label) or of a vocabulary token.

        For a classifier, a string of digits that is not a label is a class index (``"1"`` from
        the command line). For a language model a string is always a token (``"5"`` is the token
        5) and an int is a token id.
        """
        if self.task == "classification":
            labels = self.labels
            if isinstance(value, str) and value.strip().lstrip("-").isdigit() and value.lower() not in {
                lab.lower() for lab in labels
            }:
                value = int(value.strip())
            if isinstance(value, int):
                if not 0 <= value < len(labels):
                    raise InputError(
                        f"class index {value} is out of range for {len(labels)} classes",
                        hint=f"use 0..{len(labels) - 1} or a label: {', '.join(labels)}",
                    )
                return value
            folded = {lab.lower(): i for i, lab in enumerate(labels)}
            if value.lower() not in folded:
                raise InputError(
                    f"unknown label {value!r}",
                    hint=did_you_mean(value, labels, "label", listing=f"the model's labels are: {', '.join(labels)}"),
                )
            return folded[value.lower()]
        if self.task in ("masked_lm", "causal_lm"):
            if isinstance(value, int):
                vocab = getattr(self.config, "vocab_size", None)
                if value < 0 or (vocab is not None and value >= vocab):
                    raise InputError(
                        f"token id {value} is out of range for a vocabulary of {vocab} tokens",
                        hint="give a token id in 0..vocab_size-1, or the token itself as a string",
                    )
                return value
            ids = self.tokenizer(value, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                pieces = self.tokenizer.convert_ids_to_tokens(ids)
                raise InputError(
                    f"target {value!r} is {len(ids)} tokens ({pieces}); a token target must be one token",
                    hint="give a single token (for next-token targets include its leading space, e.g. ' Paris')",
                )
            return int(ids[0])
        raise InputError(f"a {self.task} model has no classes to choose from")

    def output_name(self, index: int) -> str:
        """The name of output column ``index`` as people read it: a class label, ``"value"``, or
        a vocabulary token decoded (:func:`heedful.readable.readable_tokens`)."""
        if self.task == "classification":
            return self.labels[index]
        if self.task == "regression":
            return "value"
        return self.readable_tokens([int(index)])[0]

    def readable_tokens(self, ids: Sequence[int], raw: Sequence[str] | None = None) -> list[str]:
        """The tokens ``ids`` as people read them (``raw``: their tokenizer symbols, when known)."""
        raw = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]) if raw is None else raw
        return readable_tokens(self.tokenizer, ids, raw)

    # ------------------------------------------------------------------ precision
    def at_precision(self, precision: str) -> ModelAdapter:
        """This adapter with its model at ``precision`` (:func:`heedful.precision.lowered_model`):
        itself at its own precision, else a copy sharing its tokenizer and pass counter, built
        on first use and kept (``lowered``) so that later calls reuse it."""
        if precision == self.precision:
            return self
        if self.precision != "fp32":
            raise InputError(f"a {self.precision} copy of a model is not lowered again", hint="lower the float32 adapter")
        found = self.lowered.get(precision)
        if found is None:
            found = replace(self, hf_model=lowered_model(self.hf_model, precision), precision=precision, lowered={})
            self.lowered[precision] = found
        return found

    # ------------------------------------------------------------------ forward passes
    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Word embeddings of ids, ``[B, N] -> [B, N, E]`` (the input the gradient methods perturb)."""
        return self.word_embeddings(input_ids)

    def forward(
        self,
        batch: Batch,
        anchor: torch.Tensor,
        *,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        hidden_states: bool = False,
        attentions: bool = False,
        prefix: tuple[PrefixStates, torch.Tensor, int] | None = None,
        checkpoint: bool = False,
        release: bool = False,
        prefill: int | None = None,
    ) -> Forward:
        """Run the model and the head at each example's ``anchor`` position ``[B]`` (logits
        ``[B, C]``), or at ``K`` positions per example ``[B, K]`` (a span; logits ``[B, K, C]``).

        By default ids and masks come from ``batch``; pass ``input_ids`` or ``inputs_embeds``
        ``[B', N, E]`` (with a matching ``attention_mask``) to run perturbed or expanded copies.
        ``prefix=(states, rows, p)`` (decoders): the rows continue the first ``p`` positions of
        examples ``rows`` ``[B']`` of ``states`` (:meth:`prefix_states`); ``input_ids`` are
        then the positions from ``p`` on, ``attention_mask`` covers all ``p + N'`` positions
        and ``anchor`` counts from ``p``.

        Bounded memory (the runner decides, :mod:`heedful.memory`): ``checkpoint`` runs the
        blocks with per-block gradient checkpointing for a backward through this pass, and it,
        ``release`` and ``prefill`` give the heap's free pages back after each block's forward
        and backward (:meth:`checkpointed`); ``prefill`` (decoders, no attention probabilities)
        runs the positions
        in chunks of ``prefill`` with the key/value cache -- attention over ``prefill x N``
        instead of ``N x N`` per block -- with the same outputs (beyond float rounding).
        """
        wanted = active_precision()
        if wanted != self.precision and self.precision == "fp32":  # inside forward_precision(...)
            lowered = self.at_precision(wanted)
            if inputs_embeds is not None:
                inputs_embeds = inputs_embeds.to(lowered.word_embeddings.weight.dtype)
            found = lowered.forward(
                batch, anchor, input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                token_type_ids=token_type_ids, hidden_states=hidden_states, attentions=attentions, prefix=prefix,
                checkpoint=checkpoint, release=release, prefill=prefill,
            )
            dtype = self.word_embeddings.weight.dtype
            return Forward(
                found.logits.to(dtype),
                None if found.hidden_states is None else tuple(h.to(dtype) for h in found.hidden_states),
                None if found.attentions is None else tuple(a.to(dtype) for a in found.attentions),
            )
        mask = batch.attention_mask if attention_mask is None else attention_mask
        kwargs: dict = {"attention_mask": mask, "return_dict": True}
        if self.is_decoder:
            kwargs["use_cache"] = prefix is not None
        if prefix is not None:
            kwargs[self.cache_keyword] = self._prefix_cache(prefix)
        if inputs_embeds is not None:
            kwargs["inputs_embeds"] = inputs_embeds
        else:
            kwargs["input_ids"] = batch.input_ids if input_ids is None else input_ids
        types = batch.token_type_ids if token_type_ids is None else token_type_ids
        if types is not None and self.uses_token_types:
            rows = mask.shape[0]
            kwargs["token_type_ids"] = types if types.shape[0] == rows else types.repeat_interleave(
                rows // types.shape[0], dim=0
            )
        if hidden_states:
            kwargs["output_hidden_states"] = True
        if attentions:
            kwargs["output_attentions"] = True
        device = self.device  # the batch is tokenized on the CPU; the pass runs where the model is
        for key in ("input_ids", "inputs_embeds", "attention_mask", "token_type_ids"):
            if torch.is_tensor(kwargs.get(key)):
                kwargs[key] = kwargs[key].to(device)
        width = (inputs_embeds if inputs_embeds is not None else kwargs["input_ids"]).shape[1]
        chunked = prefill is not None and prefill < width  # chunked prefill runs near the budget
        bounded = (checkpoint or release) and torch.is_grad_enabled() or chunked
        blocks = self.checkpointed(checkpoint, release=True) if bounded else contextlib.nullcontext()
        with self._kernel_attention(not attentions) as fused, blocks, contextlib.ExitStack() as settings:
            if fused and self.is_decoder and not hidden_states and right_padded(mask) and self.unwindowed(width):
                # causal attention never reads right padding: without the padding mask the fused
                # kernel runs its causal path (no [B, H, N, N] mask or scores materialised), aligned
                # to the last key when the pass continues a cache; only padded positions' states
                # change, and none are returned
                kwargs["attention_mask"] = None
                settings.enter_context(_attention_set(self.config, CAUSAL_ATTENTION))
            read_inside = hidden_states or attentions or prefix is not None
            logits, hidden, probs = self._run_model(kwargs, mask, anchor, prefill if chunked else None, read_inside, settings)
        return Forward(
            logits=logits,
            hidden_states=tuple(hidden) if hidden_states else None,
            attentions=tuple(probs) if attentions else None,
        )

    def _run_model(
        self,
        kwargs: dict,
        mask: torch.Tensor,
        anchor: torch.Tensor,
        prefill: int | None,
        read_inside: bool,
        settings: contextlib.ExitStack,
    ) -> tuple[torch.Tensor, Sequence[torch.Tensor] | None, Sequence[torch.Tensor] | None]:
        """The pass of :meth:`forward` once its keywords are set (``kwargs``: the backbone's,
        ``mask`` ``[B, N]`` the batch's own): the head's logits at ``anchor`` (``[B, C]``, or
        ``[B, K, C]`` for ``[B, K]`` anchors), every layer's hidden states and attention
        probabilities as the backbone returned them (``None`` where not asked for), the rows
        counted. ``prefill``: run the positions in chunks of that size (:meth:`_prefilled`);
        ``settings``: the pass's open contexts, which the anchored last block
        (:meth:`_anchored`) joins unless something is ``read_inside`` the model."""
        if prefill is not None:
            if kwargs.get("output_attentions"):
                raise InputError("attention probabilities cannot be kept in a forward run in position chunks")
            last, hidden = self._prefilled(kwargs, prefill)
            probs = None
        else:
            settings.enter_context(self._anchored(mask, anchor, read_inside=read_inside))
            out = self.backbone(**kwargs)
            last, hidden, probs = out.last_hidden_state, out.hidden_states, out.attentions
        self.counter.forward += last.shape[0]
        rows = torch.arange(last.shape[0], device=last.device)
        if anchor.dim() == 2:  # a span: K positions per example -> [B, K, C]
            rows = rows[:, None]
        return self.head_logits(last[rows, anchor.to(last.device)]), hidden, probs

    def _prefilled(self, kwargs: dict, size: int) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """The backbone's pass of ``kwargs`` run ``size`` positions at a time, each chunk
        attending to the key/value cache of the positions before it (chunked prefill; decoders
        only): the last hidden state ``[B, N, D]`` and, when asked for, every layer's hidden
        states ``L + 1`` x ``[B, N, D]``, filled chunk by chunk."""
        from transformers import DynamicCache

        if not self.is_decoder:
            raise InputError(f"a {self.family} model has no key/value cache to run positions in chunks with")
        kwargs = dict(kwargs)
        key = "inputs_embeds" if "inputs_embeds" in kwargs else "input_ids"
        inputs, mask = kwargs.pop(key), kwargs.pop("attention_mask")  # None: causal over right padding
        kwargs.pop("use_cache", None)
        name = self.cache_keyword
        cache = kwargs.pop(name, None) or DynamicCache()
        past = cache.get_seq_length()
        width = inputs.shape[1]
        last: torch.Tensor | None = None
        hidden: list[torch.Tensor] | None = None
        for start in range(0, width, size):
            end = min(width, start + size)
            out = self.backbone(
                **kwargs,
                **{key: inputs[:, start:end]},
                attention_mask=None if mask is None else mask[:, : past + end],
                **{name: cache},
                use_cache=True,
            )
            part = out.last_hidden_state
            if last is None:
                last = part.new_empty(part.shape[0], width, part.shape[-1])
                if out.hidden_states is not None:
                    hidden = [h.new_empty(h.shape[0], width, h.shape[-1]) for h in out.hidden_states]
            last[:, start:end] = part
            for full, h in zip(hidden or (), out.hidden_states or (), strict=True):
                full[:, start:end] = h
            del out, part
            release_heap()  # the cache grows by concatenation: give the freed copies back
        return last, hidden

    def _anchored(self, mask: torch.Tensor, anchor: torch.Tensor, read_inside: bool) -> contextlib.AbstractContextManager:
        """The last block computed at ``anchor`` ``[B]`` only (:mod:`heedful.adapters.anchored`)
        when nothing can tell: a no-gradient pass of a classifier or regressor whose family has
        :attr:`anchored_blocks`, one anchor per row, absolute positions, nothing ``read_inside``
        the model (hidden states, attention probabilities, a continued cache), no open
        interception and no hook on the last block; otherwise nothing changes."""
        block = self.blocks[-1] if self.anchored_blocks else None
        if (
            block is None
            or read_inside
            or anchor.dim() != 1
            or torch.is_grad_enabled()
            or self.task not in ("classification", "regression")
            or getattr(self.config, "position_embedding_type", "absolute") != "absolute"
            or self.hf_model.training
            or intercepting(self.hf_model)
            or hooked(block)
        ):
            return contextlib.nullcontext()
        return anchored_last_block(block, self.block_roles(block), mask, anchor.to(mask.device), self.config.num_attention_heads)

    def unwindowed(self, width: int) -> bool:
        """Whether every layer attends to all earlier positions of a ``width``-position pass:
        no layer has a sliding window shorter than ``width`` (Gemma 2 and 3, Mistral, Qwen3 with
        ``use_sliding_window``), so that plain causal attention computes every layer."""
        window = getattr(self.config, "sliding_window", None)
        if not window or getattr(self.config, "use_sliding_window", True) is False:
            return True
        kinds = getattr(self.config, "layer_types", None)
        return width <= int(window) or (kinds is not None and "sliding_attention" not in kinds)

    @contextlib.contextmanager
    def _kernel_attention(self, wanted: bool) -> Iterator[bool]:
        """Inside the block, attention runs as PyTorch's fused ``scaled_dot_product_attention``
        when ``wanted`` and the model otherwise runs plain eager attention: a pass that returns
        no attention probabilities needs no ``[B, H, N, N]`` matrix (memory linear in the
        length on a CPU, and faster). An interception (its own attention) and families that
        compute attention inline are left as they are, and so is any pass inside an open
        interception (its rules see the model exactly as it was built). Yields whether the fused
        kernel runs."""
        config = self.config
        switch = (
            wanted
            and self.kernel_attention
            and getattr(config, "_attn_implementation", None) == "eager"
            and not intercepting(self.hf_model)
        )
        if not switch:
            yield False
            return
        config._attn_implementation = "sdpa"
        try:
            yield True
        finally:
            config._attn_implementation = "eager"

    @torch.no_grad()
    def prefix_states(self, batch: Batch) -> PrefixStates:
        """The key/value cache of one pass over ``batch`` (decoders only; right padding leaves
        every real position's states as they are)."""
        if not self.is_decoder:
            raise InputError(f"a {self.family} model has no key/value cache", hint="reuse prefixes with decoders only")
        mask = batch.attention_mask
        causal = right_padded(mask) and self.unwindowed(mask.shape[1])
        with self._kernel_attention(True) as fused, _attention_set(self.config, CAUSAL_ATTENTION if fused and causal else None):
            out = self.backbone(
                input_ids=batch.input_ids, attention_mask=None if fused and causal else mask, use_cache=True,
                return_dict=True,
            )
        self.counter.forward += len(batch)
        layers = out[self.cache_keyword].layers
        return PrefixStates(tuple(layer.keys for layer in layers), tuple(layer.values for layer in layers))

    def _prefix_cache(self, prefix: tuple[PrefixStates, torch.Tensor, int]):
        from transformers import DynamicCache

        states, rows, length = prefix
        cache = DynamicCache()
        for layer, (keys, values) in enumerate(zip(states.keys, states.values, strict=True)):
            cache.update(keys[rows, :, :length], values[rows, :, :length], layer)
        return cache

    def head_logits(self, h: torch.Tensor, columns: torch.Tensor | None = None) -> torch.Tensor:
        """Head-on-top applied to representations ``h`` ``[M, D]``.

        Without ``columns``: all outputs ``[M, C]`` (C = classes, 1 for regression, V for LMs).
        With ``columns`` ``[M, K]``: only those outputs ``[M, K]`` -- for LM heads this avoids the
        full vocabulary projection.
        """
        if self.task in ("classification", "regression"):
            logits = self.classification_head(h)
            return logits if columns is None else logits.gather(1, columns)
        parts = self.lm_head_parts()
        if columns is None or parts is None:
            logits = self.lm_head_full(h)
            return logits if columns is None else logits.gather(1, columns)
        feats = parts.transform(h)  # [M, E]
        w = parts.weight[columns]  # [M, K, E]
        out = torch.einsum("me,mke->mk", feats, w)
        return parts.capped(out if parts.bias is None else out + parts.bias[columns])

    def head_at_layer(
        self, h: torch.Tensor, layer: int, columns: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Head applied to a layer-``layer`` representation ``[M, D]`` (logit lens).

        ``hidden_states[L]`` already carries the final norm of pre-LN decoders; at intermediate
        layers it is applied here before the head.
        """
        if layer < self.num_layers and self.final_norm is not None:
            h = self.final_norm(h)
        return self.head_logits(h, columns)

    def grad(self, output: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """``d sum(output) / d inputs`` (one backward pass over ``output.shape[0]`` sequences)."""
        self.counter.backward += output.shape[0]
        (g,) = torch.autograd.grad(interruptible(output.sum()), inputs)  # Ctrl-C lands mid-pass
        return g


def _lone_surrogate(text: str) -> int | None:
    """Where ``text`` holds a surrogate code point (which UTF-8 cannot encode), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
