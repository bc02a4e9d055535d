"""A pod's DRA ResourceClaims, allocated with the GPUs Slurm gave its job (pure).

A pod may ask for GPUs through ResourceClaims (`resource.k8s.io/v1`) instead
of `nvidia.com/gpu`-style resources. sunk's scheduler allocates those claims
itself: Slurm chooses the node and the GPU indices (`--gres=gpu:N`), and the
scheduler writes the claim's `status.allocation` naming exactly those devices,
as the GPU driver published them in its ResourceSlices, and `status.reservedFor`
the pod, then binds the pod; the DRA driver on the node then prepares exactly
the GPUs Slurm accounts for.

So a claim may ask only for what Slurm can choose: a count of GPUs of a
DeviceClass the scheduler knows. Whatever else would change which devices are
chosen (CEL selectors, alternatives, all devices, admin access, capacity,
constraints between devices) is refused with an `InvalidClaim` naming the
field: sunk would otherwise hand out devices the claim did not ask for.

Nothing here reads or writes the apiserver. The functions take lightkube's
models, so its resources (their subclasses) and hand-built models both do.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube.models.core_v1 import (
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
)
from lightkube.models.resource_v1 import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceAllocationResult,
    DeviceAttribute,
    DeviceClaimConfiguration,
    DeviceClassConfiguration,
    DeviceRequestAllocationResult,
    DeviceToleration,
    ExactDeviceRequest,
    ResourceClaim,
    ResourceClaimConsumerReference,
    ResourceSlice,
)

EXACT_COUNT = "ExactCount"
ALL = "All"
# The allocation's config entries, by where they came from (the API's words).
FROM_CLASS = "FromClass"
FROM_CLAIM = "FromClaim"


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ATTRIBUTE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z_][A-Za-z0-9_]*"
)
GPU_CLASS_FORMAT = "CLASS=DRIVER[:INDEX_ATTRIBUTE]"


@dataclass(frozen=True)
class GpuClass:
    """A DeviceClass whose claims sunk's scheduler allocates from Slurm's
    GPUs: its DRA driver, and the device attribute that holds the GPU's
    index as Slurm counts it (its position in gres.conf's device files: for
    File=/dev/nvidia[0-7], the device node's minor number)."""

    device_class: str
    driver: str
    index_attribute: str = "index"


def parse_gpu_class(text: str) -> GpuClass:
    """A GpuClass from CLASS=DRIVER[:INDEX_ATTRIBUTE] (the scheduler's
    --dra-gpu-class, the chart's scheduler.dra.gpuClasses); ValueError naming
    the part that is wrong."""
    device_class, equals, rest = text.partition("=")
    if not equals:
        raise ValueError(f"{text!r} is not {GPU_CLASS_FORMAT}")
    driver, colon, attribute = rest.partition(":")
    for what, value in (("CLASS", device_class), ("DRIVER", driver)):
        if len(value) > 253 or not _DNS_SUBDOMAIN.fullmatch(value):
            raise ValueError(
                f"{text!r}: {what} {value!r} is not a DNS subdomain (lower case letters, "
                f"digits, '-' and '.'; {GPU_CLASS_FORMAT})"
            )
    if colon and not _ATTRIBUTE.fullmatch(attribute):
        raise ValueError(
            f"{text!r}: INDEX_ATTRIBUTE {attribute!r} is not a device attribute name "
            "(a C identifier, optionally after a DNS subdomain and '/')"
        )
    return GpuClass(device_class, driver, attribute if colon else "index")


class InvalidClaim(ValueError):
    """A claim (or a pod's reference to one) asks for something sunk cannot
    allocate; the message starts with the field's path."""


class MissingDevice(LookupError):
    """No device of the driver on the node has the GPU index Slurm allocated:
    most likely the driver has not published its ResourceSlice yet (retry)."""

    def __init__(self, driver: str, node: str, index: int) -> None:
        super().__init__(
            f"driver {driver!r} publishes no device with GPU index {index} on node {node!r}"
            " (its ResourceSlice may not be published yet)"
        )
        self.driver = driver
        self.node = node
        self.index = index


@dataclass(frozen=True)
class PodClaim:
    """One entry of pod.spec.resourceClaims: its name in the pod, and the
    ResourceClaim's name (None while the claim of a template is not made yet)."""

    pod_claim: str
    claim: str | None


@dataclass(frozen=True)
class GpuRequest:
    """One request of a claim, as Slurm can meet it: `count` whole GPUs of
    `driver`. `device_class` picks the class's config for the allocation;
    `tolerations` (of device taints) go into the allocation as they are."""

    request: str
    count: int
    driver: str
    device_class: str = ""
    tolerations: tuple[DeviceToleration, ...] = ()

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"request {self.request!r}: a count of GPUs must be at least 1")


