"""The slurm chart rendered by `helm template` from a values dict, as its
render tests use it: release `rel` in namespace `hpc`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sunk_testbed.helm import CHARTS, Helm, HelmError


def render(
    helm: Helm, tmp_path: Path, values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values or {}))
    out = helm.run(["template", "rel", str(CHARTS / "slurm"), "-n", "hpc", "-f", str(file)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


def refused(helm: Helm, tmp_path: Path, values: dict[str, Any]) -> str:
    """helm's error for values the chart refuses."""
    with pytest.raises(HelmError) as error:
        render(helm, tmp_path, values)
    return str(error.value.stderr)
