"""The images are built from what the test bed runs (no Docker engine here, so
the Dockerfiles are checked against the bed and the charts, not built)."""

from __future__ import annotations

import re

import pytest
import yaml

from sunk_testbed.helm import CHARTS
from sunk_testbed.images import DEFAULT_SLURM, SLURM_SUITES
from sunk_testbed.paths import REPO_ROOT

IMAGES = REPO_ROOT / "images"
# The daemons' image runs the test bed root filesystem's script; the login
# image its own, without the daemons.
INSTALL = {"slurm": "install-slurm.sh", "login": "install-login.sh"}


@pytest.mark.parametrize("image", ["slurm", "login"])
def test_slurm_images_run_their_install_script(image: str) -> None:
    text = (IMAGES / image / "Dockerfile").read_text()
    # The suite is the Slurm release: the default one's, unless the build says otherwise.
    default = SLURM_SUITES[DEFAULT_SLURM]
    assert re.search(rf"^ARG DEBIAN_SUITE={default}$", text, re.MULTILINE)
    assert re.search(r"^FROM debian:\$\{DEBIAN_SUITE\}-slim$", text, re.MULTILINE)
    script = INSTALL[image]
    assert f"COPY testbed/slurm/{script} /tmp/{script}" in text
    assert f"RUN bash /tmp/{script}" in text


def fixed_ids(script: str) -> dict[str, int]:
    """The users and groups an install script creates with fixed ids."""
    text = (REPO_ROOT / "testbed" / "slurm" / script).read_text()
    users = re.findall(r"useradd --system --uid (\d+) .* (\S+)$", text, re.MULTILINE)
    groups = re.findall(r"groupadd --system --gid (\d+) (\S+)$", text, re.MULTILINE)
    assert [name for _, name in users] == [name for _, name in groups]
    return {name: int(uid) for uid, name in users}


def test_the_login_image_gives_its_users_the_daemons_ids() -> None:
    # The login pod reads the daemons' image's /etc/passwd: ids must agree.
    login, daemons = fixed_ids("install-login.sh"), fixed_ids("install-slurm.sh")
    assert set(login) == {"slurm", "munge"}
    assert login == {name: daemons[name] for name in login}
    ids = yaml.safe_load((CHARTS / "slurm" / "values.yaml").read_text())["ids"]
    assert daemons == {name: ids[name] for name in daemons}


def test_the_charts_default_to_the_images_build_sh_makes() -> None:
    build = (IMAGES / "build.sh").read_text()
    registry = re.search(r"registry=\$\{1:-([^}]+)\}", build)
    assert registry is not None
    slurm = yaml.safe_load((CHARTS / "slurm" / "values.yaml").read_text())
    cluster = yaml.safe_load((CHARTS / "sunk-cluster" / "values.yaml").read_text())
    assert slurm["image"]["repository"] == f"{registry[1]}/slurm"
    assert slurm["login"]["image"]["repository"] == f"{registry[1]}/slurm-login"
    assert cluster["image"]["repository"] == f"{registry[1]}/sunk"
    assert slurm["image"]["tag"] == DEFAULT_SLURM
    assert f"slurm_tag=${{2:-{slurm['image']['tag']}}}" in build
    for release, suite in SLURM_SUITES.items():
        assert f"{release}) suite={suite} ;;" in build
    assert f"sunk_tag=${{3:-{cluster['image']['tag']}}}" in build
    # The in-chart LDAP directory (identity.provider ldap) is versioned with sunk.
    ldap = slurm["identity"]["ldap"]["server"]["image"]
    assert ldap == {"repository": f"{registry[1]}/ldap", "tag": cluster["image"]["tag"]}
    assert '-f images/ldap/Dockerfile -t "$registry/ldap:$sunk_tag"' in build
