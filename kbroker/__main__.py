"""`python -m kbroker`: the CLI, for when the `kbroker` script is not on PATH (or is another checkout's)."""

from kbroker.cli import main

main()
