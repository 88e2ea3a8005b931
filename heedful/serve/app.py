"""The FastAPI application of ``heedful serve``: the JSON API, the job queue's event streams,
and the static page.

Every route validates its request before queueing it (the CLI's messages, as
``{"error", "hint"}`` with a 4xx status); the computing routes run through the one worker
(:mod:`heedful.serve.work`) and answer when their job is done, or 504 at the timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import MutableHeaders

from heedful.engine.workload import NOTHING, Work
from heedful.errors import HeedfulError
from heedful.model import Model
from heedful.serve import compute
from heedful.serve import runs as stored
from heedful.serve.catalog import Catalog, bind_methods, method_rows
from heedful.serve.errors import (
    ApiError,
    as_api_error,
    client_left,
    timed_out,
    too_long,
    unconfirmed,
)
from heedful.serve.settings import ServeSettings
from heedful.serve.work import Job, Worker
from heedful.version import __version__

MAX_SAMPLES = 20
"""The most noise samples a trace request may average (ROME's 10, doubled)."""
RETRY_AFTER_S = 1
"""Seconds a client is asked to wait after a 429 (the ``Retry-After`` header)."""
STATIC = Path(str(resources.files("heedful.serve") / "static"))
"""The page's files, shipped with the package."""


# ---------------------------------------------------------------------------- request bodies
class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


Options = dict[str, dict[str, Any]]


class Asked(Body):
    """A computing request: one estimated to take long is answered 409 with its estimate
    unless it says ``confirm``."""

    confirm: bool = Field(False, description="Run it even when it is estimated to take long (else: 409 with the estimate).")


class ExplainBody(Asked):
    """``POST /api/explain`` and ``/api/compare``."""

    model: str | None = Field(None, description="A model GET /api/models lists (default: the server's first).")
    text: str = Field(..., description="The text to explain.")
    methods: list[str] = Field(default_factory=lambda: ["normxlogit"], description="Methods (GET /api/methods).")
    options: Options = Field(default_factory=dict, description="Per method: option -> value.")
    target: str | int | None = Field(None, description="None: the prediction; a label or class index; 'A vs B'; for LMs a next token or span.")
    curve: bool = Field(True, description="Also measure each method's deletion curve, AOPC and sufficiency on this text.")


class CurveBody(Asked):
    """``POST /api/curve``."""

    model: str | None = None
    text: str
    method: str = "normxlogit"
    options: dict[str, Any] = Field(default_factory=dict, description="The method's options.")
    target: str | int | None = None


class GenerateBody(Asked):
    """``POST /api/generate``."""

    model: str | None = None
    prompt: str
    max_new_tokens: int = Field(8, description="At most the server's max_new_tokens.")
    method: str = "saliency"
    options: dict[str, Any] = Field(default_factory=dict)


class Message(Body):
    """One message of a conversation."""

    role: str = Field(..., description="system, user, assistant (or any role the model's chat template knows).")
    content: str = Field(..., description="The message's text.")


class ConversationBody(Asked):
    """``POST /api/conversation``."""

    model: str | None = None
    messages: list[Message] = Field(..., description='The conversation, [{"role": ..., "content": ...}, ...].')
    answer: str | None = Field(None, description="The assistant's answer to explain (default: the last message if the assistant wrote it, else what the model writes).")
    method: str = Field("source_loo", description="A context method (source_loo, context_cite, hierarchical) or any method, pooled per turn.")
    options: dict[str, Any] = Field(default_factory=dict, description="The method's options.")
    max_new_tokens: int | None = Field(None, description="When the model writes the answer: at most this many tokens (default and limit: the server's max_new_tokens).")


class TraceBody(Body):
    """``POST /api/trace``: causal tracing of one prompt (``heedful trace``)."""

    model: str | None = None
    prompt: str = Field(..., description="The prompt whose prediction is traced.")
    corrupt: str | None = Field(None, description="Span of the prompt whose word embeddings are noised (ROME's subject).")
    counterfactual: str | None = Field(None, description="Instead of noise: a prompt of the same token length to patch into.")
    target: str | None = Field(None, description="Output read: a class, or one token (e.g. ' Paris'); default: the prediction.")
    kind: Literal["residual", "attn", "mlp"] = Field("residual", description="What is restored: hidden states, attention or MLP outputs.")
    window: int = Field(1, description="Layers restored per cell (ROME: 10 for attn and mlp).")
    samples: int = Field(10, ge=1, le=MAX_SAMPLES, description=f"Noise samples averaged (ROME: 10; at most {MAX_SAMPLES}).")


class SteerBody(Body):
    """``POST /api/steer``: generation without and with a contrastive steering vector (``heedful steer --vector caa``)."""

    model: str | None = None
    prompt: str = Field(..., description="The prompt to continue.")
    positive: str = Field(..., description="The positive prompt of the contrastive pair.")
    negative: str = Field(..., description="The negative prompt of the contrastive pair.")
    layer: int = Field(6, description="Block whose output the vector is added to (0-based).")
    coefficient: float = Field(4.0, allow_inf_nan=False, description="Factor on the vector.")
    max_new_tokens: int = Field(8, description="At most the server's max_new_tokens.")


class JobBody(Body):
    """``POST /api/jobs``: any computing route's body, run as a job whose progress streams."""

    kind: Literal["explain", "compare", "curve", "generate", "conversation", "trace", "steer"]
    request: dict[str, Any]


BODIES: dict[str, type[Body]] = {
    "explain": ExplainBody, "compare": ExplainBody, "curve": CurveBody, "generate": GenerateBody, "conversation": ConversationBody,
    "trace": TraceBody, "steer": SteerBody,
}


# ---------------------------------------------------------------------------- the app
class Server:
    """The state behind the routes: settings, the model catalog and the worker."""

    def __init__(self, settings: ServeSettings, preloaded: Mapping[str, Model] | None = None) -> None:
        self.settings = settings
        self.catalog = Catalog(settings, preloaded)
        self.worker = Worker(settings.queue_size)
        for model in self.catalog.loaded.values():
            self.worker.watch(model)

    # ------------------------------------------------------------------ checks before queueing
    def check_text(self, text: str, what: str = "text") -> str:
        if not text.strip():
            raise ApiError(422, f"no {what} given", f"type a {what} to explain")
        if len(text) > self.settings.max_chars:
            raise too_long(what, len(text), self.settings.max_chars, "--max-chars")
        return text

    def bind(self, model: str, methods: list[str], options: Options):
        """Methods and options bound now when the model's task is known without loading it
        (else inside the job, after loading)."""
        task = self.catalog.task(model)
        return None if task is None else bind_methods(methods, options, task, self.settings)

    # ------------------------------------------------------------------ jobs
    def job(self, kind: str, body: Body) -> Job:
        """Validate ``body`` and queue the work of route ``kind`` (429 when the queue is full)."""
        if kind in ("explain", "compare"):
            return self._explain_job(kind, body)  # type: ignore[arg-type]
        if kind == "curve":
            return self._curve_job(body)  # type: ignore[arg-type]
        if kind == "conversation":
            return self._conversation_job(body)  # type: ignore[arg-type]
        if kind == "trace":
            return self._trace_job(body)  # type: ignore[arg-type]
        if kind == "steer":
            return self._steer_job(body)  # type: ignore[arg-type]
        return self._generate_job(body)  # type: ignore[arg-type]

    def _submit(self, kind: str, name: str, steps: int, run: Callable[[Model, Callable[[str], None]], Any]) -> Job:
        catalog, worker = self.catalog, self.worker

        def work(job: Job) -> Any:
            total = steps + (0 if name in catalog.loaded else 1)
            done = 0

            def report(stage: str) -> None:
                nonlocal done
                job.progress(done, total, stage)
                done += 1

            if name not in catalog.loaded:
                worker.watch(catalog.get(name, report))
                job.restart_clock()
            result = run(catalog.get(name), report)
            result["model"] = name  # as the request named it
            job.progress(total, total, "done")
            return result

        return self.worker.submit(kind, work, self.settings.timeout_s)

    def _explain_job(self, kind: str, body: ExplainBody) -> Job:
        name = self.catalog.check(body.model)
        text = self.check_text(body.text)
        runs = self.bind(name, body.methods, body.options)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            bound = runs or bind_methods(body.methods, body.options, model.task, self.settings)
            ask(body, sum((model.estimate(text, info.name, **options) for info, options in bound), NOTHING))
            return compute.explain(model, text, body.target, bound, body.curve, report)

        return self._submit(kind, name, compute.steps_of_explain(len(body.methods), body.curve), run)

    def _curve_job(self, body: CurveBody) -> Job:
        name = self.catalog.check(body.model)
        text = self.check_text(body.text)
        options = {body.method: body.options} if body.options else {}
        runs = self.bind(name, [body.method], options)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            (info, bound), = runs or bind_methods([body.method], options, model.task, self.settings)
            ask(body, model.estimate(text, info.name, **bound))
            return compute.curve(model, text, body.target, info, bound, report)

        return self._submit("curve", name, 2, run)

    def check_new_tokens(self, asked: int) -> int:
        limit = self.settings.max_new_tokens
        if not 1 <= asked <= limit:
            raise ApiError(
                422,
                f"max_new_tokens={asked} is not in [1, {limit}] (this server's limit)",
                f"ask for 1 to {limit} tokens, or start heedful serve with --max-new-tokens",
            )
        return asked

    def check_messages(self, messages: list[Message]) -> list[dict[str, str]]:
        """The conversation as plain messages: at least one, each with a role and text, their
        text within the server's ``max_chars``."""
        if not messages:
            raise ApiError(422, "the conversation has no messages", 'give [{"role": "user", "content": "..."}, ...]')
        for k, message in enumerate(messages):
            if not message.role.strip():
                raise ApiError(422, f"message {k} has no role", 'give each message as {"role": "user", "content": "..."}')
            if not message.content.strip():
                raise ApiError(422, f"message {k} ({message.role}) has no text content", 'give each message a non-empty "content" string')
        length = sum(len(m.content) for m in messages)
        if length > self.settings.max_chars:
            raise too_long("the conversation", length, self.settings.max_chars, "--max-chars")
        return [{"role": m.role, "content": m.content} for m in messages]

    def _conversation_job(self, body: ConversationBody) -> Job:
        from heedful.serve.conversation import check_chat_model, explain_conversation, split_answer

        name = self.catalog.check(body.model)
        turns, answer, origin = split_answer(self.check_messages(body.messages), body.answer)
        new_tokens = self.settings.max_new_tokens if body.max_new_tokens is None else self.check_new_tokens(body.max_new_tokens)
        options = {body.method: body.options} if body.options else {}
        runs = self.bind(name, [body.method], options)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            (info, bound), = runs or bind_methods([body.method], options, model.task, self.settings)
            check_chat_model(model)
            ask(body, model.estimate(turns, info.name, **bound))
            return explain_conversation(model, turns, answer, origin, info, bound, new_tokens, report)

        return self._submit("conversation", name, 2, run)

    def _generate_job(self, body: GenerateBody) -> Job:
        name = self.catalog.check(body.model)
        prompt = self.check_text(body.prompt, "prompt")
        self.check_new_tokens(body.max_new_tokens)
        options = {body.method: body.options} if body.options else {}
        runs = self.bind(name, [body.method], options)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            (info, bound), = runs or bind_methods([body.method], options, model.task, self.settings)
            if model.task == "causal_lm":  # compute.generate refuses any other model
                ask(body, model.estimate_generation(prompt, info.name, max_new_tokens=body.max_new_tokens, **bound))
            return compute.generate(model, prompt, body.max_new_tokens, info, bound, report)

        return self._submit("generate", name, 1, run)


    def _trace_job(self, body: TraceBody) -> Job:
        from heedful.inside.tracing import check_options
        from heedful.serve import inside

        name = self.catalog.check(body.model)
        prompt = self.check_text(body.prompt, "prompt")
        if body.counterfactual is not None:
            self.check_text(body.counterfactual, "counterfactual prompt")
        check_options(body.kind, "prob", body.samples, 3.0, body.window)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            return inside.trace(
                model, prompt, corrupt=body.corrupt, counterfactual=body.counterfactual, target=body.target,
                kind=body.kind, window=body.window, samples=body.samples, report=report,
            )

        return self._submit("trace", name, 1, run)

    def _steer_job(self, body: SteerBody) -> Job:
        from heedful.serve import inside

        name = self.catalog.check(body.model)
        prompt = self.check_text(body.prompt, "prompt")
        positive = self.check_text(body.positive, "positive prompt")
        negative = self.check_text(body.negative, "negative prompt")
        self.check_new_tokens(body.max_new_tokens)

        def run(model: Model, report: Callable[[str], None]) -> dict[str, Any]:
            return inside.steer(model, prompt, positive, negative, body.layer, body.coefficient, body.max_new_tokens, report)

        return self._submit("steer", name, 2, run)


def ask(body: Asked, work: Work) -> None:
    """Refuse, before any work, a request estimated to take long that did not ``confirm`` (409
    with the estimate: the page asks, then sends it again)."""
    if work.long and not body.confirm:
        raise unconfirmed(work)


def create_app(settings: ServeSettings | None = None, preloaded: Mapping[str, Model] | None = None) -> FastAPI:
    """The ``heedful serve`` application. ``preloaded``: models already in memory, offered
    under their names beside the zoo (tests hand over tiny models here). Its worker thread
    starts now and stops at the application's shutdown."""
    settings = settings or ServeSettings()
    server = Server(settings, preloaded)
    server.worker.start()

    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        server.worker.stop()

    app = FastAPI(
        title="heedful",
        version=__version__,
        summary="Which input tokens did a transformer rely on, and how far can that answer be trusted?",
        lifespan=lifespan,
    )
    app.state.server = server
    if settings.allowed_hosts is not None:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(settings.allowed_hosts))
    _errors(app)
    _routes(app, server)

    app.add_middleware(SafetyHeaders)

    if STATIC.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


