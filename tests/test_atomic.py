"""Files and folders written whole (heedful.files.atomic): nothing half-written is ever visible, a
failed write leaves the previous version, and nothing is left beside the destination."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import heedful.files.atomic
from heedful.files.atomic import PART_SUFFIX, atomic_file, atomic_folder


def test_the_documented_examples_run():
    outcome = doctest.testmod(heedful.files.atomic)
    assert outcome.attempted > 0 and outcome.failed == 0


def test_a_file_appears_only_when_the_block_ends(tmp_path):
    dest = tmp_path / "sub" / "scores.json"
    with atomic_file(dest) as part:
        part.write_text("new", encoding="utf-8")
        assert not dest.exists() and part.parent == dest.parent and part.name.endswith(PART_SUFFIX)
    assert dest.read_text(encoding="utf-8") == "new"
    assert [p.name for p in dest.parent.iterdir()] == ["scores.json"]


def test_a_failed_file_write_keeps_the_previous_version_and_leaves_nothing(tmp_path):
    dest = tmp_path / "scores.json"
    dest.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError, match="stopped"), atomic_file(dest) as part:
        part.write_text("half", encoding="utf-8")
        raise RuntimeError("stopped")
    assert dest.read_text(encoding="utf-8") == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["scores.json"]


def test_two_writers_of_one_file_get_different_parts(tmp_path):
    dest = tmp_path / "x.json"
    with atomic_file(dest) as a, atomic_file(dest) as b:
        assert a != b
        a.write_text("a", encoding="utf-8")
        b.write_text("b", encoding="utf-8")
    assert dest.read_text(encoding="utf-8") == "a"  # the outer block ends last


def test_an_npz_written_through_a_handle_keeps_its_name(tmp_path):
    # np.savez appends ".npz" to a path argument; the study units write through a handle instead
    dest = tmp_path / "unit.npz"
    with atomic_file(dest) as part, open(part, "wb") as fh:
        np.savez(fh, tokens=np.arange(3))
    assert np.load(dest)["tokens"].tolist() == [0, 1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["unit.npz"]


def test_a_folder_replaces_the_previous_one_whole(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "stale.bin").write_bytes(b"s")
    with atomic_folder(dest) as folder:
        (folder / "weights.bin").write_bytes(b"w")
        assert (dest / "stale.bin").exists()  # the old build stays usable while the new one is made
    assert sorted(p.name for p in dest.iterdir()) == ["weights.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
    assert oct(dest.stat().st_mode & 0o777) == oct(0o755)


def test_a_failed_folder_build_keeps_the_previous_folder_and_leaves_nothing(tmp_path):
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / "good.bin").write_bytes(b"g")
    with pytest.raises(RuntimeError, match="stopped"), atomic_folder(dest) as folder:
        (folder / "half.bin").write_bytes(b"h")
        raise RuntimeError("stopped")
    assert sorted(p.name for p in dest.iterdir()) == ["good.bin"]
    assert [p.name for p in tmp_path.iterdir()] == ["model"]
