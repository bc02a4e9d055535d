"""`python -m sunk`: the sunk command (how `sunk local up` starts its own daemons)."""

from sunk.cli import app

app()