def pod_claims(pod: Pod) -> list[PodClaim]:
    """The pod's claims, in the order of pod.spec.resourceClaims. The name of a
    template's claim comes from pod.status.resourceClaimStatuses (set by the
    controller-manager): None until then. An entry whose status names no claim
    needs none (the API's word) and is left out."""
    entries = (pod.spec.resourceClaims if pod.spec else None) or []
    statuses = (pod.status.resourceClaimStatuses if pod.status else None) or []
    made = {status.name: status.resourceClaimName for status in statuses}
    claims: list[PodClaim] = []
    for i, entry in enumerate(entries):
        path = f"spec.resourceClaims[{i}]"
        if not entry.name:
            raise InvalidClaim(f"{path}.name: must be set")
        if entry.resourceClaimName and entry.resourceClaimTemplateName:
            raise InvalidClaim(
                f"{path}: sets both resourceClaimName and resourceClaimTemplateName; set one"
            )
        if entry.resourceClaimName:
            claims.append(PodClaim(entry.name, entry.resourceClaimName))
        elif entry.resourceClaimTemplateName:
            if entry.name not in made:
                claims.append(PodClaim(entry.name, None))
            elif made[entry.name]:
                claims.append(PodClaim(entry.name, made[entry.name]))
        else:
            raise InvalidClaim(
                f"{path}: sets neither resourceClaimName nor resourceClaimTemplateName; set one"
            )
    return claims


def claim_gpu_requests(claim: ResourceClaim, gpu_classes: Mapping[str, str]) -> list[GpuRequest]:
    """The claim's requests, in order, as counts of GPUs; `gpu_classes` maps
    each DeviceClass sunk allocates to its DRA driver. InvalidClaim for a
    request Slurm cannot meet as asked. A claim without requests asks for none.
    The claim's config is allowed: it chooses no device (`allocation` copies it)."""
    devices = claim.spec.devices if claim.spec else None
    if devices is None:
        return []
    if devices.constraints:
        # matchAttribute / distinctAttribute relate the chosen devices; Slurm does not see them.
        raise InvalidClaim(
            "spec.devices.constraints: not supported: Slurm chooses the GPUs and cannot"
            " match or tell apart device attributes"
        )
    requests: list[GpuRequest] = []
    names: set[str] = set()
    for i, request in enumerate(devices.requests or []):
        path = f"spec.devices.requests[{i}]"
        if not request.name:
            raise InvalidClaim(f"{path}.name: must be set")
        if request.name in names:
            raise InvalidClaim(f"{path}.name: {request.name!r} names an earlier request too")
        names.add(request.name)
        if request.firstAvailable:
            raise InvalidClaim(
                f"{path}.firstAvailable: not supported: ask for one GPU class with `exactly`"
            )
        if request.exactly is None:
            raise InvalidClaim(f"{path}.exactly: must be set")
        requests.append(_gpu_request(request.name, request.exactly, f"{path}.exactly", gpu_classes))
    return requests


