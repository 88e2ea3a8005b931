"""Write a zoo model's shipped weights from a trained build (for heedful's maintainers).

    heedful models build minilm-sentiment --from-scratch     # trains into the cache
    python -m heedful.zoo.ship minilm-sentiment              # writes heedful/zoo/deltas/...

then pin the printed sha256 in :mod:`heedful.zoo.builders`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from heedful.zoo.registry import zoo_dir


def main(argv: list[str] | None = None) -> None:
    from heedful.quiet import quiet_transformers
    from heedful.zoo import builders

    shippers = {"minilm-sentiment": builders.ship_minilm_sentiment}
    parser = argparse.ArgumentParser(prog="python -m heedful.zoo.ship", description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=sorted(shippers))
    parser.add_argument("--from", dest="source", type=Path, help="trained model folder (default: the zoo cache's)")
    args = parser.parse_args(argv)
    with quiet_transformers():
        record = shippers[args.name](args.source or zoo_dir(args.name))
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
