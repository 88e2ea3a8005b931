"""Models from the Hugging Face hub, fetched as ``transformers`` fetches them, safe by default.

:func:`fetch` turns a hub id (``"Qwen/Qwen3-0.6B"``) into a folder of the local Hugging Face
cache, downloading what is missing through ``huggingface_hub`` (its cache, its progress bars,
``HF_ENDPOINT``, ``HF_HOME``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE`` as everywhere else), and
checks before any weight arrives:

- **weights that run no code**: only ``*.safetensors`` are fetched; a repository whose weights
  are pickles alone (``pytorch_model.bin``, ``*.pt``) is refused unless ``allow_pickle=True``,
  since unpickling a file runs whatever it holds;
- **no remote code**: a config that maps the model to the repository's own Python
  (``auto_map``) is refused unless ``trust_remote_code=True``;
- **every file as the hub lists it**: each downloaded file is hashed against the listing (the
  LFS sha256 of weights, the git blob id of the rest) once; a corrupt file is removed from the
  cache and refused;
- **one line, quickly, when it cannot**: a gated repository names ``hf auth login``; an
  unreachable hub (or ``HF_HUB_OFFLINE=1``) falls back to the cache or says in one line that
  the model is not there, after one attempt of at most :data:`TIMEOUT` seconds.

A commit pinned by ``revision=`` is fetched and loaded as it was; without one, the
repository's ``main`` at the time of the download (the cache remembers which commit that was,
so an offline load finds it again).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from heedful.errors import HeedfulError, InputError
from heedful.files.atomic import atomic_file
from heedful.files.cache import heedful_home
from heedful.files.supply import sha256_of

TIMEOUT = 8.0
"""Seconds one request to the hub may take before the load gives up (no retries)."""

SAFE_WEIGHTS = ("*.safetensors", "*.safetensors.index.json")
PICKLE_WEIGHTS = ("*.bin", "*.bin.index.json", "*.pt", "*.pth", "*.ckpt", "*.pkl")
SUPPORT_FILES = ("*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja")
"""Configs, tokenizers (vocabularies, merges, SentencePiece models) and chat templates."""

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def is_repo_id(name: str) -> bool:
    """Whether ``name`` reads as a hub id (``org/name`` or a legacy ``name``), not a path."""
    return bool(_REPO_ID.match(name)) and ".." not in name and not name.endswith((".", "-"))


def _matches(path: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch(Path(path).name, p) for p in patterns)


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextmanager
def _progress_bars(shown: bool):
    """``huggingface_hub``'s download bars on stderr, or none."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was_disabled = are_progress_bars_disabled()
    if not shown:
        disable_progress_bars()
    try:
        yield
    finally:
        if not shown and not was_disabled:
            enable_progress_bars()


def _errors(repo_id: str, revision: str | None):
    """The one-line error for an exception of ``huggingface_hub`` while fetching ``repo_id``."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def translate(exc: BaseException) -> HeedfulError | None:
        if isinstance(exc, GatedRepoError):
            return HeedfulError(
                f"{repo_id} is a gated repository: its files need an account that accepted its terms",
                hint=f"accept them on {_endpoint()}/{repo_id}, then run `hf auth login` (or set HF_TOKEN)",
            )
        if isinstance(exc, RevisionNotFoundError):
            return InputError(f"{repo_id} has no revision {revision!r}", hint="give a branch, a tag or a commit of the repository")
        if isinstance(exc, RepositoryNotFoundError):
            return HeedfulError(
                f"no model repository {repo_id!r} on {_endpoint()}",
                hint="check the id (org/name); a private repository needs `hf auth login` (or HF_TOKEN)",
            )
        return None

    return translate


def _unreachable(repo_id: str, exc: BaseException) -> HeedfulError:
    return HeedfulError(
        f"cannot reach {_endpoint()} to fetch {repo_id}, and it is not in the local Hugging Face cache ({_first_line(exc)})",
        hint="check the network (or HF_ENDPOINT), or fetch it where the hub is reachable; HF_HUB_OFFLINE=1 uses the cache only",
    )


def cached(repo_id: str, revision: str | None = None) -> Path | None:
    """The cache's folder of ``repo_id`` at ``revision`` (default ``main``), if it was fetched."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json", revision=revision)
    return Path(found).parent if isinstance(found, str) else None