def _gpu_request(
    name: str, exact: ExactDeviceRequest, path: str, gpu_classes: Mapping[str, str]
) -> GpuRequest:
    device_class = exact.deviceClassName
    if device_class not in gpu_classes:
        known = ", ".join(repr(c) for c in sorted(gpu_classes)) or "none are configured"
        raise InvalidClaim(
            f"{path}.deviceClassName: {device_class!r} is not a GPU class sunk allocates"
            f" (known: {known})"
        )
    mode = exact.allocationMode
    if mode == ALL:
        raise InvalidClaim(
            f"{path}.allocationMode: 'All' is not supported: ask for a count of GPUs"
        )
    if mode not in (None, EXACT_COUNT):
        # The API says clients must refuse modes they do not know.
        raise InvalidClaim(f"{path}.allocationMode: {mode!r} is not known: use {EXACT_COUNT!r}")
    count = 1 if exact.count is None else exact.count
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise InvalidClaim(f"{path}.count: must be a whole number of at least 1, not {count!r}")
    if exact.selectors:
        raise InvalidClaim(
            f"{path}.selectors: not supported: sunk does not evaluate CEL; Slurm chooses"
            " the GPUs (pick their kind with the device class)"
        )
    if exact.derivedAttributes:
        raise InvalidClaim(f"{path}.derivedAttributes: not supported: sunk does not evaluate CEL")
    if exact.adminAccess:
        raise InvalidClaim(
            f"{path}.adminAccess: not supported: sunk allocates GPUs for the pod's own use"
        )
    if exact.capacity is not None and exact.capacity.requests:
        raise InvalidClaim(f"{path}.capacity: not supported: sunk allocates whole GPUs")
    return GpuRequest(
        name,
        count,
        gpu_classes[device_class],
        device_class=device_class,
        tolerations=tuple(exact.tolerations or ()),
    )


def total_gpus(requests: Iterable[GpuRequest]) -> int:
    """How many GPUs the requests ask Slurm for (its `--gres=gpu:N`)."""
    return sum(request.count for request in requests)


def allocation(
    requests: Sequence[GpuRequest],
    gpu_indices: Sequence[int],
    node: str,
    slices: Iterable[ResourceSlice],
    *,
    index_attribute: str = "index",
    config: Sequence[DeviceClaimConfiguration] | None = None,
    class_config: Mapping[str, Sequence[DeviceClassConfiguration]] | None = None,
) -> AllocationResult:
    """The claim's allocation: Slurm's GPU indices handed out to the requests
    in order (the first request gets the first `count`, and so on), each the
    device of the request's driver on `node` whose attribute `index_attribute`
    (bare, or qualified by the driver: "<driver>/index") is that index.

    Only the newest generation of each driver's pool counts. The config (the
    claim's spec.devices.config, and `class_config` by device class name, from
    the DeviceClasses' spec.config) is copied as the kube-scheduler would:
    the classes' first, per request, then the claim's.

    ValueError if the indices are not as many as the requests ask for, or not
    distinct, or an index names two devices; MissingDevice for an index no
    device has (yet). Device taints are not checked (Slurm chose the GPU; the
    request's tolerations are copied), nor allocationTimestamp set."""
    total = total_gpus(requests)
    if len(gpu_indices) != total:
        raise ValueError(
            f"Slurm allocated {len(gpu_indices)} GPUs {list(gpu_indices)} on node {node!r},"
            f" the claim's requests ask for {total}"
        )
    if len(set(gpu_indices)) != len(gpu_indices):
        raise ValueError(f"Slurm's GPU indices on node {node!r} repeat: {list(gpu_indices)}")
    devices = _node_devices(slices, node, index_attribute)
    results: list[DeviceRequestAllocationResult] = []
    start = 0
    for request in requests:
        for index in gpu_indices[start : start + request.count]:
            found = devices.get((request.driver, index), [])
            if not found:
                raise MissingDevice(request.driver, node, index)
            if len(found) > 1:
                names = ", ".join(f"{pool}/{device}" for pool, device in found)
                raise ValueError(
                    f"driver {request.driver!r} publishes several devices with"
                    f" {index_attribute!r} {index} on node {node!r} ({names}):"
                    " the index attribute must name one device"
                )
            pool, device = found[0]
            results.append(
                DeviceRequestAllocationResult(
                    request=request.request,
                    driver=request.driver,
                    pool=pool,
                    device=device,
                    tolerations=list(request.tolerations) or None,
                )
            )
        start += request.count
    configs = [
        DeviceAllocationConfiguration(
            source=FROM_CLASS, requests=[request.request], opaque=c.opaque
        )
        for request in requests
        for c in (class_config or {}).get(request.device_class, ())
    ]
    configs += [
        DeviceAllocationConfiguration(source=FROM_CLAIM, requests=c.requests, opaque=c.opaque)
        for c in config or ()
    ]
    return AllocationResult(
        devices=DeviceAllocationResult(results=results, config=configs or None),
        nodeSelector=NodeSelector(
            nodeSelectorTerms=[
                NodeSelectorTerm(
                    matchFields=[
                        NodeSelectorRequirement(key="metadata.name", operator="In", values=[node])
                    ]
                )
            ]
        ),
    )


