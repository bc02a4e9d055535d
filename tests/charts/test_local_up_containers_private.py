"""Container jobs from a registry that asks for a login, on the README's cluster
(docs/containers.md, "Registry credentials").

`sunk local up` runs a second registry of the bed's images, `private.sunk.test`,
that answers only with its login (HTTP Basic against an htpasswd file, as
Docker's registry does it), puts that login into a
`kubernetes.io/dockerconfigjson` Secret, as a platform team's imagePullSecret,
and gives the slurm chart its name as `containers.registryAuthSecret`. The
slurmd pods mount it root-only; container-fetch pulls with it. Researchers
never see it: a job cannot read the file, and without it the registry refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from plugins.local_cluster import ssh, summary
from sunk_testbed.bed import USER_NAME, USER_UID
from sunk_testbed.charts import PRIVATE_REGISTRY_HOST
from sunk_testbed.images import REGISTRY_HOST

pytestmark = pytest.mark.e2e

MARKER = "ID=sunk-container-test"
# Where the chart mounts the Secret and container-fetch looks.
AUTH_DIR = "/etc/sunk/registry-auth"


@pytest.fixture
def private_image(local_cluster: Path) -> str:
    """The bed's container-test image, named at the registry that asks for a login."""
    ref: str = summary(local_cluster)["images"]["sunk/container-test"]
    assert ref.startswith(f"{REGISTRY_HOST}/"), ref
    return PRIVATE_REGISTRY_HOST + ref.removeprefix(REGISTRY_HOST)


def test_a_container_job_pulls_from_the_private_registry_with_the_charts_secret(
    local_cluster: Path, private_image: str
) -> None:
    """On every slurmd pod: the tag resolved (and, where missing, the image
    pulled) with the Secret's login; the step runs in the image as the user."""
    out = ssh(
        local_cluster,
        f"srun -N3 --container-image={private_image}"
        " sh -c 'cat /etc/os-release; echo uid=$(id -u) user=$(id -un)'",
    )
    assert out.count(MARKER) == 3, out
    assert out.count(f"uid={USER_UID} user={USER_NAME}") == 3, out


def test_a_job_can_neither_read_the_credentials_nor_pull_without_them(
    local_cluster: Path, private_image: str
) -> None:
    """As the researcher on a slurmd pod, in its filesystem: the mounted file
    is root's alone, and skopeo (the fetcher's own tool, with the pod's
    registries.conf) without it gets the registry's 401. Bound into a
    container with --container-mounts, the file is as unreadable."""
    out = ssh(
        local_cluster,
        "srun sh -c '"
        f"stat -L -c %a:%U {AUTH_DIR}/config.json;"
        f" cat {AUTH_DIR}/config.json >/dev/null 2>&1 && echo READABLE || echo unreadable;"
        f" skopeo inspect --no-tags docker://{private_image} 2>&1 | tail -n1'",
    )
    lines = out.splitlines()
    assert lines[:2] == ["400:root", "unreadable"], out
    assert "authentication required" in out or "unauthorized" in out, out
    out = ssh(
        local_cluster,
        f"srun --container-image={private_image} --container-mounts={AUTH_DIR}:/auth:ro"
        " sh -c 'cat /etc/os-release;"
        " cat /auth/config.json >/dev/null 2>&1 && echo READABLE || echo unreadable'",
    )
    assert MARKER in out, out
    assert out.splitlines()[-1] == "unreadable", out
