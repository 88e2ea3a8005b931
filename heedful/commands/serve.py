"""``heedful serve``: the local web page and JSON API (:mod:`heedful.serve`) on uvicorn.

Registered in :mod:`heedful.cli`. FastAPI and uvicorn are the optional ``serve`` extra.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated

import typer

from heedful.commands.console import err, out
from heedful.errors import HeedfulError, InputError, install_hint

LOOPBACK_NAMES = ["127.0.0.1", "localhost", "[::1]"]


def serve(
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Model to load at start (repeat; the first is the default). Other zoo models load on request.")] = None,
    host: Annotated[str, typer.Option("--host", help="Address to bind; anything but loopback lets other machines in.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8765,
    store: Annotated[Path | None, typer.Option("--store", help="A `heedful bench --out` folder whose runs the page browses.")] = None,
    device: Annotated[str | None, typer.Option("--device", help="Where the models run: cpu, cuda, cuda:1, mps.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="Store and run the models in fp32 (default), bf16 or fp16; gradient and relevance sums stay float32 (see docs/models.md for each method's difference from fp32).")] = "fp32",
    max_chars: Annotated[int, typer.Option("--max-chars", help="Longest text or prompt, in characters.")] = 2000,
    max_methods: Annotated[int, typer.Option("--max-methods", help="Most methods per request.")] = 6,
    max_n_steps: Annotated[int, typer.Option("--max-n-steps", help="Largest n_steps / max_steps.")] = 64,
    max_n_samples: Annotated[int, typer.Option("--max-n-samples", help="Largest n_samples / n_masks / n_ablations / samples.")] = 512,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Most generated tokens per request.")] = 32,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take, waiting included.")] = 120.0,
    queue_size: Annotated[int, typer.Option("--queue-size", help="Requests waiting behind the running one (more: HTTP 429).")] = 8,
    revision: Annotated[str | None, typer.Option("--revision", help="Hub ids: the branch, tag or commit of the one --model to load (or --model ORG/NAME@REV).")] = None,
    allow_pickle: Annotated[bool, typer.Option("--allow-pickle", help="Hub ids: load pickled weights when a repository has no safetensors (unpickling runs code).")] = False,
    trust_remote_code: Annotated[bool, typer.Option("--trust-remote-code", help="Run a repository's own model code (auto_map), as transformers does.")] = False,
) -> None:
    """Serve a web page to explain, compare and evaluate texts, and its JSON API (docs at
    /docs), at http://HOST:PORT. One worker computes the requests in order, each model in
    memory once; requests beyond the limits are refused with the CLI's messages."""
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise HeedfulError(f"heedful serve needs {' and '.join(missing)}, which is not installed", hint=install_hint("serve"))
    from heedful.serve import ServeSettings, create_app
    from heedful.serve.running import run
    from heedful.serve.settings import LOOPBACK

    if revision is not None and not model:
        raise InputError(f"--revision {revision} pins a hub model, and no --model is given", hint="add --model ORG/NAME (or give --model ORG/NAME@REV)")
    if not 0 <= port <= 65535:
        raise InputError(f"port {port} does not exist", hint="pass --port between 1 and 65535 (0: any free port)")
    loopback = host in LOOPBACK
    if not loopback:
        err.print(
            f"[yellow]warning:[/] serving on {host}: anyone who can reach port {port} of this machine can run "
            "the models and read the results store (there is no authentication)"
        )
    settings = ServeSettings(
        **({} if not model else {"models": list(model)}),
        store=store, max_chars=max_chars, max_methods=max_methods, max_n_steps=max_n_steps,
        max_n_samples=max_n_samples, max_new_tokens=max_new_tokens, timeout_s=timeout, queue_size=queue_size,
        device=device, dtype=dtype, allowed_hosts=LOOPBACK_NAMES if loopback else None,
        revision=revision, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
    )
    app = create_app(settings)
    server = app.state.server
    try:
        for name in settings.models:  # before the first request, so it does not wait for them
            with err.status(f"loading {name} …"):
                server.worker.watch(server.catalog.get(name))
    except BaseException:
        server.worker.stop()
        raise
    shown = f"[{host}]" if ":" in host else host
    out.print(f"heedful serve: http://{shown}:{port}  (API docs: /docs; stop with Ctrl+C)")
    run(app, host, port)
