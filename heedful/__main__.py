"""``python -m heedful ...``: the command line, as the ``heedful`` script runs it."""

from heedful.cli import main

if __name__ == "__main__":
    main()
