"""`python -m sunk`: the sunk command, as its console script runs it."""

from sunk.cli import main

main()
