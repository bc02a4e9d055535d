"""GPU pods are bound to a node one at a time, each once the kubelet has
admitted the one before (pure).

The kubelet's device plugin API does not say which pod an allocation is for;
sunk's GPU plugin hands a pod the GPUs of the one pod of the node that Slurm
gave GPUs to and the kubelet has not admitted yet (sunk.gpus.choice). Two such
pods on one node at once could each receive the other's GPUs (the kubelet
admits them in the order it sees them, not the order they were bound). So the
scheduler binds the next GPU pod to a node only when no GPU pod it bound
there still awaits admission. The kubelet acknowledges a pod it admitted
(after its devices are allocated) by setting `status.startTime`; a pod it
refused turns Failed.
"""

from __future__ import annotations

from collections.abc import Iterable

from lightkube.resources.core_v1 import Pod

from sunk.gpus.choice import condition_gpus


def awaiting_admission(pod: Pod) -> bool:
    """A pod bound with GPUs from Slurm that the kubelet has not admitted yet:
    Pending, not terminating, the scheduler's GPU condition on it, no start time."""
    status = pod.status
    if pod.metadata is None or pod.metadata.deletionTimestamp is not None:
        return False
    if pod.spec is None or not pod.spec.nodeName or status is None:
        return False
    if status.phase not in (None, "Pending") or status.startTime is not None:
        return False
    return bool(condition_gpus(status.conditions or []))


def blocking(node_pods: Iterable[Pod], binding: Iterable[str]) -> list[str]:
    """What a GPU bind to a node waits for: the names of its pods awaiting
    admission, and of pods bound there by this process that its cache does
    not show bound yet (`binding`). Empty: the bind may go ahead."""
    waiting = {
        pod.metadata.name
        for pod in node_pods
        if pod.metadata and pod.metadata.name and awaiting_admission(pod)
    }
    return sorted(waiting | set(binding))
