"""The ``paramreg-jax`` command line (``main`` is the entry point)."""

from paramreg_jax._src.cli.main import main

__all__ = ("main",)
