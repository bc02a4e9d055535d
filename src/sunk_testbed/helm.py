"""helm, built from the official Go module and cached like the Kubernetes binaries.

`ensure_helm` builds `helm` into `~/.cache/sunk/helm/<version>` once (via
testbed/helm/build.sh); `Helm` runs it against one kubeconfig. The charts
live in the repository's `charts/`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from sunk_testbed.control_plane import ensure_built
from sunk_testbed.paths import REPO_ROOT, SCRIPTS, cache_dir

HELM_VERSION = "v3.22.0"
CHARTS = REPO_ROOT / "charts"


def helm_dir() -> Path:
    return cache_dir() / "helm" / HELM_VERSION


def ensure_helm(log: Callable[[str], None]) -> Path:
    """The helm binary, built into the cache unless a finished build is there."""
    out = helm_dir()
    script = [str(SCRIPTS / "helm" / "build.sh"), str(out), HELM_VERSION]
    return ensure_built(out, script, f"helm {HELM_VERSION}", log) / "helm"


class HelmError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{super().__str__()}\nstdout: {self.stdout}\nstderr: {self.stderr}"


class Helm:
    """helm against one cluster; every call returns helm's stdout."""

    def __init__(self, binary: Path, kubeconfig: Path | None, home: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig
        # helm's caches, repository config and kube discovery cache (under
        # $HOME/.kube) stay out of the user's home and the working directory.
        self.env = {
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "PATH": "/usr/bin:/bin",
        }

    def run(self, args: Sequence[str], *, timeout: float = 600) -> str:
        argv = [str(self.binary), *args]
        if self.kubeconfig is not None:
            argv += ["--kubeconfig", str(self.kubeconfig)]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if proc.returncode != 0:
            raise HelmError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc.stdout

    def upgrade_install(
        self,
        release: str,
        chart: str | Path,
        namespace: str,
        values: Mapping[str, Any],
        *,
        wait: bool = False,
        timeout: str = "5m",
        values_file: Path,
    ) -> str:
        """`helm upgrade --install` with `values` (written to `values_file`);
        `chart` is one of `charts/` by name, or any chart directory's path."""
        values_file.write_text(yaml.safe_dump(dict(values)))
        args = ["upgrade", "--install", release, str(CHARTS / chart), "-n", namespace]
        args += ["--create-namespace", "-f", str(values_file), "--timeout", timeout]
        if wait:
            args.append("--wait")
        return self.run(args)

    def uninstall(self, release: str, namespace: str) -> str:
        return self.run(["uninstall", release, "-n", namespace, "--wait", "--timeout", "3m"])
