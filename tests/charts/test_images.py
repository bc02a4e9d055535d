"""The images are built from what the test bed runs (no Docker engine here, so
the Dockerfiles are checked against the bed and the charts, not built)."""

from __future__ import annotations

import re

import pytest
import yaml

from sunk_testbed.helm import CHARTS
from sunk_testbed.paths import REPO_ROOT

IMAGES = REPO_ROOT / "images"
INSTALL = "testbed/slurm/install-slurm.sh"
BED_SUITE = "trixie"  # what Bed.prepare builds the root filesystem from


@pytest.mark.parametrize("image", ["slurm", "login"])
def test_slurm_images_run_the_root_filesystem_install_script(image: str) -> None:
    text = (IMAGES / image / "Dockerfile").read_text()
    assert re.search(rf"^FROM debian:{BED_SUITE}(-slim)?$", text, re.MULTILINE)
    assert f"COPY {INSTALL} /tmp/install-slurm.sh" in text
    assert "RUN bash /tmp/install-slurm.sh" in text


def test_the_charts_default_to_the_images_build_sh_makes() -> None:
    build = (IMAGES / "build.sh").read_text()
    registry = re.search(r"registry=\$\{1:-([^}]+)\}", build)
    assert registry is not None
    slurm = yaml.safe_load((CHARTS / "slurm" / "values.yaml").read_text())
    cluster = yaml.safe_load((CHARTS / "sunk-cluster" / "values.yaml").read_text())
    assert slurm["image"]["repository"] == f"{registry[1]}/slurm"
    assert slurm["login"]["image"]["repository"] == f"{registry[1]}/slurm-login"
    assert cluster["image"]["repository"] == f"{registry[1]}/sunk"
    assert f"slurm_tag=${{2:-{slurm['image']['tag']}}}" in build
    assert f"sunk_tag=${{3:-{cluster['image']['tag']}}}" in build
