"""Errors the API answers with: an HTTP status and heedful's one-line message and hint."""

from __future__ import annotations

from typing import Any

from heedful.engine.workload import Work
from heedful.errors import HeedfulError, MethodError


class ApiError(HeedfulError):
    """A request the server refuses: ``status`` (4xx) with ``{"error": message, "hint": hint}``."""

    def __init__(self, status: int, message: str, hint: str | None = None, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message, hint)
        self.status = status
        self.extra = extra or {}

    def payload(self) -> dict[str, Any]:
        """``{"error", "hint"}`` and any ``extra`` fields (e.g. a long request's ``estimate``)."""
        return {"error": self.message, "hint": self.hint, **self.extra}


def as_api_error(exc: HeedfulError) -> ApiError:
    """A library error as the API's: an unknown method is 404, any other bad input 422."""
    if isinstance(exc, ApiError):
        return exc
    status = 404 if isinstance(exc, MethodError) and exc.message.startswith("unknown method") else 422
    return ApiError(status, exc.message, exc.hint)


def too_long(what: str, length: int, limit: int, flag: str) -> ApiError:
    return ApiError(413, f"{what} is {length} characters, above this server's limit of {limit}", f"shorten it, or start heedful serve with {flag}")


def unconfirmed(work: Work) -> ApiError:
    """409 for a request estimated to take long (:attr:`Work.long <heedful.engine.workload.Work.long>`)
    and sent without ``confirm``: the estimate, for the page to ask about."""
    return ApiError(
        409,
        f"this request will take {work.describe()} (estimated on the server)",
        "send it again with confirm: true to run it, or ask for less (fewer methods, steps, samples or tokens)",
        {"estimate": work.to_dict()},
    )


def busy(waiting: int, seconds: float | None = None, timeout_s: float | None = None) -> ApiError:
    """The queue is full, or (``seconds`` of work ahead) too long for the ``timeout_s`` limit."""
    ahead = "" if seconds is None else f" (about {seconds:.0f} s of work ahead; this server's limit is {timeout_s:g} s)"
    return ApiError(
        429,
        f"the server is busy: {waiting} request(s) are already waiting{ahead}",
        "try again in a moment (requests are computed one at a time, in order)",
    )


def timed_out(seconds: float) -> ApiError:
    return ApiError(
        504,
        f"the request took longer than this server's limit of {seconds:g} s",
        "use fewer methods or smaller n_steps / n_samples, or start heedful serve with a larger --timeout",
    )


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", "start heedful serve again, then send the request again")


def client_left() -> ApiError:
    """What a route answers when its client disconnected before the answer (no one reads it;
    499 as in nginx's logs)."""
    return ApiError(499, "the client closed the connection before the answer", "nothing to do: the request was cancelled")