class SafetyHeaders:
    """Adds ``X-Content-Type-Options: nosniff`` (answers are what they say) and
    ``X-Frame-Options: DENY`` (the page is not framed elsewhere) to every answer. Plain ASGI,
    not ``@app.middleware("http")``: Starlette's ``BaseHTTPMiddleware`` hides a client's
    disconnect from the routes, which then compute for no one."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers.setdefault("X-Content-Type-Options", "nosniff")
                headers.setdefault("X-Frame-Options", "DENY")
            await send(message)

        await self.app(scope, receive, sending)


# ---------------------------------------------------------------------------- errors
def _errors(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        headers = {"Retry-After": str(RETRY_AFTER_S)} if exc.status == 429 else None
        return JSONResponse(exc.payload(), status_code=exc.status, headers=headers)

    @app.exception_handler(HeedfulError)
    async def heedful_error(request: Request, exc: HeedfulError) -> JSONResponse:
        error = as_api_error(exc)
        return JSONResponse(error.payload(), status_code=error.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(validation_error(exc.errors()).payload(), status_code=422)


def validation_error(errors: Any) -> ApiError:
    """The first of pydantic's complaints about a request as one line and a hint."""
    first = list(errors)[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return ApiError(422, "the request body is not valid JSON", 'send a JSON object, e.g. {"text": "a charming journey"}')
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
    if first.get("type") == "extra_forbidden":
        return ApiError(422, f"unknown field {where!r}", "see /docs for the request's fields")
    if first.get("type") == "missing":
        return ApiError(422, f"{where} is missing", "see /docs for the request's fields")
    return ApiError(422, f"{where or 'body'}: {first.get('msg', 'invalid value')}", "see /docs for the request's fields")


# ---------------------------------------------------------------------------- routes
LEFT_POLL_S = 0.25
"""How often a waiting route checks whether its client has gone."""


async def answer(job: Job, request: Request) -> Any:
    """The job's result once the worker has computed it; 504 at the job's deadline (which
    moves once, when the job's model has been loaded). A client that disconnects cancels its
    job: a queued one is skipped, a running one stops at its next model pass."""
    done = asyncio.wrap_future(job.future)
    while True:
        wait = job.deadline - time.monotonic() + 1.0  # the worker's own 504 comes first
        if wait <= 0:
            job.cancel()
            raise timed_out(job.timeout_s)
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout=min(wait, LEFT_POLL_S))
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                raise client_left() from None


