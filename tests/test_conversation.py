"""Conversations: messages in the chat template, the template's tokens special, the turns as
sources -- and a planted answer's turn ranked first by the context methods."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch
from conftest import run_cli, saved_tiny

import heedful
from heedful.engine.conversation import template
from heedful.errors import InputError
from heedful.loading import from_pretrained_objects
from heedful.testing import tiny_hf

TEMPLATE = (
    "{% if messages[0]['role'] != 'system' %}<|system|>You are a helpful assistant\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
"""A chat template that writes a default system prompt, as many chat models' templates do."""

PLANTED = "Z"
"""One token of the tiny byte-level tokenizer, written only in the notes' turn."""
CONVERSATION = [
    {"role": "system", "content": "Answer with one word from the notes."},
    {"role": "user", "content": "Notes: the animal in the yard is Z."},
    {"role": "user", "content": "Which animal is in the yard?"},
]


@pytest.fixture(scope="module")
def planted():
    """A tiny Llama whose next-token logit of ``PLANTED`` grows with how much of the context is
    that token: every block adds nothing but block 0's attention, whose queries are zero (so the
    last position averages every earlier value) and whose values carry only coordinate 0 of the
    normalised embeddings, which only ``PLANTED``'s embedding -- tied to its output row -- has."""
    hf, shared = tiny_hf("llama", "causal_lm", max_position_embeddings=512)
    tokenizer = copy.deepcopy(shared)  # the tiny tokenizers are shared by every tiny model
    tokenizer.chat_template = TEMPLATE
    tokenizer.model_max_length = 512
    model = from_pretrained_objects(hf, tokenizer, name="planted")
    (token,) = model.tokenizer(PLANTED, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        emb = hf.get_input_embeddings().weight
        emb[:, 0] = 0.0
        emb[token] = 0.0
        emb[token, 0] = 1.0
        hf.lm_head.weight[token] = 0.0
        hf.lm_head.weight[token, 0] = 50.0
        for k, layer in enumerate(hf.model.layers):
            layer.mlp.down_proj.weight.zero_()
            layer.self_attn.o_proj.weight.zero_()
            if k == 0:
                layer.self_attn.q_proj.weight.zero_()
                layer.self_attn.v_proj.weight.zero_()
                layer.self_attn.v_proj.weight[0, 0] = 1.0
                layer.self_attn.o_proj.weight[0, 0] = 1.0
    return model


def test_turns_are_found_after_a_default_system_prompt_and_the_template_is_special(planted):
    chat = [{"role": "user", "content": "You are"}, {"role": "assistant", "content": "a helpful assistant"}]
    found = template(planted.tokenizer, chat)
    assert [found.text[s:e] for s, e in found.turns] == ["You are", "a helpful assistant"]
    assert found.text.startswith("<|system|>You are a helpful assistant\n<|user|>You are")
    e = planted.explain(CONVERSATION, "saliency")
    kept = [t for t, special in zip(e.raw_tokens, e.special, strict=True) if not special]
    assert planted.tokenizer.convert_tokens_to_string(kept) == "".join(m["content"] for m in CONVERSATION)


@pytest.mark.parametrize("method", ["source_loo", "context_cite"])
def test_a_planted_answers_turn_ranks_first(planted, method):
    e = planted.explain(CONVERSATION, method, target=PLANTED, sources="messages")
    ranked = e.source_scores().ranked()
    assert len(ranked) == 3
    assert ranked[0][1] == CONVERSATION[1]["content"], ranked


def test_context_methods_rank_the_messages_of_a_conversation_by_default(planted):
    e = planted.explain(CONVERSATION, "source_loo", target=PLANTED)
    assert [text for _, text, _ in e.source_scores().ranked()][0] == CONVERSATION[1]["content"]
    several = planted.explain([CONVERSATION, CONVERSATION[1:]], "source_loo", target=PLANTED)
    assert [len(x.source_scores().ranked()) for x in several] == [3, 2]


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "user", "content": ""}], "message 0 (user) has no text content"),
        ([{"role": "", "content": "hi"}], "message 0 has no role"),
        ([{"role": "user", "content": 3}], "has no text content"),
    ],
)
def test_bad_messages_are_one_line(planted, messages, says):
    with pytest.raises(InputError, match=re.escape(says)):
        planted.explain(messages, "saliency")


def test_messages_as_sources_need_a_conversation(planted):
    with pytest.raises(InputError, match='sources="messages" needs a conversation'):
        planted.explain("just text", "source_loo", sources="messages")


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory, planted):
    folder = tmp_path_factory.mktemp("chat")
    planted.hf_model.save_pretrained(folder)
    planted.tokenizer.save_pretrained(folder)
    return str(folder)


def test_cli_ranks_the_turns_of_a_chat_file(monkeypatch, capsys, chat_dir, tmp_path):
    path = tmp_path / "conversation.json"
    path.write_text(json.dumps(CONVERSATION), encoding="utf-8")
    code, out, err = run_cli(
        monkeypatch, capsys, "explain", "--chat-file", str(path), "--model", chat_dir, "--method", "source_loo",
        "--target", PLANTED, "--json",
    )
    assert code == 0, err
    found = json.loads(out)
    found = found[0] if isinstance(found, list) else found
    assert found.pop("source_scores")["words"][0] == CONVERSATION[0]["content"]
    found = heedful.Explanation.from_dict(found)
    assert found.source_scores().ranked()[0][1] == CONVERSATION[1]["content"]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "is not JSON"),
        ('{"role": "user"}', "a list of messages"),
        ('[{"role": "user", "content": ""}]', "has no text content"),
    ],
)
def test_cli_bad_chat_files_exit_2(monkeypatch, capsys, tmp_path, content, says):
    path = tmp_path / "conversation.json"
    path.write_text(content, encoding="utf-8")
    folder = saved_tiny(tmp_path / "lm", "llama", "causal_lm")
    code, _, err = run_cli(monkeypatch, capsys, "explain", "--chat-file", str(path), "--model", folder, "--method", "source_loo")
    assert code == 2 and says in err, err
    assert heedful  # the package imports without a model hub
