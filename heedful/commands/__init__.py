"""CLI commands beyond ``explain``/``methods``/``models``, one module each (registered in heedful.cli)."""
