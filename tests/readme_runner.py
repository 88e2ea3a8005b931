"""Runs README.md's examples in this process, for tests/test_readme.py (one fresh interpreter
per call, in a scratch folder):

    python tests/readme_runner.py tiny|zoo python     # the README's Python block
    python tests/readme_runner.py tiny|zoo commands CMD ...   # README command lines, in order

``tiny``: the zoo names the examples use load tiny seeded stand-ins of the same task
(:func:`heedful.testing.tiny_hf`: a BERT classifier for ``minilm-sentiment``, a Llama causal LM
with a chat template for ``smollm2-135m``), so that every example runs in seconds on any
machine; ``zoo``: the zoo models themselves (the slow suite). The files the examples read
(``long_doc.txt``, ``reviews.txt``, ...) are written first. Expression statements whose value
the README states (``e.top(3)  # [('charming', ...), ...]``) are checked against it.
"""

from __future__ import annotations

import ast
import io
import math
import re
import shlex
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SENTENCES = [
    "The film opens in a small town by the sea.",
    "Its lead actor gives a warm and generous performance.",
    "The plot moves slowly but never drags.",
    "Critics praised the music and the photography.",
    "Audiences left the theatre smiling.",
    "Overall the review of this movie is",
]


def python_block(text: str | None = None) -> str:
    """The README's Python example (its one ```python block)."""
    blocks = re.findall(r"```python\n(.*?)```", text or README.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, f"README.md has {len(blocks)} python blocks; tests/test_readme.py runs one"
    return blocks[0]


def command_lines(text: str | None = None) -> list[str]:
    """Every command of the README's bash blocks, continuation lines joined, comments dropped,
    ``a && b`` as two commands; each as its words quoted (a redirection ``>`` left bare)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text or README.read_text(encoding="utf-8"), re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            while words:
                cut = words.index("&&") if "&&" in words else len(words)
                found.append(" ".join(w if w == ">" else shlex.quote(w) for w in words[:cut]))
                words = words[cut + 1 :]
    return found


def write_inputs(folder: Path, zoo: bool) -> None:
    """The files the examples read, as a user would have them."""
    sentences = SENTENCES * (5 if zoo else 1)  # ~30 sentences on the zoo model, as in the issue
    (folder / "long_doc.txt").write_text(" ".join(sentences) + "\n", encoding="utf-8")
    (folder / "reviews.txt").write_text("great acting\na dull, lifeless plot\n", encoding="utf-8")
    (folder / "context.txt").write_text(
        "The match was played in Rome.\n\nThe blue team won by two goals.\n\nThe crowd went home happy.\n", encoding="utf-8"
    )
    (folder / "prompts.jsonl").write_text(
        '{"prompt": "The capital of France is"}\n{"prompt": "Rome is", "continuation": " a capital"}\n', encoding="utf-8"
    )
    (folder / "conversation.json").write_text(
        '[{"role": "system", "content": "Answer from the notes."},'
        ' {"role": "user", "content": "Notes: the match was played in Rome. The blue team won."},'
        ' {"role": "user", "content": "Who won the match?"}]\n',
        encoding="utf-8",
    )
    from heedful.tiny_seq2seq import build_tiny_marian

    build_tiny_marian(folder / "opus-mt-en-de")  # a translation model, seeded: no hub here
    (folder / "mydata.csv").write_text(
        "text,label,evidence\n"
        "a charming and often affecting journey,1,charming|affecting\n"
        "a dull and lifeless plot,0,dull|lifeless\n"
        "great acting,1,great\n",
        encoding="utf-8",
    )


def use_stand_ins(folder: Path) -> None:
    """``heedful.load`` of a zoo name the examples use loads a tiny model of the same task."""
    from tokenizers import AddedToken

    import heedful
    import heedful.loading
    from heedful.testing import tiny_hf

    stand_ins = {"minilm-sentiment": ("bert", "classification"), "smollm2-135m": ("llama", "causal_lm")}
    paths = {}
    for name, (family, task) in stand_ins.items():
        hf_model, tokenizer = tiny_hf(family, task, max_position_embeddings=512)
        tokenizer.model_max_length = 512
        if task == "causal_lm":
            tokenizer.chat_template = CHAT_TEMPLATE
            # one token, as in SmolLM2's vocabulary: the README explains it with single-position methods
            tokenizer.add_tokens([AddedToken(" Paris", normalized=False)])
            hf_model.resize_token_embeddings(len(tokenizer))
        hf_model.save_pretrained(folder / f"tiny-{name}")
        tokenizer.save_pretrained(folder / f"tiny-{name}")
        paths[name] = str(folder / f"tiny-{name}")
    real = heedful.loading.load

    def load(name_or_path, *args, **kwargs):
        return real(paths.get(str(name_or_path), name_or_path), *args, **kwargs)

    heedful.load = heedful.loading.load = load
    learn_at2_heads(folder, paths["smollm2-135m"])


def learn_at2_heads(folder: Path, model: str) -> None:
    """AT2's head weights ship for ``smollm2-135m`` only: its stand-in learns its own, as a user
    does for another decoder (``heedful at2 train``, on a few short documents), into a cache kept
    in ``folder``, where the ``at2`` method of this process looks them up."""
    from heedful.attribution import at2
    from heedful.cli import main as cli

    at2.cache_path = lambda fingerprint: folder / "at2" / f"{fingerprint}.json"
    argv = sys.argv
    sys.argv = ["heedful", "at2", "train", "--model", model, "--docs", "4", "--lengths", "256", "--ablations", "8", "--steps", "30"]
    try:
        cli()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise AssertionError(f"heedful at2 train on the stand-in exited with {exc.code}") from None
    finally:
        sys.argv = argv


def _top_is_charming(value, zoo: bool) -> None:
    assert len(value) == 3 and all(isinstance(w, str) and math.isfinite(s) for w, s in value), value
    if zoo:
        assert value[0][0] == "charming", value


def _ranked(value, zoo: bool) -> None:
    assert 1 <= len(value) <= 3 and all(isinstance(i, int) and isinstance(t, str) and math.isfinite(s) for i, t, s in value), value
    if zoo:  # the sources are the document's sentences
        assert all(t.strip() in " ".join(SENTENCES) for _, t, _ in value), value


def _details(value, zoo: bool) -> None:
    assert {"intercept", "r2", "lds"} <= set(value), value


def _generation_scores(value, zoo: bool) -> None:
    assert value.ndim == 2 and value.shape[0] >= 1, value.shape


def _generated(value, zoo: bool) -> None:
    tokens, probabilities = value
    assert len(tokens) == len(probabilities) >= 1 and all(0 < p <= 1 for p in probabilities), value


def _three(value, zoo: bool) -> None:
    assert len(value) == 3, value


def _sides(value, zoo: bool) -> None:
    (steps, source), (same, target) = value
    assert steps == same >= 1 and source == 6 and target == steps + 1, value  # 5 source tokens + </s>; decoder start + outputs


STATED = {
    "e.top(3)": _top_is_charming,
    "e.source_scores().ranked()[:3]": _ranked,
    "e.details": _details,
    "g.scores": _generation_scores,
    "(g.generated_tokens, g.probabilities)": _generated,
    "[lm.explain_generation(gen, m) for m in ('saliency', 'raw_attention', 'leave_one_out')]": _three,
    "(t.source_scores.shape, t.target_scores.shape)": _sides,
}
"""README expression -> the check of what the README says it gives (``ast.unparse`` spelling)."""


def run_python(zoo: bool) -> None:
    """Every statement of the README's Python block in order; the stated values checked."""
    code = python_block()
    scope: dict = {"__name__": "__readme__"}
    checked = set()
    for node in ast.parse(code).body:
        source = ast.unparse(node)
        if isinstance(node, ast.Expr):
            value = eval(compile(ast.Expression(node.value), "README.md", "eval"), scope)  # noqa: S307
            if source in STATED:
                STATED[source](value, zoo)
                checked.add(source)
        else:
            exec(compile(ast.Module([node], []), "README.md", "exec"), scope)  # noqa: S102
    missing = set(STATED) - checked
    assert not missing, f"README statements no longer found: {sorted(missing)}"
    print(f"ran {len(ast.parse(code).body)} statements, checked {len(checked)} stated values")


def run_commands(commands: list[str]) -> None:
    """Each command line through :func:`heedful.cli.main` (``> FILE`` sends its stdout there);
    a command that exits with an error stops the run with its stderr."""
    from heedful.cli import main

    for line in commands:
        words = shlex.split(line)
        target = None
        if ">" in words:
            target, words = Path(words[words.index(">") + 1]), words[: words.index(">")]
        assert words[0] == "heedful", line
        sys.argv = words
        buffer = io.StringIO()
        began, cpu = time.perf_counter(), time.process_time()
        try:
            with redirect_stdout(buffer):
                main()
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise AssertionError(f"`{line}` exited with {exc.code}") from None
        if target is not None:
            target.write_text(buffer.getvalue(), encoding="utf-8")
        print(f"\nok: {line}  ({time.perf_counter() - began:.1f} s, cpu {time.process_time() - cpu:.1f} s)", flush=True)


def main(argv: list[str]) -> None:
    mode, what, *commands = argv
    folder = Path.cwd()
    zoo = mode == "zoo"
    write_inputs(folder, zoo)
    if not zoo:
        use_stand_ins(folder)
    if what == "python":
        run_python(zoo)
    else:
        run_commands(commands)


if __name__ == "__main__":
    main(sys.argv[1:])
