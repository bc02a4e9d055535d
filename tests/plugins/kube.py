"""Fixtures for the Kubernetes half of the test bed.

`kube_access` starts the real control plane once per session (building the
binaries first if the cache has none). Set SUNK_KUBECONFIG to a kubeconfig to
run the same tests against another cluster instead: nothing is started then,
and tests that need the bed's own PKI (`kube_control_plane`) are skipped.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import yaml
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod, ServiceAccount
from lightkube.resources.events_v1 import Event

from sunk_testbed.control_plane import KubeAccess, KubeControlPlane, async_client
from sunk_testbed.procs import Supervisor

# Every namespace the tests create carries this label (to find leftovers).
TEST_LABEL = "sunk.test/contract"


def _log(message: str) -> None:
    print(f"[testbed] {message}", file=sys.stderr, flush=True)


def _access_from_kubeconfig(path: Path, scratch: Path) -> KubeAccess:
    """Describe a foreign cluster by its kubeconfig (current context only)."""
    config = yaml.safe_load(path.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    cluster = cluster["cluster"]
    if "certificate-authority" in cluster:
        ca_file = (path.parent / cluster["certificate-authority"]).resolve()
    else:
        ca_file = scratch / "ca.crt"
        ca_file.write_bytes(base64.b64decode(cluster.get("certificate-authority-data", "")))
    return KubeAccess(
        server=cluster["server"],
        ca_file=ca_file,
        admin_kubeconfig=path,
        kubeconfigs={"admin": path},
    )


@pytest.fixture(scope="session")
def kube_control_plane(testbed_state_dir: Path, supervisor: Supervisor) -> KubeControlPlane | None:
    """The bed's control plane object (None against a foreign cluster)."""
    if os.environ.get("SUNK_KUBECONFIG"):
        return None
    return KubeControlPlane(testbed_state_dir, supervisor, log=_log)


@pytest.fixture(scope="session")
def kube_access(
    kube_control_plane: KubeControlPlane | None,
    testbed_external: bool,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[KubeAccess]:
    if kube_control_plane is None:
        scratch = tmp_path_factory.mktemp("kube")
        yield _access_from_kubeconfig(Path(os.environ["SUNK_KUBECONFIG"]), scratch)
        return
    access = kube_control_plane.start()
    yield access
    if not testbed_external:
        kube_control_plane.stop()


@pytest.fixture(scope="session")
def kubeconfig(kube_access: KubeAccess) -> Path:
    """The admin kubeconfig (group system:masters on the bed)."""
    return kube_access.admin_kubeconfig


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def kube(kubeconfig: Path) -> AsyncIterator[AsyncClient]:
    """An admin lightkube client, shared by the session."""
    client = async_client(kubeconfig, field_manager="sunk-tests")
    yield client
    await client.close()


def _namespace_name(node_name: str) -> str:
    """A DNS-1123 label from the test's name, unique per use."""
    slug = re.sub(r"[^a-z0-9]+", "-", node_name.lower().removeprefix("test_")).strip("-")
    return f"t-{slug[:48].rstrip('-')}-{secrets.token_hex(3)}"


@pytest_asyncio.fixture(loop_scope="session")
async def namespace(kube: AsyncClient, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace per test, deleted afterwards (without waiting for it to go)."""
    name = _namespace_name(request.node.name)
    await kube.create(Namespace(metadata=ObjectMeta(name=name, labels={TEST_LABEL: "true"})))
    # Pods are refused until kube-controller-manager has made the default
    # ServiceAccount (the ServiceAccount admission plugin looks it up).
    for _ in range(200):
        try:
            await kube.get(ServiceAccount, "default", namespace=name)
            break
        except ApiError as e:
            if e.status.code != 404:
                raise
            await asyncio.sleep(0.05)
    yield name
    # Pods bound to a node nobody runs would wait for a kubelet forever and
    # keep the namespace Terminating: remove them at once.
    try:
        await kube.deletecollection(Pod, namespace=name, grace_period=0)
        await kube.delete(Namespace, name)
    except ApiError as e:
        if e.status.code != 404:
            raise


async def event_note(kube: AsyncClient, namespace: str, reason: str, within: float = 10) -> str:
    """The note of the first Event with `reason` in `namespace`, once there is one."""

    async def first() -> str:
        while True:
            async for event in kube.list(Event, namespace=namespace):
                if event.reason == reason:
                    return event.note or ""
            await asyncio.sleep(0.1)

    return await asyncio.wait_for(first(), within)
