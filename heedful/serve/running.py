"""Running the application on uvicorn, and stopping it cleanly.

On SIGTERM or Ctrl+C the server first stops its worker -- queued jobs and the running one answer
503 at once (the running job stops at its next check, within one model pass), new requests are
refused with 503 -- and only then lets uvicorn close the connections, whose requests are all
answered by then. Plain uvicorn would wait for every open request first, i.e. for every queued
job to be computed (minutes with a full queue), and then re-raise the signal, so the process
ended killed by it (exit -15) rather than with status 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from typing import Any

from fastapi import FastAPI


def server(app: FastAPI, **config: Any):
    """A ``uvicorn.Server`` for ``app`` (``config``: ``uvicorn.Config``'s arguments) that stops
    the app's worker before closing connections, and exits normally after a signal."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None) -> None:
            await asyncio.to_thread(app.state.server.worker.stop)
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's own, without re-raising the signal after a clean shutdown
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in original.items():
                    signal.signal(sig, handler)

    return Server(uvicorn.Config(app, **config))


def run(app: FastAPI, host: str, port: int) -> None:
    """Serve ``app`` at ``host:port`` until SIGTERM or Ctrl+C (then stop cleanly, status 0)."""
    server(app, host=host, port=port, log_level="warning").run()
