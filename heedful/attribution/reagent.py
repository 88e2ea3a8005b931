"""ReAGent (Zhao & Shan 2024): token importance updated recursively from how the target's
probability survives random replacements of context tokens, until the top-ranked tokens alone
keep the target among the model's top predictions.

Every step runs, for all live chains of all examples at once, one batched pass of the replaced
copies (the update) and one of the copies that keep only each chain's top tokens (the stopping
test), through :class:`~heedful.engine.runner.Runner` (chunked under the memory budget).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

import torch

from heedful.attribution._masks import Features, features_of, to_tokens
from heedful.engine.memory import Need
from heedful.engine.options import AT_LEAST_ONE, OPEN_UNIT, RUNTIME
from heedful.engine.problem import Problem
from heedful.engine.runner import Chunk, Copies, Runner
from heedful.engine.seeding import example_generators
from heedful.errors import InputError
from heedful.progress import task
from heedful.registry import register

Replacement = Literal["auto", "lm", "uniform"]
LOGIT_EPS = 1e-6
"""``logit(0.5 + 0.5 * delta)`` is clamped to ``[eps, 1 - eps]``: a replacement that takes the
whole probability away (``delta = +-1``) moves a score by ``+-13.8``, not infinity."""
LM_TASKS = ("causal_lm", "masked_lm")


def _passes(options: Mapping[str, Any], tokens: int) -> tuple[float, float]:
    # "auto" resolves per task, unknown here: count the passes "lm" may run (a masked LM's: one per token)
    lm = options["replacement"] != "uniform"
    return (1 + (tokens if lm else 0) + 2 * options["chains"] * options["max_steps"], 0)


def start_token(tokenizer) -> int:
    """The token a causal LM's first word is predicted from: BOS, else EOS, else pad (GPT-2's
    ``<|endoftext|>`` starts its documents)."""
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        found = getattr(tokenizer, name, None)
        if found is not None:
            return int(found)
    raise InputError("this tokenizer has no BOS, EOS or pad token to predict the first word from", hint="use replacement='uniform'")


def lm_replacements(problem: Problem, features: Features, internal_batch_size: int | None) -> torch.Tensor:
    """The explained language model's own most probable token other than the original at every
    feature, ``[B, M]`` (special tokens never proposed; ties to the lowest id): a causal LM's
    prediction of token ``i`` from ``x_<i`` (the first word from :func:`start_token` alone), in
    one pass over the batch read at every position; a masked LM's prediction at ``i`` with ``i``
    masked, one copy per token (as the paper's RoBERTa predicts). Chunked under the memory budget."""
    batch, adapter = problem.batch, problem.adapter
    device = batch.input_ids.device
    special = torch.tensor(sorted(set(adapter.tokenizer.all_special_ids)), dtype=torch.long, device=device)
    runner = Runner.for_problem(problem, rows=internal_batch_size)

    def best_other(logits: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        logits = logits.float().clone()
        logits[..., special[special < logits.shape[-1]].to(logits.device)] = -torch.inf
        logits.scatter_(-1, own.to(logits.device)[..., None].clamp(max=logits.shape[-1] - 1), -torch.inf)
        return logits.argmax(dim=-1)  # ties: the lowest id

    if problem.target.task == "masked_lm":
        example, which = features.valid.nonzero(as_tuple=True)
        at = features.positions[example, which]
        own = batch.input_ids[example, at]
        ids = batch.input_ids[example].clone()
        ids[torch.arange(len(example), device=device), at] = adapter.tokenizer.mask_token_id
        types = None if batch.token_type_ids is None else batch.token_type_ids[example]
        copies = Copies(example, ids, batch.attention_mask[example], types, anchor=at)
        found = runner.map(copies, lambda chunk, fwd: best_other(fwd.logits, own[chunk.rows]))
        best = torch.zeros(features.positions.shape, dtype=torch.long, device=device)
        best[example, which] = found.to(best)
        return best
    bsz, seq = batch.input_ids.shape
    ids, mask = batch.input_ids, batch.attention_mask
    read = torch.arange(seq, device=device).expand(bsz, seq)  # where the head predicts each token
    # each row continues a start token when its first token is content (no BOS of its own)
    lead = batch.content_mask[:, 0]
    start = torch.full((bsz, 1), start_token(adapter.tokenizer), dtype=ids.dtype, device=device)
    pad = torch.full((bsz, 1), adapter.pad_token_id, dtype=ids.dtype, device=device)
    ids = torch.where(lead[:, None], torch.cat([start, ids], dim=1), torch.cat([ids, pad], dim=1))
    ones = torch.ones_like(mask[:, :1])
    mask = torch.where(lead[:, None], torch.cat([ones, mask], dim=1), torch.cat([mask, torch.zeros_like(ones)], dim=1))
    read = torch.where(lead[:, None], read, (read - 1).clamp(min=0))
    best = torch.zeros(bsz, seq, dtype=torch.long, device=device)
    for rows, width in runner.plan(mask.sum(dim=1), need=Need(anchors=seq), mask=mask):
        logits = adapter.forward(batch, read[rows].clamp(max=width - 1), input_ids=ids[rows, :width], attention_mask=mask[rows, :width]).logits
        best[rows] = best_other(logits, batch.input_ids[rows]).to(best)  # [r, N]
    return best.gather(1, features.positions.clamp(min=0)) * features.valid


def _read(k: int):
    """A runner reader: the target's probability ``[r]`` and whether its column ranks among the
    ``k`` largest logits ``[r]``."""

    def read(chunk: Chunk, fwd) -> tuple[torch.Tensor, torch.Tensor]:
        logits = fwd.logits.float()
        target = chunk.target
        column = target.classes[:, int(target.weights.argmax())]  # the target's (positive) column
        rows = torch.arange(logits.shape[0], device=logits.device)
        above = (logits > logits[rows, column.to(logits.device)][:, None]).sum(dim=1)
        ranked = logits.shape[-1] > 1  # one output (regression) has no ranking to keep the target in
        return target.output(logits, "probability"), ((above < k) & ranked).to(logits.dtype)

    return read


@register(
    "reagent",
    family="perturbation",
    tasks=("classification", "regression", "masked_lm", "causal_lm"),
    cost="1 + 2 x chains x steps forwards, steps <= max_steps (stops early; batched per step); replacement='lm' +1 (causal LM) or +N (masked LM)",
    passes=_passes,
)
@torch.no_grad()
def reagent(
    problem: Problem,
    *,
    chains: Annotated[int, AT_LEAST_ONE] = 3,
    ratio: Annotated[float, OPEN_UNIT] = 0.3,
    keep: Annotated[int, AT_LEAST_ONE] = 3,
    top_k: Annotated[int, AT_LEAST_ONE] = 3,
    max_steps: Annotated[int, AT_LEAST_ONE] = 1000,
    replacement: Replacement = "auto",
    seed: int | None = 0,
    internal_batch_size: Annotated[int | None, AT_LEAST_ONE, RUNTIME] = None,
) -> torch.Tensor:
    """Importance of each token as ReAGent's recursive updates from random token replacements leave it.

    Each of ``chains`` independent chains holds logit-scale scores ``s`` over the ``M`` removable
    tokens, drawn ``U(0, 1)``. One step: replace each token with probability ``ratio`` (the set
    ``R``), measure ``delta = p(y | x) - p(y | x_R replaced)`` of the explained target ``y``,
    and update ``s_i += logit(1/2 + delta/2)`` for ``i`` in ``R`` and ``s_i += logit(1/2 -
    delta/2)`` for the others (the paper's update, ``logit`` clamped to ``[1e-6, 1 - 1e-6]``).
    The chain stops once the ``keep`` tokens of highest ``softmax(s)`` alone -- every other token
    replaced -- keep ``y`` among the model's ``top_k`` outputs (``top_k`` capped at ``C - 1`` of
    ``C`` outputs, so that a two-class head asks for the prediction itself), or after
    ``max_steps`` (always, for a regression head: one output has no ranking; its ``p`` is the
    value). The scores are ``softmax(s)`` averaged over the chains that stopped (over all
    of them when none did) ``[B, N]``, 0 for special tokens; they sum to 1 per text.
    ``details``: ``steps`` (the steps run) and ``stopped`` (the chains that stopped).

    It optimises no evaluation metric directly: the stopping rule is a sufficiency test (the
    top ``keep`` tokens suffice for the target), the update a comprehensiveness signal.

    ``replacement`` -- what a replaced token becomes. The paper uses RoBERTa's masked-LM
    predictions; heedful loads no second model, so ``"lm"`` (``"auto"`` for language models)
    takes the explained model's own most probable token other than the original -- a causal
    LM's prediction of token ``i`` from the tokens before it (one more pass), a masked LM's
    prediction of token ``i`` masked (``M`` more) -- in-distribution for the model and in its
    own vocabulary; ``"uniform"``
    (``"auto"`` for classifiers, which have no LM head) draws any non-special token of the
    vocabulary, as the authors' uniform sampler does. Defaults follow the paper: ``ratio`` 0.3,
    ``keep`` 3, ``top_k`` 3; 3 chains as the authors' code (which also takes 3000 steps at
    most).

    Cost: ``1 + 2 x chains x steps`` forwards (``"lm"``: +1 on a causal LM, +M on a masked LM),
    all live chains of all examples in two batched passes per step.

    Source: Zhao & Shan 2024, ReAGent: A Model-agnostic Feature Attribution Method for Generative
    Language Models (AAAI ReLM workshop), Sec. 3 (recursive updates and the top-k stopping rule)
    """
    batch, target = problem.batch, problem.target
    task_name = target.task
    if replacement == "auto":
        replacement = "lm" if task_name in LM_TASKS else "uniform"
    if replacement == "lm" and task_name not in LM_TASKS:
        raise InputError(f"reagent: replacement='lm' needs a language model's head; this model's task is {task_name}", hint="use replacement='uniform'")
    if target.is_span:
        raise InputError("reagent explains one position's target, not a span", hint="explain one token at a time")
    features = features_of(batch, target)
    bsz, width = features.positions.shape
    device = batch.input_ids.device
    counts = features.counts.tolist()
    gens = example_generators(batch, seed)
    vocab = [i for i in range(len(problem.adapter.tokenizer)) if i not in set(problem.adapter.tokenizer.all_special_ids)]
    candidates = torch.tensor(vocab, dtype=torch.long, device="cpu")
    fixed = lm_replacements(problem, features, internal_batch_size) if replacement == "lm" else None
    k = max(1, min(top_k, problem.reference.logits.shape[-1] - 1))
    original = target.output(problem.reference.logits, "probability").double()  # [B]
    runner = Runner.for_problem(problem, rows=internal_batch_size)
    read = _read(k)
    cpu = torch.device("cpu")

    logit_s = torch.zeros(bsz, chains, width, dtype=torch.float64, device=cpu)
    for b, m in enumerate(counts):
        logit_s[b, :, :m] = torch.rand((chains, m), generator=gens[b], dtype=torch.float64, device=cpu)
    valid = features.valid.cpu()[:, None, :].expand(bsz, chains, width)
    live = (features.counts.cpu() > 0)[:, None].repeat(1, chains)  # [B, W]
    stopped = torch.zeros(bsz, chains, dtype=torch.bool, device=cpu)
    steps = [0] * bsz

    at = features.positions.clamp(min=0).to(batch.input_ids.device)
    kept_ids = batch.input_ids.gather(1, at).cpu()  # [B, M] each feature's own token
    column = torch.where(features.valid, features.positions, batch.seq_len).cpu()  # padding features -> column N

    def run(replace: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The chains ``rows`` ``[R, 2]`` (example, chain), their ``replace``d features
        ``[B, W, M]`` set to ``tokens`` ``[B, W, M]`` -> (probability, in the top k) ``[R]``."""
        example, chain = rows[:, 0], rows[:, 1]
        new = torch.where(replace[example, chain], tokens[example, chain], kept_ids[example])
        ids = batch.input_ids[example.to(batch.input_ids.device)].cpu()
        ids = torch.cat([ids, ids[:, :1]], dim=1).scatter(1, column[example], new)[:, :-1]
        on = example.to(batch.attention_mask.device)
        types = None if batch.token_type_ids is None else batch.token_type_ids[on]
        copies = Copies(example.to(device), ids.to(batch.input_ids.device), batch.attention_mask[on], types)
        prob, top = runner.map(copies, read)
        return prob.double().cpu(), top.bool().cpu()

    def draws(active: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This step's draws of the live examples, in the oracle's order: the replaced set, then
        (uniform replacement) the update's tokens and the stopping test's tokens, each
        ``[chains, M_b]``."""
        chosen = torch.zeros(bsz, chains, width, dtype=torch.bool, device=cpu)
        update = torch.zeros(bsz, chains, width, dtype=torch.long, device=cpu)
        test = torch.zeros(bsz, chains, width, dtype=torch.long, device=cpu)
        for b in active:
            m, g = counts[b], gens[b]
            chosen[b, :, :m] = torch.rand((chains, m), generator=g, device=cpu) < ratio
            if fixed is None:
                update[b, :, :m] = candidates[torch.randint(len(candidates), (chains, m), generator=g, device=cpu)]
                test[b, :, :m] = candidates[torch.randint(len(candidates), (chains, m), generator=g, device=cpu)]
        if fixed is not None:
            update = test = fixed.cpu()[:, None, :].expand(bsz, chains, width)
        return chosen, update, test

    with task(f"reagent steps ({bsz} texts)", total=max_steps) as progress:
        for _ in range(max_steps):
            active = [b for b in range(bsz) if bool(live[b].any())]
            if not active:
                break
            chosen, update, test = draws(active)
            for b in active:
                steps[b] += 1
            rows = live.nonzero()
            prob, _ = run(chosen & valid, update, rows)
            delta = (original.cpu()[rows[:, 0]] - prob)[:, None]  # [R, 1]
            signed = torch.where(chosen[rows[:, 0], rows[:, 1]], delta, -delta)
            moved = torch.logit(0.5 + 0.5 * signed, eps=LOGIT_EPS)
            logit_s[rows[:, 0], rows[:, 1]] += torch.where(valid[rows[:, 0], rows[:, 1]], moved, 0.0)
            scores = _softmax(logit_s, valid)
            rank = scores.argsort(dim=2, descending=True, stable=True).argsort(dim=2)
            replaced = valid & (rank >= keep)
            _, hit = run(replaced, test, rows)
            stopped[rows[:, 0], rows[:, 1]] = hit
            live = live & ~stopped
            progress.advance()
    scores = _softmax(logit_s, valid)
    use = torch.where(stopped.any(dim=1, keepdim=True), stopped, torch.ones_like(stopped))
    mean = (scores * use[..., None]).sum(dim=1) / use.sum(dim=1, keepdim=True)  # [B, M]
    problem.details.update({"steps": steps, "stopped": stopped.sum(dim=1).tolist()})
    dtype = problem.reference.logits.dtype
    return to_tokens(features, mean.to(device=device, dtype=dtype), batch.seq_len)


def _softmax(logit_s: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``softmax(s)`` over each chain's valid features ``[B, W, M]`` (0 on padding features)."""
    masked = torch.where(valid, logit_s, -torch.inf)
    found = torch.softmax(masked, dim=2)
    return torch.where(valid, found, 0.0).nan_to_num(0.0)
