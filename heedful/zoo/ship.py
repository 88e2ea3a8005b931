"""Write a zoo model's shipped weights from a trained build (for heedful's maintainers).

    heedful models build minilm-sentiment --from-scratch     # trains into the cache
    python -m heedful.zoo.ship minilm-sentiment              # writes heedful/zoo/deltas/...

(``smollm2-sentiment`` likewise, its differences taken from the built ``smollm2-135m``)

then pin the printed sha256 in :mod:`heedful.zoo.builders`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heedful.zoo.registry import ensure_built, get_entry, zoo_dir


def main(argv: list[str] | None = None) -> None:
    from heedful.quiet import quiet_transformers
    from heedful.zoo import builders

    parser = argparse.ArgumentParser(prog="python -m heedful.zoo.ship", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(builders.SHIPPED_CLASSIFIERS))
    parser.add_argument("--from", dest="source", type=Path, help="trained model folder (default: the zoo cache's)")
    args = parser.parse_args(argv)
    requires = get_entry(args.name).requires
    base = ensure_built(requires) if requires else None
    with quiet_transformers():
        record = builders.ship(builders.SHIPPED_CLASSIFIERS[args.name], args.source or zoo_dir(args.name), base=base)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