def _routes(app: FastAPI, server: Server) -> None:
    catalog, settings = server.catalog, server.settings

    @app.get("/", include_in_schema=False)
    async def index() -> Any:
        page = STATIC / "index.html"
        if not page.is_file():
            raise ApiError(404, "the page is not installed", "reinstall heedful; the JSON API is at /api and its docs at /docs")
        return FileResponse(page)

    @app.get("/api/models", summary="Models this server offers")
    async def models() -> list[dict[str, Any]]:
        return catalog.rows()

    @app.get("/api/methods", summary="Attribution methods and the options a request may set")
    async def methods(model: str | None = None) -> list[dict[str, Any]]:
        import heedful

        name = catalog.check(model)
        return method_rows(heedful.methods(), catalog.task(name), settings)

    @app.post("/api/explain", summary="Explain a text with one or more methods")
    async def explain(body: ExplainBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("explain", body), request)

    @app.post("/api/compare", summary="Explain a text with several methods, side by side (as /api/explain)")
    async def compare(body: ExplainBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("compare", body), request)

    @app.post("/api/curve", summary="One method's deletion curve, AOPC and sufficiency on a text")
    async def curve(body: CurveBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("curve", body), request)

    @app.post("/api/generate", summary="Generate after a prompt and explain every generated token")
    async def generate(body: GenerateBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("generate", body), request)

    @app.post("/api/conversation", summary="A conversation's turns, each with its share of the assistant's answer")
    async def conversation(body: ConversationBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("conversation", body), request)

    @app.post("/api/trace", summary="Causal tracing: a layer x position grid of indirect effects, attribution patching's beside it")
    async def trace(body: TraceBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("trace", body), request)

    @app.post("/api/steer", summary="Generate without and with a contrastive steering vector")
    async def steer(body: SteerBody, request: Request) -> dict[str, Any]:
        return await answer(server.job("steer", body), request)

    @app.get("/api/runs", summary="The bench runs of this server's results store (--store)")
    def runs() -> list[dict[str, Any]]:
        return stored.list_runs(settings.store)

    @app.get("/api/runs/{ident}", summary="A bench run's table (mean and 95% interval per method and metric) and curves")
    def run(ident: str) -> dict[str, Any]:
        return stored.get_run(settings.store, ident)

    @app.post("/api/jobs", status_code=202, summary="Queue a request; its progress streams from /api/jobs/{id}/events")
    async def submit(body: JobBody) -> dict[str, str]:
        try:
            request = BODIES[body.kind].model_validate(body.request)
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None
        return {"id": server.job(body.kind, request).id}

    @app.get("/api/jobs/{ident}/events", summary="Server-sent events: progress, then result or error")
    async def events(ident: str) -> StreamingResponse:
        job = server.worker.job(ident)
        if job is None:
            raise ApiError(404, f"unknown job {ident!r}", "jobs are kept for a while after they finish; queue it again")
        return StreamingResponse(stream(job), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def stream(job: Job, poll: float = 0.05, keep_alive: float = 10.0):
    """The job's events as server-sent events, until its ``result`` or ``error``."""
    sent, quiet = 0, 0.0
    while True:
        fresh = job.events_from(sent)
        for name, data in fresh:
            yield f"event: {name}\ndata: {json.dumps(data)}\n\n"
            if name in ("result", "error"):
                return
        sent += len(fresh)
        if fresh:
            quiet = 0.0
        elif quiet >= keep_alive:
            yield ": waiting\n\n"
            quiet = 0.0
        await asyncio.sleep(poll)
        quiet += poll
