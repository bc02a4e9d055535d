"""The charts as helm sees them, and as the real apiserver does.

`helm lint` for every values file under `charts/*/ci/`; then `helm template`
of each, every object (hooks included) created with a server-side dry-run in
a fresh namespace of the test bed's apiserver, after the chart's CRDs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import AsyncClient, codecs

from sunk.api import nodeset as nodeset_api
from sunk.api.install import crds, install_crds
from sunk.syncer.decide import LABEL_SLURM_BUSY
from sunk.testbed.helm import CHARTS, Helm, ensure_helm

pytestmark = pytest.mark.testbed

CI_VALUES = sorted(CHARTS.glob("*/ci/*.yaml"))
CRD_HEADER = (
    "# Generated from sunk.api.crd by tests/charts/test_charts_render.py"
    " (SUNK_WRITE_CHART_CRDS=1 rewrites it); do not edit.\n"
)


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(ensure_helm(print), None, tmp_path_factory.mktemp("helm"))


def _case(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.stem}"


@pytest.mark.parametrize("values", CI_VALUES, ids=_case)
def test_helm_lint_is_clean(helm: Helm, values: Path) -> None:
    out = helm.run(["lint", "--strict", str(values.parent.parent), "-f", str(values)])
    assert "0 chart(s) failed" in out, out


def test_the_cluster_chart_carries_the_crds_sunk_defines() -> None:
    for crd in crds():
        path = CHARTS / "sunk-cluster" / "crds" / f"{crd['metadata']['name']}.yaml"
        text = CRD_HEADER + yaml.safe_dump(crd, sort_keys=False)
        if os.environ.get("SUNK_WRITE_CHART_CRDS"):
            path.write_text(text)
        assert path.read_text() == text, f"{path} is stale: rerun with SUNK_WRITE_CHART_CRDS=1"


def _render(helm: Helm, values: Path, namespace: str) -> list[dict[str, Any]]:
    chart = values.parent.parent
    out = helm.run(["template", "rel", str(chart), "-n", namespace, "-f", str(values)])
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.mark.parametrize("values", CI_VALUES, ids=_case)
async def test_every_rendered_object_passes_a_server_side_dry_run(
    helm: Helm, values: Path, kube: AsyncClient, namespace: str
) -> None:
    await install_crds(kube)
    nodeset_api.resource()  # registers the kind with lightkube's codecs
    docs = _render(helm, values, namespace)
    assert docs
    kinds = set()
    for doc in docs:
        obj = codecs.from_dict(doc)
        kinds.add(doc["kind"])
        try:
            await kube.create(obj, namespace=namespace, dry_run=True)  # type: ignore[call-overload]
        except Exception as error:
            raise AssertionError(f"{doc['kind']}/{doc['metadata']['name']}: {error}") from error
    if values.parent.parent.name == "slurm":
        assert {"StatefulSet", "NodeSet", "Job", "ConfigMap", "Secret"} <= kinds


def test_busy_slurmd_pods_have_a_disruption_budget_that_can_be_turned_off(helm: Helm) -> None:
    def budgets(*args: str) -> list[dict[str, Any]]:
        out = helm.run(["template", "rel", str(CHARTS / "slurm"), *args])
        return [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PodDisruptionBudget"]

    (budget,) = budgets()
    labels = budget["spec"]["selector"]["matchLabels"]
    assert labels[LABEL_SLURM_BUSY] == "true"  # the label the syncer writes
    assert labels["app.kubernetes.io/component"] == "slurmd"
    assert budgets("--set", "busyNodeBudget=false") == []
