"""A loopback server that answers the Hugging Face hub's file API, for tests of hub loading
without the internet: ``HF_ENDPOINT=http://127.0.0.1:PORT``.

It serves what ``huggingface_hub`` asks for when it fetches a model -- the model info of a
revision (``/api/models/{repo}/revision/{rev}``), the file listing (``/api/models/{repo}/tree/{rev}``)
and each file (``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``, with the commit and etag headers)
-- from repositories held in memory, and counts the requests. A repository can be gated (403
with the hub's ``GatedRepo`` error code) or serve a file whose bytes differ from its listing.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS = (".safetensors", ".bin", ".pt")


@dataclass
class Repo:
    revisions: dict[str, dict[str, bytes]]
    """commit sha -> {path: bytes}"""
    refs: dict[str, str]
    """branch -> commit sha"""
    gated: bool = False
    corrupt: set[str] = field(default_factory=set)
    """paths served with other bytes than the listing's hashes"""

    def commit(self, revision: str | None) -> str | None:
        revision = revision or "main"
        return revision if revision in self.revisions else self.refs.get(revision)


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # noqa: S324


def _entry(path: str, data: bytes) -> dict:
    entry = {"type": "file", "oid": _git_blob_id(data), "size": len(data), "path": path}
    if path.endswith(LFS):
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


class LoopbackHub:
    """``with LoopbackHub(repos) as hub:`` serves ``repos`` ({repo id: :class:`Repo`}) at ``hub.url``."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.requests: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> LoopbackHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _error(self, handler, status: int, code: str, message: str) -> None:
        handler.send_response(status)
        handler.send_header("X-Error-Code", code)
        handler.send_header("X-Error-Message", message)
        handler.send_header("Content-Type", "application/json")
        data = json.dumps({"error": message}).encode()
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _json(self, handler, payload, body: bool) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    def _answer(self, handler, body: bool) -> None:
        path = handler.path.split("?", 1)[0]
        self.requests.append(f"{handler.command} {path}")
        api = re.fullmatch(r"/api/models/([^/]+(?:/[^/]+)?)(?:/revision/([^/]+))?", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        found = api or tree or resolve
        repo = self.repos.get(found.group(1)) if found else None
        if repo is None:
            return self._error(handler, 404, "RepoNotFound", "Repository not found")
        sha = repo.commit(found.group(2))
        if sha is None:
            return self._error(handler, 404, "RevisionNotFound", "Invalid rev id")
        files = repo.revisions[sha]
        if api:
            return self._json(handler, {"id": found.group(1), "sha": sha, "siblings": [{"rfilename": p} for p in files],
                                        "private": False, "gated": "manual" if repo.gated else False, "tags": []}, body)
        if tree:
            return self._json(handler, [_entry(p, data) for p, data in files.items()], body)
        if repo.gated:
            return self._error(handler, 403, "GatedRepo", "Access to this model is restricted")
        name = resolve.group(3)
        if name not in files:
            return self._error(handler, 404, "EntryNotFound", "Entry not found")
        data = files[name]
        entry = _entry(name, data)
        if name in repo.corrupt:
            data = data[: len(data) // 2] + bytes(len(data) - len(data) // 2)
        handler.send_response(200)
        handler.send_header("X-Repo-Commit", sha)
        handler.send_header("ETag", f'"{entry["oid"]}"')
        if "lfs" in entry:
            handler.send_header("X-Linked-Etag", f'"{entry["lfs"]["oid"]}"')
            handler.send_header("X-Linked-Size", str(len(data)))
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)