def fetch(
    repo_id: str,
    revision: str | None = None,
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    progress: bool = True,
) -> Path:
    """The local folder of hub model ``repo_id`` (at ``revision``), downloaded into the Hugging
    Face cache where missing: config, tokenizer and safetensors weights (pickled weights only
    with ``allow_pickle``). Raises a one-line :class:`HeedfulError` for what cannot be loaded
    safely or fetched (see the module docstring).

    >>> from heedful.hub import fetch
    >>> folder = fetch("Qwen/Qwen3-0.6B")   # doctest: +SKIP
    """
    from huggingface_hub import HfApi, constants, snapshot_download

    translate = _errors(repo_id, revision)
    if constants.HF_HUB_OFFLINE:
        folder = cached(repo_id, revision)
        if folder is None:
            raise HeedfulError(
                f"{repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set",
                hint="unset HF_HUB_OFFLINE to download it, or fetch it where the hub is reachable",
            )
        _check_remote_code(folder, repo_id, trust_remote_code)
        return folder
    api = HfApi()
    try:
        info = api.model_info(repo_id, revision=revision, timeout=TIMEOUT)
        files = [f for f in api.list_repo_tree(repo_id, revision=info.sha, recursive=True) if hasattr(f, "blob_id")]
    except Exception as exc:  # noqa: BLE001  (HTTP errors and the HTTP client's own connection errors)
        error = translate(exc)
        if error is not None:
            raise error from None
        folder = cached(repo_id, revision)
        if folder is None:
            raise _unreachable(repo_id, exc) from None
        _check_remote_code(folder, repo_id, trust_remote_code)
        return folder
    paths = [f.path for f in files]
    if "config.json" not in paths:
        raise HeedfulError(f"{repo_id} has no config.json: not a transformers model", hint="give the id of a transformers model repository")
    weights = SAFE_WEIGHTS
    if not any(_matches(p, SAFE_WEIGHTS) for p in paths):
        pickles = [p for p in paths if _matches(p, PICKLE_WEIGHTS)]
        if not pickles:
            raise HeedfulError(f"{repo_id} has no weights heedful can load (no *.safetensors)", hint="give a repository with safetensors weights")
        if not allow_pickle:
            raise HeedfulError(
                f"{repo_id} has only pickled weights ({pickles[0]}); unpickling a file runs the code it holds",
                hint="pass allow_pickle=True (--allow-pickle) if you trust the repository, or use one with safetensors weights",
            )
        weights = PICKLE_WEIGHTS
    wanted = [p for p in paths if "/" not in p and _matches(p, (*SUPPORT_FILES, *weights))]
    try:
        with _progress_bars(progress):
            config = Path(snapshot_download(repo_id, revision=info.sha, allow_patterns=["config.json"], etag_timeout=TIMEOUT))
            _check_remote_code(config, repo_id, trust_remote_code)
            folder = Path(snapshot_download(repo_id, revision=info.sha, allow_patterns=wanted, etag_timeout=TIMEOUT))
    except HeedfulError:
        raise
    except Exception as exc:  # noqa: BLE001  (HTTP errors, lost connections, full disks: one line each)
        error = translate(exc)
        raise (error or HeedfulError(f"cannot download {repo_id}: {_first_line(exc)}", hint="run the same command again to resume")) from None
    if revision is None:
        _remember_main(repo_id, info.sha)
    _verify(folder, [f for f in files if f.path in wanted], repo_id)
    return folder


def _remember_main(repo_id: str, sha: str) -> None:
    """Point the cache's ``refs/main`` at the commit fetched, as ``transformers`` does, so an
    offline load without a revision finds it."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    ref = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model") / "refs" / "main"
    if not ref.is_file() or ref.read_text().strip() != sha:
        ref.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(ref) as part:
            part.write_text(sha)


def _check_remote_code(folder: Path, repo_id: str, trust_remote_code: bool) -> None:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # transformers says what is wrong with it, with the rest of the load
    if config.get("auto_map") and not trust_remote_code:
        raise HeedfulError(
            f"{repo_id} runs its own Python code to build the model (auto_map in its config.json)",
            hint="pass trust_remote_code=True (--trust-remote-code) if you trust the repository",
        )


def _git_blob_id(path: Path) -> str:
    """Git's object id of the file: sha1 of ``blob <size>\\0`` and its bytes (the id the hub lists
    for a file not stored in LFS)."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())  # noqa: S324  (git's object id, not a security hash)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify(folder: Path, files: list, repo_id: str) -> None:
    """Hash every file of ``files`` (``huggingface_hub`` ``RepoFile``s) in ``folder`` against the
    hub's listing, once per cached blob (remembered by its path, size and modification time
    under ``heedful_home()/hub``); remove a corrupt one from the cache and refuse it."""
    record = heedful_home() / "hub" / "verified.json"
    try:
        verified: dict[str, list] = json.loads(record.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        verified = {}
    changed = False
    for entry in files:
        local = folder / entry.path
        blob = local.resolve()
        expected = entry.lfs.sha256 if entry.lfs is not None else entry.blob_id
        stat = blob.stat()
        seen = [expected, stat.st_size, stat.st_mtime_ns]
        if verified.get(str(blob)) == seen:
            continue
        found = sha256_of(blob) if entry.lfs is not None else _git_blob_id(blob)
        if found != expected:
            local.unlink(missing_ok=True)
            blob.unlink(missing_ok=True)
            raise HeedfulError(
                f"the download of {entry.path} from {repo_id} is corrupt (hash {found[:12]}…, the hub lists {expected[:12]}…)",
                hint="run the same command again to download it anew",
            )
        verified[str(blob)] = seen
        changed = True
    if changed:
        record.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(record) as part:
            part.write_text(json.dumps(verified, sort_keys=True), encoding="utf-8")
