"""Human-rated sentiment snippets and the VADER lexicon, from the vaderSentiment 3.3.2 source archive.

The vaderSentiment source distribution (MIT licence) carries, in
``additional_resources/hutto_ICWSM_2014.tar.gz``, four sets of short texts that
twenty or more people each rated on a scale from -4 (very negative) to +4 (very
positive). Each ``*_GroundTruth.txt`` file holds one text per line as
``id<TAB>mean rating<TAB>text`` (UTF-8, CRLF line ends).

========  ======================================  ==========================
name      file                                    source of the texts
========  ======================================  ==========================
movies    movieReviewSnippets_GroundTruth.txt     Rotten Tomatoes sentences
amazon    amazonReviewSnippets_GroundTruth.txt    product reviews
nyt       nytEditorialSnippets_GroundTruth.txt    newspaper opinion pieces
tweets    tweets_GroundTruth.txt                  tweets
========  ======================================  ==========================

Nothing ships with heedful: the first call fetches the source archive
``vaderSentiment-3.3.2.tar.gz`` from PyPI, pinned by sha256 in :mod:`heedful.files.pins`
and checked before use, unpacks it as an archive (:func:`heedful.files.supply.unpack`;
its ``setup.py`` is never run) and copies the four files (and the lexicon) into
``heedful_home()/data/vader``; later calls read the copied files.

Labels and splits
-----------------
``label`` is 1 when the mean rating is above zero and 0 when it is below; texts
whose mean rating is exactly zero are dropped, so every set is a clean binary
task while ``rating`` stays available as a regression target.

:func:`load_split` gives a fixed train/test split of each set. The rows left
after dropping zeros, in file order, are permuted with
``numpy.random.default_rng(SPLIT_SEED)`` (``SPLIT_SEED = 20240601``); the first
``TEST_SIZES[name]`` positions of that permutation form the test split (1,000
texts for ``movies``, 500 for the other sets) and the rest form the train
split. Both splits are returned in file order.

**The movies test split is the held-out set of the heedful zoo**: the zoo's
sentiment models are fine-tuned on the movies train split only, and the
accuracy / correlation stored with each built model is measured on the movies
test split, which they never see during training.

:func:`vader_lexicon` returns the word-level valence ratings of the same
archive (``vaderSentiment/vader_lexicon.txt``), usable as lexicon-derived,
token-level human evidence for sentiment.
"""

from __future__ import annotations

import io
import tarfile
from functools import cache, lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from heedful.errors import HeedfulError
from heedful.files import supply
from heedful.files.atomic import atomic_folder
from heedful.files.cache import heedful_home
from heedful.files.pins import get_pin

#: The vaderSentiment source archive (an sdist: the wheel lacks the snippet data).
VADER_PIN = get_pin("vadersentiment")
VADER_VERSION = VADER_PIN.version
SPLIT_SEED = 20240601
SPLITS = ("train", "test")

#: Snippet set name -> ground-truth file name inside the ICWSM 2014 archive.
SNIPPET_FILES: dict[str, str] = {
    "movies": "movieReviewSnippets_GroundTruth.txt",
    "amazon": "amazonReviewSnippets_GroundTruth.txt",
    "nyt": "nytEditorialSnippets_GroundTruth.txt",
    "tweets": "tweets_GroundTruth.txt",
}
#: Number of texts in each set's test split.
TEST_SIZES: dict[str, int] = {"movies": 1000, "amazon": 500, "nyt": 500, "tweets": 500}

_INNER_ARCHIVE = "additional_resources/hutto_ICWSM_2014.tar.gz"
_LEXICON_MEMBER = "vaderSentiment/vader_lexicon.txt"
_LEXICON_FILE = "vader_lexicon.txt"


def data_dir() -> Path:
    """Where the extracted ground-truth files and lexicon live."""
    return heedful_home() / "data" / "vader"


def source_folder() -> Path:
    """The unpacked vaderSentiment source archive, fetched and checked on first use."""
    return supply.unpack(VADER_PIN) / f"vaderSentiment-{VADER_VERSION}"


