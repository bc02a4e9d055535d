"""A pod's DRA ResourceClaims read and allocated with its Slurm job's GPUs
(the apiserver side of sunk.scheduler.claims).

Before the job is submitted, `gpus` counts the GPUs the pod's claims ask for
(Slurm's `--gres=gpu:N`). Once Slurm has placed the job, `allocate` writes
each claim's `status.allocation` (the devices of the node whose index
attribute is the GPU index Slurm chose) and `status.reservedFor` (the pod),
before the pod is bound: the kubelet then has the claim's driver prepare
exactly those devices. Each write carries the claim's resourceVersion, so a
claim someone else allocated meanwhile is never overwritten (409, retried).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lightkube import ApiError, AsyncClient
from lightkube.models.resource_v1 import DeviceClassConfiguration
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import DeviceClass, ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from sunk.scheduler.claims import (
    GpuClass,
    GpuRequest,
    InvalidClaim,
    MissingDevice,
    allocation,
    claim_gpu_requests,
    claim_status_patch,
    pod_claims,
    reserved_for,
    total_gpus,
)


class ClaimNotReady(Exception):
    """A claim cannot be read or allocated yet (not made from its template,
    its driver's devices not published, a write raced): look again soon."""


def asks_claims(pod: Pod) -> bool:
    return bool(pod.spec and pod.spec.resourceClaims)


class ClaimAllocator:
    def __init__(self, kube: AsyncClient, classes: Mapping[str, GpuClass]) -> None:
        self._kube = kube
        self._classes = dict(classes)
        self._drivers = {name: c.driver for name, c in classes.items()}

    async def claims(self, pod: Pod) -> list[tuple[ResourceClaim, list[GpuRequest]]]:
        """The pod's claims with the GPUs each asks for. ClaimNotReady while a
        claim is not made yet; InvalidClaim (naming the claim and field) for
        one Slurm cannot meet, or one allocated for something else."""
        assert pod.metadata is not None
        namespace = pod.metadata.namespace or "default"
        found = []
        for entry in pod_claims(pod):
            if entry.claim is None:
                raise ClaimNotReady(
                    f"its ResourceClaim {entry.pod_claim!r} is not made from its template yet"
                )
            try:
                claim = await self._kube.get(ResourceClaim, entry.claim, namespace=namespace)
            except ApiError as exc:
                if exc.status.code == 404:
                    raise ClaimNotReady(f"ResourceClaim {entry.claim} does not exist") from None
                raise
            status = claim.status
            reserved = (status.reservedFor if status else None) or []
            if status and status.allocation and all(r.uid != pod.metadata.uid for r in reserved):
                users = ", ".join(f"{r.resource}/{r.name}" for r in reserved) or "nothing"
                raise InvalidClaim(
                    f"ResourceClaim {entry.claim}: status.allocation: allocated already, "
                    f"reserved for {users}; a claim sunk's scheduler allocates is the pod's own"
                )
            try:
                requests = claim_gpu_requests(claim, self._drivers)
            except InvalidClaim as exc:
                raise InvalidClaim(f"ResourceClaim {entry.claim}: {exc}") from None
            found.append((claim, requests))
        return found

    async def gpus(self, pod: Pod) -> int:
        """How many GPUs the pod's claims ask for (0: none, or no claims)."""
        if not asks_claims(pod):
            return 0
        return sum(total_gpus(requests) for _, requests in await self.claims(pod))

    async def allocate(self, pod: Pod, node: str, gpus: Sequence[int]) -> None:
        """Allocate the pod's claims on `node` with Slurm's GPU indices there,
        the first claim the first of them, and reserve them for the pod. A
        claim already allocated for the pod is left as it is."""
        claims = await self.claims(pod)
        wanted = sum(total_gpus(requests) for _, requests in claims)
        if wanted > len(gpus):
            raise InvalidClaim(
                f"the pod's claims ask for {wanted} GPUs; its Slurm job holds {len(gpus)} on {node}"
            )
        slices = [s async for s in self._kube.list(ResourceSlice, fields={"spec.nodeName": node})]
        consumer = reserved_for(pod)
        start = 0
        for claim, requests in claims:
            count = total_gpus(requests)
            indices = gpus[start : start + count]
            start += count
            assert claim.metadata is not None
            if claim.status and claim.status.allocation:
                continue  # the pod's already (claims checked that)
            try:
                result = allocation(
                    requests,
                    indices,
                    node,
                    slices,
                    index_attribute=self._index_attribute(claim, requests),
                    config=claim.spec.devices.config if claim.spec and claim.spec.devices else None,
                    class_config=await self._class_config(requests),
                )
            except MissingDevice as exc:
                raise ClaimNotReady(f"ResourceClaim {claim.metadata.name}: {exc}") from None
            body = claim_status_patch(result, consumer)
            # The claim as read, or nothing: never over someone else's allocation.
            body["metadata"] = {"resourceVersion": claim.metadata.resourceVersion}
            try:
                await self._kube.patch(
                    ResourceClaim.Status,
                    claim.metadata.name or "",
                    body,
                    namespace=claim.metadata.namespace,
                    patch_type=PatchType.MERGE,
                )
            except ApiError as exc:
                if exc.status.code in (404, 409):
                    raise ClaimNotReady(
                        f"ResourceClaim {claim.metadata.name} changed while allocated: "
                        f"{exc.status.message}"
                    ) from None
                if exc.status.code in (403, 422):
                    # Refused (the chart's RBAC, an admission policy): the
                    # pod's condition says why, not only the scheduler's log.
                    raise ClaimNotReady(
                        f"ResourceClaim {claim.metadata.name} not allocated: {exc.status.message}"
                    ) from None
                raise

    def _index_attribute(self, claim: ResourceClaim, requests: Sequence[GpuRequest]) -> str:
        attributes = {self._classes[r.device_class].index_attribute for r in requests}
        if len(attributes) > 1:
            assert claim.metadata is not None
            raise InvalidClaim(
                f"ResourceClaim {claim.metadata.name}: spec.devices.requests: its device "
                f"classes name GPUs by different attributes ({', '.join(sorted(attributes))}); "
                "ask each in a claim of its own"
            )
        return attributes.pop() if attributes else "index"

    async def _class_config(
        self, requests: Sequence[GpuRequest]
    ) -> dict[str, list[DeviceClassConfiguration]]:
        """Each request's DeviceClass config, which goes into the allocation
        as the kube-scheduler puts it there."""
        config = {}
        for name in {r.device_class for r in requests}:
            try:
                device_class = await self._kube.get(DeviceClass, name)
            except ApiError as exc:
                if exc.status.code == 404:
                    raise ClaimNotReady(f"DeviceClass {name} does not exist") from None
                raise
            config[name] = list(device_class.spec.config or []) if device_class.spec else []
        return config