def _node_devices(
    slices: Iterable[ResourceSlice], node: str, index_attribute: str
) -> dict[tuple[str, int], list[tuple[str, str]]]:
    """(driver, index) -> [(pool, device)] of the devices on `node`, from
    the newest generation of each pool (a driver republishing its pool leaves
    the older slices behind for a while)."""
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        newest[key] = max(newest.get(key, s.spec.pool.generation), s.spec.pool.generation)
    devices: dict[tuple[str, int], list[tuple[str, str]]] = {}
    for s in slices:
        spec = s.spec
        if spec.pool.generation < newest[(spec.driver, spec.pool.name)]:
            continue
        for device in spec.devices or []:
            # A slice names its node, or (perDeviceNodeSelection) each device does.
            on = spec.nodeName or (device.nodeName if spec.perDeviceNodeSelection else None)
            if on != node:
                continue
            index = _int_attribute(device.attributes or {}, spec.driver, index_attribute)
            if index is not None:
                devices.setdefault((spec.driver, index), []).append((spec.pool.name, device.name))
    return devices


def _int_attribute(attributes: Mapping[str, Any], driver: str, name: str) -> int | None:
    """The attribute's int value; a driver's own attributes may be written bare
    ("index") or qualified by its name ("<driver>/index")."""
    domain, _, bare = name.rpartition("/")
    if not domain:
        names = [name, f"{driver}/{name}"]
    elif domain == driver:
        names = [name, bare]
    else:
        names = [name]  # another domain's attribute: only as written
    for candidate in names:
        attribute = attributes.get(candidate)
        # Slices read from the apiserver hold plain dicts here (the model types it `dict`).
        if isinstance(attribute, DeviceAttribute):
            value = attribute.int
        elif isinstance(attribute, Mapping):
            value = attribute.get("int")
        else:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def reserved_for(pod: Pod) -> ResourceClaimConsumerReference:
    """The claim's reservation for the pod (the core API group: none)."""
    meta = pod.metadata
    if meta is None or not meta.name:
        raise ValueError("metadata.name: the pod has no name")
    if not meta.uid:
        raise ValueError(f"metadata.uid: pod {meta.name!r} has no uid")
    return ResourceClaimConsumerReference(resource="pods", name=meta.name, uid=meta.uid)


def claim_status_patch(
    allocation: AllocationResult,
    consumer: ResourceClaimConsumerReference,
    *,
    reserved: Sequence[ResourceClaimConsumerReference] = (),
) -> dict[str, Any]:
    """The body for the claim's status subresource: the allocation, and
    reservedFor the consumer after those `reserved` already (a merge patch
    replaces the whole list, and a shared claim may serve other pods)."""
    consumers = list(reserved)
    if all(c.uid != consumer.uid for c in consumers):
        consumers.append(consumer)
    return {
        "status": {
            "allocation": allocation.to_dict(),
            "reservedFor": [c.to_dict() for c in consumers],
        }
    }