def _extract(source: Path, dest: Path) -> None:
    """Write the four ground-truth files and the lexicon from the unpacked archive ``source``
    into ``dest`` (the inner archive is read in memory, only the wanted names are written)."""
    wanted = set(SNIPPET_FILES.values())
    inner_path, lexicon_path = source / _INNER_ARCHIVE, source / _LEXICON_MEMBER
    if not inner_path.is_file() or not lexicon_path.is_file():
        raise HeedfulError(
            f"{source} does not contain {_INNER_ARCHIVE} and {_LEXICON_MEMBER}",
            hint=f"delete {supply.unpacked_path(VADER_PIN)} and try again",
        )
    (dest / _LEXICON_FILE).write_bytes(lexicon_path.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(inner_path.read_bytes()), mode="r:gz") as inner:
        for member in inner.getmembers():
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base in wanted:
                (dest / base).write_bytes(inner.extractfile(member).read())  # type: ignore[union-attr]
                wanted.discard(base)
    if wanted:
        raise HeedfulError(
            f"{_INNER_ARCHIVE} in {source} lacks {', '.join(sorted(wanted))}",
            hint=f"delete {supply.unpacked_path(VADER_PIN)} and try again",
        )


def ensure_data() -> Path:
    """Download and extract the data once; return the folder that holds it."""
    target = data_dir()
    needed = [*SNIPPET_FILES.values(), _LEXICON_FILE]
    if all((target / name).is_file() for name in needed):
        return target
    source = source_folder()
    with atomic_folder(target) as folder:
        _extract(source, folder)
    return target


def _check_name(name: str) -> str:
    if name not in SNIPPET_FILES:
        raise HeedfulError(
            f"unknown snippet set {name!r}",
            hint=f"choose one of: {', '.join(SNIPPET_FILES)}",
        )
    return name


def _parse_ground_truth(raw: str) -> pd.DataFrame:
    """Parse ``id<TAB>rating<TAB>text`` lines (any line end) into a frame."""
    ids: list[str] = []
    ratings: list[float] = []
    texts: list[str] = []
    for line in raw.replace("\r\n", "\n").split("\n"):
        if not line.strip():
            continue
        ident, rating, text = line.split("\t", 2)
        ids.append(ident.strip())
        ratings.append(float(rating))
        texts.append(text.strip())
    return pd.DataFrame({"id": ids, "text": texts, "rating": ratings})


@cache
def _snippets(name: str) -> pd.DataFrame:
    path = ensure_data() / SNIPPET_FILES[name]
    frame = _parse_ground_truth(path.read_text(encoding="utf-8"))
    frame = frame[frame["rating"] != 0.0].reset_index(drop=True)
    frame["label"] = (frame["rating"] > 0).astype("int64")
    return frame


def load_snippets(name: str) -> pd.DataFrame:
    """All texts of one snippet set, in file order, with rating-zero texts dropped.

    Columns: ``id`` (str), ``text`` (str), ``rating`` (float, mean human rating in
    [-4, 4]) and ``label`` (1 if ``rating > 0`` else 0).
    """
    return _snippets(_check_name(name)).copy()


def split_indices(n_rows: int, n_test: int, seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Row positions (sorted) of the train and test splits of a set of ``n_rows`` rows."""
    if not 0 < n_test < n_rows:
        raise HeedfulError(f"cannot take {n_test} test rows out of {n_rows}")
    order = np.random.default_rng(seed).permutation(n_rows)
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def load_split(name: str, split: str) -> pd.DataFrame:
    """The ``"train"`` or ``"test"`` split of a snippet set (see the module docstring)."""
    if split not in SPLITS:
        raise HeedfulError(f"unknown split {split!r}", hint="choose 'train' or 'test'")
    frame = _snippets(_check_name(name))
    train, test = split_indices(len(frame), TEST_SIZES[name])
    rows = train if split == "train" else test
    return frame.iloc[rows].reset_index(drop=True)


@lru_cache(maxsize=1)
def _lexicon() -> dict[str, float]:
    raw = (ensure_data() / _LEXICON_FILE).read_text(encoding="utf-8")
    lexicon: dict[str, float] = {}
    for line in raw.replace("\r\n", "\n").split("\n"):
        fields = line.split("\t")
        if len(fields) >= 2 and fields[0]:
            # Later entries win, as in vaderSentiment's own loader.
            lexicon[fields[0]] = float(fields[1])
    return lexicon


def vader_lexicon() -> dict[str, float]:
    """Word (or emoticon) -> mean human valence rating in [-4, 4], from ``vader_lexicon.txt``."""
    return dict(_lexicon())
