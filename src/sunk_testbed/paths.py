"""Where the test bed keeps its caches (kept across runs) and its state (one per bed)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = REPO_ROOT / "testbed"


def cache_dir() -> Path:
    """Built binaries and root filesystems, keyed by version; outside the repo."""
    if explicit := os.environ.get("SUNK_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "sunk"


def default_state_dir() -> Path:
    """The state of the bed that `sunk local up` starts (one per machine by default)."""
    return Path(os.environ.get("SUNK_STATE", "/var/lib/sunk/local"))
