"""What the runtime created on the host, recorded before it is created.

An append-only journal (`ledger.jsonl` in the runtime's state directory): one
line per `add` or `remove`, flushed at once. Each entry is written *before*
the thing it names is made, so a crash at any point leaves a record of
everything that may exist; cleanup treats "not there" as done. Reading folds
the journal into the set that may still exist; `compact` rewrites it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Kinds of host objects, in the order cleanup removes them.
PROCESS_ROOT = "process-root"  # a sandbox mount point: kill every process rooted there
CGROUP = "cgroup"  # a cgroup directory (absolute path)
NETNS = "netns"  # a name under /run/netns
LINK = "link"  # a network interface in the host namespace
BRIDGE = "bridge"
NETNS_MOUNT = "netns-mount"  # /run/netns was made a mount point by our first `ip netns add`

Key = tuple[str, str]


class Ledger:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._live: dict[Key, dict[str, Any]] = self._read()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._out = self.path.open("a")

    def _read(self) -> dict[Key, dict[str, Any]]:
        live: dict[Key, dict[str, Any]] = {}
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return live
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue  # a torn last line after a crash
            key = (entry["kind"], entry["name"])
            if entry["op"] == "add":
                live[key] = entry.get("extra", {})
            else:
                live.pop(key, None)
        return live

    def _write(self, entry: dict[str, Any]) -> None:
        self._out.write(json.dumps(entry) + "\n")
        self._out.flush()

    def add(self, kind: str, name: str, **extra: Any) -> None:
        if (kind, name) in self._live and self._live[(kind, name)] == extra:
            return
        self._live[(kind, name)] = extra
        self._write({"op": "add", "kind": kind, "name": name, "extra": extra})

    def remove(self, kind: str, name: str) -> None:
        if (kind, name) in self._live:
            del self._live[(kind, name)]
            self._write({"op": "remove", "kind": kind, "name": name})

    def entries(self, kind: str) -> Iterator[tuple[str, dict[str, Any]]]:
        for (k, name), extra in list(self._live.items()):
            if k == kind:
                yield name, extra

    def has(self, kind: str, name: str) -> bool:
        return (kind, name) in self._live

    def compact(self) -> None:
        """Rewrite the journal as just the live entries (atomically)."""
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w") as out:
            for (kind, name), extra in self._live.items():
                out.write(json.dumps({"op": "add", "kind": kind, "name": name, "extra": extra}))
                out.write("\n")
        self._out.close()
        os.replace(tmp, self.path)
        self._out = self.path.open("a")

    def close(self) -> None:
        self._out.close()
