"""``python -m heedful ...``: the command line, as the ``heedful`` script runs it (through the
warm worker when one runs, :mod:`heedful.launch`)."""

from heedful.launch import main

if __name__ == "__main__":
    main()
