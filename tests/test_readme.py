"""Every example of README.md runs as written (tests/readme_runner.py executes them): its
Python block statement by statement with the values it states checked, and every command line
of its bash blocks.

The default suite runs them on tiny stand-ins of the zoo models (same tasks, seconds); the slow
suite on the zoo models themselves, with the README's stated outputs checked for real
(``e.top(3)`` starting with 'charming'), plus the commands that need the movie-review data or a
zoo model's scale. Only what the README itself says takes hours is stubbed: the reproduction
reports run with their report writer replaced, in the slow suite. Every README command must be
listed in :data:`COMMANDS`, so a new example cannot go unrun.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from readme_runner import ROOT, command_lines

RUNNER = Path(__file__).resolve().parent / "readme_runner.py"

TINY, ZOO, HOURS, SETUP = "tiny", "zoo", "hours", "setup"
COMMANDS: dict[str, str] = {
    # set-up and development commands: the suite itself, or installing it (make demo's heedful
    # command is run below as the Makefile has it)
    "make demo": SETUP, "make test": SETUP, "make test-all": SETUP, "HEEDFUL_TEST_THREADS=2 make test": SETUP, "make lint": SETUP, "make bench": SETUP,
    "make bench-decomposition": SETUP, "pip install -e '.[serve]'": SETUP,
    # seconds on tiny stand-ins: the default suite (and the slow suite on the zoo models)
    "heedful explain 'a charming and often affecting journey'": TINY,
    "heedful explain 'a charming and often affecting journey' --method normxlogit --json": TINY,
    "heedful explain ... --method normxlogit --method saliency --method rollout": TINY,
    "heedful explain ... --target NEGATIVE --words --html expl.html": TINY,
    "heedful explain --file reviews.txt --method integrated_gradients -o n_steps=100 --json > out.json": TINY,
    "heedful explain 'The capital of France is' --model smollm2-135m --target ' Paris'": TINY,
    "heedful explain 'The capital of France is' --model smollm2-135m --generate 12 --method saliency --html gen.html": TINY,
    "heedful explain 'The capital of France is' --model smollm2-135m --continuation ' Paris.' --method grad_x_input --json": TINY,
    "heedful explain --file long_doc.txt --model smollm2-135m --target ' positive' --method context_cite --sources sentences": TINY,
    "heedful explain --file context.txt --query 'Q: Who won? A:' --model smollm2-135m --sources paragraphs --generate 8": TINY,
    "heedful explain --chat-file conversation.json --model smollm2-135m --method context_cite --generate 8": TINY,
    "heedful explain 'The house is wonderful.' --model opus-mt-en-de/ --continuation 'Das Haus ist wunderbar.' --method saliency --html translation.html": TINY,
    "heedful methods": TINY,
    "heedful methods --model smollm2-135m": TINY,
    "heedful info": TINY,
    "heedful models": TINY,
    "heedful models --sources": TINY,
    "heedful interest layers 'a charming and often affecting journey' --out layers.png": TINY,
    "heedful interest lambda-sweep 'a charming and often affecting journey' -w charming -w often --out lam.png": TINY,
    "heedful steer --prompt 'The impact of climate change has become more evident in recent years.' --suppress 'in recent years' --html steer.html": TINY,
    "heedful probe --model minilm-sentiment --property number --mdl --amnesic 1 --plot number.png": TINY,
    "heedful trace 'The capital of France is' --model smollm2-135m --corrupt France --target ' Paris'": TINY,
    "heedful steer --model smollm2-135m --vector caa --positive 'I love this' --negative 'I hate this' --layer 6 --coefficient 4 --prompt 'The movie was'": TINY,
    "heedful steer --model smollm2-135m --vector extract --sentence 'the taste is excellent!' --layer 6": TINY,
    "heedful bench --model smollm2-135m --dataset prompts.jsonl --methods random,saliency,grad_x_input --generate 20 --out results/": TINY,
    "heedful bench --model minilm-sentiment --dataset mydata.csv --methods saliency,normxlogit --metrics average_precision,dot_product,token_f1,iou,auprc --preset ferret --out results/": TINY,
    "heedful bench merge results/ shard1/ shard2/": TINY,
    "heedful bench dump results/ archive/": TINY,
    "heedful bench load archive/ elsewhere/": TINY,
    # the movie-review data, a zoo model's scale, a server or a Ray cluster: the slow suite
    "heedful models build smollm2-135m": ZOO,
    "heedful heads --model minilm-sentiment --dataset movies --out mask.json": ZOO,
    "heedful probe --model minilm-sentiment --property pos --layers all": ZOO,
    "heedful trace 'The capital of France is' --model smollm2-135m --counterfactual 'The capital of Italy is' --kind head --metric logit_diff --json": ZOO,
    # (the stand-in's tokenizer splits the two capitals into different lengths)
    "heedful counterfactual --model minilm-sentiment --dataset movies --n 100 --method saliency --method leave_one_out": ZOO,
    "heedful steer --sweep --model smollm2-135m --vector caa --positive 'I love this' --negative 'I hate this' --layer 6 --coefficients -4,0,1,2,4,8 -n 30 --out sweep.json": ZOO,
    "heedful steer --model smollm2-135m --vector iti --heads 16 --coefficient 5 --prompt 'The movie was'": ZOO,
    "heedful steer --sweep --model smollm2-135m --vector iti --heads 16 --coefficients 0,5,10,15,20 -n 30 --out sweep-iti.json": ZOO,
    "heedful rectify --model minilm-sentiment --dataset movies --method coperturbation,leave_one_out,random --sweep --out results/": ZOO,
    "heedful bench --model minilm-sentiment --dataset movies --methods random,grad_x_input,normxlogit --metrics aopc,sufficiency,accuracy,log_odds --preset normxlogit --n 200 --out results/": ZOO,
    "heedful bench --model smollm2-135m --dataset planted --option dataset.length=1024 --n 30 --methods random,saliency,grad_x_input,context_cite --metrics source_top1,source_top3,precision_at_k,source_comprehensiveness,lds --out results/": ZOO,
    "heedful bench --model minilm-sentiment --dataset movies --methods random,grad_x_input,normxlogit --metrics aopc --n 200 --engine ray --workers 2 --out results/": ZOO,
    "heedful bench ... --engine ray --address auto --out results/": ZOO,
    "heedful serve": ZOO,
    "heedful serve --model minilm-sentiment --model smollm2-135m --store results/": ZOO,
    "heedful reproduce mask-lrp --quick": ZOO,
    "heedful reproduce mask-lrp -O only=planted --quick": ZOO,
    "heedful reproduce lecture --quick": ZOO,
    # the full reproduction reports (hours): run with the report writer stubbed
    "heedful reproduce normxlogit": HOURS,
    "heedful reproduce mask-lrp": HOURS,
    "heedful reproduce coperturbation --option models=minilm-sentiment": HOURS,
    "heedful reproduce coperturbation -O workers=2 -O stability=off": HOURS,
    "heedful reproduce lecture": HOURS,
}
"""Every command line of README.md and how the suite runs it."""

BEFORE = {
    # the shards the README merges: two benches of the same model and data, as a user would have
    "heedful bench merge results/ shard1/ shard2/": [
        f"heedful bench --model minilm-sentiment --dataset mydata.csv --methods {m} --metrics token_f1 --preset ferret --out {out}"
        for m, out in (("random", "shard1/"), ("grad_x_input", "shard2/"))
    ],
}
"""Commands run before a README command, to make what it reads."""

SHORTER = {
    "heedful interest layers 'a charming and often affecting journey' --out layers.png": " --max-steps 20",
    "heedful interest lambda-sweep 'a charming and often affecting journey' -w charming -w often --out lam.png": " --max-steps 20",
    "heedful steer --prompt 'The impact of climate change has become more evident in recent years.' --suppress 'in recent years' --html steer.html": " --max-new-tokens 8 -o max_steps=20",
    # the stand-in has 2 blocks (click keeps an option's last value)
    "heedful steer --model smollm2-135m --vector caa --positive 'I love this' --negative 'I hate this' --layer 6 --coefficient 4 --prompt 'The movie was'": " --layer 1 --max-new-tokens 6",
    "heedful steer --model smollm2-135m --vector extract --sentence 'the taste is excellent!' --layer 6": " --layer 1 --steps 20",
    "heedful probe --model minilm-sentiment --property number --mdl --amnesic 1 --plot number.png": " -n 60",
}
"""Options appended in the default suite only, where an example's solver steps or generated
tokens would cost the tiny stand-ins most of a minute (the slow suite runs them as written)."""


def _run(mode: str, what: str, *commands: str, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, str(RUNNER), mode, what, *commands], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-5000:])
    return done


def _in_order(kind: str, shorter: bool = False) -> list[str]:
    found = []
    for line in command_lines():
        if COMMANDS.get(line) == kind:
            found += BEFORE.get(line, []) + [line + (SHORTER.get(line, "") if shorter else "")]
    return found


def test_every_readme_command_is_run_by_the_suite():
    found = command_lines()
    assert len(found) >= 40
    assert sorted(set(found) - set(COMMANDS)) == [], "list the new README command in tests/test_readme.py::COMMANDS"
    assert sorted(set(COMMANDS) - set(found)) == [], "a command of COMMANDS left the README"


def test_make_demo_runs_a_readme_command():
    """``make demo`` (set-up, then a heatmap) runs a command that the suite runs too."""
    recipe = re.search(r"^demo:.*\n\t\$\(BIN\)/(heedful .*)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert recipe is not None
    assert recipe.group(1).startswith("heedful explain \"a charming and often affecting journey\" --method ")


def test_readme_python_runs_on_tiny_stand_ins(tmp_path):
    done = _run("tiny", "python", cwd=tmp_path, timeout=900)
    assert "checked 7 stated values" in done.stdout


def test_readme_commands_run_on_tiny_stand_ins(tmp_path):
    commands = _in_order(TINY, shorter=True)
    done = _run("tiny", "commands", *commands, cwd=tmp_path, timeout=1800)
    assert done.stdout.count("ok: ") == len(commands)
    assert (tmp_path / "expl.html").is_file() and (tmp_path / "gen.html").is_file() and (tmp_path / "steer.html").is_file()
    assert (tmp_path / "out.json").read_text(encoding="utf-8").lstrip().startswith("[")
    assert (tmp_path / "elsewhere" / "results.sqlite").is_file()


@pytest.mark.slow
def test_readme_python_on_the_zoo_models(tmp_path):
    done = _run("zoo", "python", cwd=tmp_path, timeout=7200)
    assert "checked 7 stated values" in done.stdout


@pytest.mark.slow
def test_readme_commands_on_the_zoo_models(tmp_path):
    commands = [c for c in _in_order(TINY) + _in_order(ZOO) if not c.startswith(("heedful serve", "heedful bench ... --engine ray --address"))]
    done = _run("zoo", "commands", *commands, cwd=tmp_path, timeout=4 * 3600)
    assert done.stdout.count("ok: ") == len(commands)


@pytest.mark.slow
def test_readme_serve_commands_answer(tmp_path):
    """``heedful serve`` runs until stopped: started as written, it must answer its page."""
    import time
    import urllib.request

    pytest.importorskip("fastapi")
    for line in [c for c in _in_order(ZOO) if c.startswith("heedful serve")]:
        words = line.split()[1:]
        server = subprocess.Popen([sys.executable, "-m", "heedful", *words], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
        try:
            for _ in range(600):
                try:
                    with urllib.request.urlopen("http://127.0.0.1:8765/", timeout=2) as page:
                        assert page.status == 200
                        break
                except OSError:
                    assert server.poll() is None, server.stderr.read()[-3000:]
                    time.sleep(1)
            else:
                raise AssertionError(f"`{line}` did not answer within 10 minutes")
        finally:
            server.terminate()
            server.wait(timeout=60)


@pytest.mark.slow
def test_readme_reproduction_reports_reach_their_writers(monkeypatch, capsys, tmp_path):
    """The reports take hours: each README command is parsed and handed to its report writer
    with the options it names (the writer stubbed)."""
    import shlex

    from conftest import run_cli

    import heedful.reproduce as reproduce

    written = []
    monkeypatch.setattr(reproduce, "report_writer", lambda name: lambda out, settings: written.append((name, settings.options)) or out / "report.md")
    monkeypatch.chdir(tmp_path)
    for line in _in_order(HOURS):
        code, _, err = run_cli(monkeypatch, capsys, *shlex.split(line)[1:])
        assert code == 0, (line, err)
    assert [name for name, _ in written] == ["normxlogit", "mask-lrp", "coperturbation", "coperturbation", "lecture"]
    assert written[2][1] == {"models": "minilm-sentiment"} and written[3][1] == {"workers": 2, "stability": "off"}
