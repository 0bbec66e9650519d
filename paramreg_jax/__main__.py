"""``python -m paramreg_jax``: the command line (see ``paramreg_jax._src.cli``)."""

from paramreg_jax._src.cli import main

if __name__ == "__main__":
  raise SystemExit(main())
