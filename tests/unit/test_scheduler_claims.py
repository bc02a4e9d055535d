"""A pod's DRA claims, allocated with Slurm's GPUs (sunk.scheduler.claims, pure).

Tables of good and bad claims (each refusal names its field), the allocation
of Slurm's GPU indices to the devices the drivers published, and properties:
any split of a job's GPUs among a claim's requests hands each index's device
out once, in request order; whatever a claim holds, reading its requests
raises nothing but InvalidClaim.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.core_v1 import (
    PodResourceClaim,
    PodResourceClaimStatus,
    PodSpec,
    PodStatus,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.resource_v1 import (
    CapacityRequirements,
    CELDeviceSelector,
    DeviceAttribute,
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceClassConfiguration,
    DeviceConstraint,
    DeviceDerivedAttribute,
    DeviceRequest,
    DeviceSelector,
    DeviceSubRequest,
    DeviceToleration,
    ExactDeviceRequest,
    OpaqueDeviceConfiguration,
    ResourceClaimConsumerReference,
    ResourceClaimSpec,
    ResourcePool,
    ResourceSliceSpec,
)
from lightkube.models.resource_v1 import Device as SliceDevice
from lightkube.resources.core_v1 import Pod
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from sunk.scheduler.claims import (
    GpuClass,
    GpuRequest,
    InvalidClaim,
    MissingDevice,
    PodClaim,
    allocation,
    claim_gpu_requests,
    claim_status_patch,
    parse_gpu_class,
    pod_claims,
    reserved_for,
    total_gpus,
)

pytestmark = pytest.mark.unit

EXAMPLE = "gpu.example.com"
NVIDIA = "gpu.nvidia.com"
GPU_CLASSES = {EXAMPLE: EXAMPLE, NVIDIA: NVIDIA}


# --- builders -----------------------------------------------------------------


def a_pod(
    entries: list[PodResourceClaim], statuses: list[PodResourceClaimStatus] | None = None
) -> Pod:
    return Pod(
        metadata=ObjectMeta(name="p", namespace="ns", uid="uid-1"),
        spec=PodSpec(containers=[], resourceClaims=entries),
        status=PodStatus(resourceClaimStatuses=statuses),
    )


def a_claim(
    *requests: DeviceRequest,
    constraints: list[DeviceConstraint] | None = None,
    config: list[DeviceClaimConfiguration] | None = None,
) -> ResourceClaim:
    return ResourceClaim(
        metadata=ObjectMeta(name="c", namespace="ns"),
        spec=ResourceClaimSpec(
            devices=DeviceClaim(
                requests=list(requests) or None, constraints=constraints, config=config
            )
        ),
    )


def exact(name: str = "gpus", device_class: str = EXAMPLE, **fields: Any) -> DeviceRequest:
    return DeviceRequest(
        name=name, exactly=ExactDeviceRequest(deviceClassName=device_class, **fields)
    )


def a_slice(
    driver: str,
    node: str,
    devices: dict[str, int],
    *,
    pool: str | None = None,
    generation: int = 1,
    attribute: str = "index",
    typed: bool = False,
) -> ResourceSlice:
    """A driver's slice of one node: device name -> GPU index, the attribute
    as the apiserver gives it (a plain dict) or as a typed DeviceAttribute."""

    def value(index: int) -> Any:
        return DeviceAttribute(int=index) if typed else {"int": index}

    return ResourceSlice(
        metadata=ObjectMeta(name=f"{node}-{driver}-{generation}"),
        spec=ResourceSliceSpec(
            driver=driver,
            nodeName=node,
            pool=ResourcePool(name=pool or node, generation=generation, resourceSliceCount=1),
            devices=[
                SliceDevice(
                    name=name, attributes={attribute: value(index), "uuid": {"string": name}}
                )
                for name, index in devices.items()
            ],
        ),
    )


def devices_of(result: Any) -> list[tuple[str, str, str, str]]:
    return [(r.request, r.driver, r.pool, r.device) for r in result.devices.results]


# Two nodes, two drivers; the device names tell them all apart.
SLICES = [
    a_slice(EXAMPLE, "n1", {f"ex-n1-{i}": i for i in range(4)}),
    a_slice(EXAMPLE, "n2", {f"ex-n2-{i}": i for i in range(4)}),
    a_slice(NVIDIA, "n1", {f"nv-n1-{i}": i for i in range(4)}, typed=True),
    a_slice(NVIDIA, "n2", {f"nv-n2-{i}": i for i in range(4)}, typed=True),
]


# --- pod_claims ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "statuses", "expected"),
    [
        ([], None, []),
        ([PodResourceClaim(name="gpu", resourceClaimName="shared")], None, [("gpu", "shared")]),
        (  # the controller-manager has made the template's claim
            [PodResourceClaim(name="gpu", resourceClaimTemplateName="t")],
            [PodResourceClaimStatus(name="gpu", resourceClaimName="p-gpu-x7k2")],
            [("gpu", "p-gpu-x7k2")],
        ),
        (  # ... or not yet
            [PodResourceClaim(name="gpu", resourceClaimTemplateName="t")],
            [PodResourceClaimStatus(name="other", resourceClaimName="p-other")],
            [("gpu", None)],
        ),
        (  # no claim was needed: the API says the entry can be ignored
            [PodResourceClaim(name="gpu", resourceClaimTemplateName="t")],
            [PodResourceClaimStatus(name="gpu")],
            [],
        ),
        (  # in the pod's order
            [
                PodResourceClaim(name="b", resourceClaimTemplateName="t"),
                PodResourceClaim(name="a", resourceClaimName="shared"),
            ],
            [PodResourceClaimStatus(name="b", resourceClaimName="p-b")],
            [("b", "p-b"), ("a", "shared")],
        ),
    ],
)
def test_a_pods_claims_are_named_by_the_pod_or_its_status(
    entries: list[PodResourceClaim],
    statuses: list[PodResourceClaimStatus] | None,
    expected: list[tuple[str, str | None]],
) -> None:
    assert pod_claims(a_pod(entries, statuses)) == [PodClaim(*e) for e in expected]


def test_a_pod_without_a_spec_has_no_claims() -> None:
    assert pod_claims(Pod(metadata=ObjectMeta(name="p"))) == []


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (PodResourceClaim(name="gpu"), r"spec\.resourceClaims\[1\]: sets neither"),
        (
            PodResourceClaim(name="gpu", resourceClaimName="c", resourceClaimTemplateName="t"),
            r"spec\.resourceClaims\[1\]: sets both",
        ),
        (PodResourceClaim(name="", resourceClaimName="c"), r"spec\.resourceClaims\[1\]\.name"),
    ],
)
def test_a_pod_claim_entry_must_name_one_claim_or_template(
    entry: PodResourceClaim, message: str
) -> None:
    pod = a_pod([PodResourceClaim(name="ok", resourceClaimName="c0"), entry])
    with pytest.raises(InvalidClaim, match=message):
        pod_claims(pod)


# --- claim_gpu_requests ---------------------------------------------------------


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        (ResourceClaim(metadata=ObjectMeta(name="c")), []),
        (a_claim(), []),
        (a_claim(exact()), [GpuRequest("gpus", 1, EXAMPLE, device_class=EXAMPLE)]),
        (a_claim(exact(count=2)), [GpuRequest("gpus", 2, EXAMPLE, device_class=EXAMPLE)]),
        (
            a_claim(exact(allocationMode="ExactCount", count=3, adminAccess=False)),
            [GpuRequest("gpus", 3, EXAMPLE, device_class=EXAMPLE)],
        ),
        (
            a_claim(exact("a", NVIDIA, count=2), exact("b", EXAMPLE)),
            [
                GpuRequest("a", 2, NVIDIA, device_class=NVIDIA),
                GpuRequest("b", 1, EXAMPLE, device_class=EXAMPLE),
            ],
        ),
        (  # capacity with nothing asked of it, and no selectors, change nothing
            a_claim(exact(capacity=CapacityRequirements(), selectors=[])),
            [GpuRequest("gpus", 1, EXAMPLE, device_class=EXAMPLE)],
        ),
        (  # the claim's config chooses no device
            a_claim(
                exact(),
                config=[
                    DeviceClaimConfiguration(
                        opaque=OpaqueDeviceConfiguration(driver=EXAMPLE, parameters={"a": 1})
                    )
                ],
            ),
            [GpuRequest("gpus", 1, EXAMPLE, device_class=EXAMPLE)],
        ),
    ],
)
def test_a_claim_asks_slurm_for_counts_of_gpus(
    claim: ResourceClaim, expected: list[GpuRequest]
) -> None:
    assert claim_gpu_requests(claim, GPU_CLASSES) == expected


def test_a_requests_tolerations_travel_with_it() -> None:
    toleration = DeviceToleration(key="gpu.example.com/unhealthy", operator="Exists")
    (request,) = claim_gpu_requests(a_claim(exact(tolerations=[toleration])), GPU_CLASSES)
    assert request.tolerations == (toleration,)


@pytest.mark.parametrize(
    ("claim", "message"),
    [
        (
            a_claim(exact(allocationMode="All")),
            r"^spec\.devices\.requests\[0\]\.exactly\.allocationMode: 'All' is not supported:"
            r" ask for a count of GPUs$",
        ),
        (
            a_claim(exact(allocationMode="Some")),
            r"^spec\.devices\.requests\[0\]\.exactly\.allocationMode: 'Some' is not known",
        ),
        (a_claim(exact(count=0)), r"^spec\.devices\.requests\[0\]\.exactly\.count: .* not 0$"),
        (a_claim(exact(count=-2)), r"^spec\.devices\.requests\[0\]\.exactly\.count: "),
        (
            a_claim(exact(selectors=[DeviceSelector(cel=CELDeviceSelector(expression="true"))])),
            r"^spec\.devices\.requests\[0\]\.exactly\.selectors: .*CEL",
        ),
        (
            a_claim(
                exact(derivedAttributes=[DeviceDerivedAttribute(expression="1", name="d/numa")])
            ),
            r"^spec\.devices\.requests\[0\]\.exactly\.derivedAttributes: ",
        ),
        (
            a_claim(exact(adminAccess=True)),
            r"^spec\.devices\.requests\[0\]\.exactly\.adminAccess: ",
        ),
        (
            a_claim(exact(capacity=CapacityRequirements(requests={"memory": "10Gi"}))),
            r"^spec\.devices\.requests\[0\]\.exactly\.capacity: .*whole GPUs",
        ),
        (
            a_claim(
                exact(),
                DeviceRequest(
                    name="alt",
                    firstAvailable=[DeviceSubRequest(name="s", deviceClassName=EXAMPLE)],
                ),
            ),
            r"^spec\.devices\.requests\[1\]\.firstAvailable: not supported",
        ),
        (a_claim(DeviceRequest(name="none")), r"^spec\.devices\.requests\[0\]\.exactly: must"),
        (
            a_claim(exact(device_class="fpga.example.com")),
            r"^spec\.devices\.requests\[0\]\.exactly\.deviceClassName: 'fpga\.example\.com'"
            r" is not a GPU class sunk allocates"
            r" \(known: 'gpu\.example\.com', 'gpu\.nvidia\.com'\)",
        ),
        (
            a_claim(exact(), constraints=[DeviceConstraint(matchAttribute="x.com/numa")]),
            r"^spec\.devices\.constraints: not supported",
        ),
        (a_claim(exact("a"), exact("a")), r"^spec\.devices\.requests\[1\]\.name: 'a'"),
        (a_claim(exact("")), r"^spec\.devices\.requests\[0\]\.name: must be set"),
    ],
)
def test_a_claim_slurm_cannot_meet_is_refused_naming_the_field(
    claim: ResourceClaim, message: str
) -> None:
    with pytest.raises(InvalidClaim, match=message):
        claim_gpu_requests(claim, GPU_CLASSES)


def test_with_no_gpu_classes_configured_every_class_is_refused() -> None:
    with pytest.raises(InvalidClaim, match=r"known: none are configured"):
        claim_gpu_requests(a_claim(exact()), {})


def test_the_total_is_the_sum_of_the_counts() -> None:
    assert total_gpus([]) == 0
    assert total_gpus([GpuRequest("a", 2, EXAMPLE), GpuRequest("b", 3, NVIDIA)]) == 5
    with pytest.raises(ValueError, match="at least 1"):
        GpuRequest("a", 0, EXAMPLE)


# --- allocation -----------------------------------------------------------------


def test_slurms_indices_are_the_devices_of_the_node_and_driver() -> None:
    result = allocation([GpuRequest("gpus", 2, EXAMPLE)], (1, 3), "n1", SLICES)
    assert devices_of(result) == [
        ("gpus", EXAMPLE, "n1", "ex-n1-1"),
        ("gpus", EXAMPLE, "n1", "ex-n1-3"),
    ]
    assert result.to_dict()["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
        ]
    }
    assert result.devices.config is None


def test_the_requests_take_the_indices_in_order() -> None:
    requests = [GpuRequest("a", 1, NVIDIA), GpuRequest("b", 2, EXAMPLE)]
    result = allocation(requests, (3, 0, 2), "n2", SLICES)
    assert devices_of(result) == [
        ("a", NVIDIA, "n2", "nv-n2-3"),
        ("b", EXAMPLE, "n2", "ex-n2-0"),
        ("b", EXAMPLE, "n2", "ex-n2-2"),
    ]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    slices = [
        a_slice(EXAMPLE, "n1", {"old-0": 0, "old-1": 1}, generation=1),
        a_slice(EXAMPLE, "n1", {"new-1": 1}, generation=2),
        a_slice(EXAMPLE, "n1", {"other-pool-0": 0}, pool="n1-other", generation=1),
    ]
    result = allocation([GpuRequest("gpus", 1, EXAMPLE)], [1], "n1", slices)
    assert devices_of(result) == [("gpus", EXAMPLE, "n1", "new-1")]
    # Index 0 is gone from the newest generation of pool n1, but another pool still has it.
    result = allocation([GpuRequest("gpus", 1, EXAMPLE)], [0], "n1", slices)
    assert devices_of(result) == [("gpus", EXAMPLE, "n1-other", "other-pool-0")]
    with pytest.raises(MissingDevice):
        allocation([GpuRequest("gpus", 1, EXAMPLE)], [0], "n1", slices[:2])


@pytest.mark.parametrize(
    ("published", "index_attribute", "found"),
    [
        ("index", "index", True),
        (f"{EXAMPLE}/index", "index", True),  # qualified by its own driver
        ("index", f"{EXAMPLE}/index", True),
        (f"{EXAMPLE}/index", f"{EXAMPLE}/index", True),
        ("other.com/index", "index", False),  # another domain's attribute
        ("index", "other.com/index", False),
        ("other.com/index", "other.com/index", True),
        ("minor", "index", False),
    ],
)
def test_the_index_attribute_may_be_qualified_by_the_driver(
    published: str, index_attribute: str, found: bool
) -> None:
    slices = [a_slice(EXAMPLE, "n1", {"gpu-5": 5}, attribute=published)]
    requests = [GpuRequest("gpus", 1, EXAMPLE)]
    if found:
        result = allocation(requests, [5], "n1", slices, index_attribute=index_attribute)
        assert devices_of(result) == [("gpus", EXAMPLE, "n1", "gpu-5")]
    else:
        with pytest.raises(MissingDevice):
            allocation(requests, [5], "n1", slices, index_attribute=index_attribute)


def test_a_device_named_per_device_may_be_on_the_node() -> None:
    spec = ResourceSliceSpec(
        driver=EXAMPLE,
        perDeviceNodeSelection=True,
        pool=ResourcePool(name="shared", generation=1, resourceSliceCount=1),
        devices=[
            SliceDevice(name="a", nodeName="n2", attributes={"index": {"int": 0}}),
            SliceDevice(name="b", nodeName="n1", attributes={"index": {"int": 0}}),
            SliceDevice(name="c", allNodes=True, attributes={"index": {"int": 1}}),
        ],
    )
    slices = [ResourceSlice(spec=spec)]
    result = allocation([GpuRequest("gpus", 1, EXAMPLE)], [0], "n1", slices)
    assert devices_of(result) == [("gpus", EXAMPLE, "shared", "b")]
    with pytest.raises(MissingDevice):  # a device of every node is no GPU of this one
        allocation([GpuRequest("gpus", 1, EXAMPLE)], [1], "n1", slices)


def test_an_index_no_device_has_yet_is_missing() -> None:
    with pytest.raises(MissingDevice) as raised:
        allocation([GpuRequest("gpus", 2, NVIDIA)], [1, 7], "n1", SLICES)
    assert (raised.value.driver, raised.value.node, raised.value.index) == (NVIDIA, "n1", 7)
    message = str(raised.value)
    assert NVIDIA in message
    assert "'n1'" in message
    assert "7" in message
    with pytest.raises(MissingDevice, match="'n3'"):
        allocation([GpuRequest("gpus", 1, NVIDIA)], [0], "n3", SLICES)
    with pytest.raises(MissingDevice):
        allocation([GpuRequest("gpus", 1, NVIDIA)], [0], "n1", [])


@pytest.mark.parametrize(
    ("indices", "message"),
    [
        ([1], r"allocated 1 GPUs \[1\] on node 'n1', the claim's requests ask for 2"),
        ([0, 1, 2], "ask for 2"),
        ([2, 2], r"repeat: \[2, 2\]"),
    ],
)
def test_slurms_indices_must_match_the_requests(indices: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allocation([GpuRequest("gpus", 2, EXAMPLE)], indices, "n1", SLICES)


def test_an_index_two_devices_have_is_refused() -> None:
    slices = [a_slice(EXAMPLE, "n1", {"gpu-0": 0, "mig-0-0": 0})]
    with pytest.raises(ValueError, match=r"several devices .* \(n1/gpu-0, n1/mig-0-0\)"):
        allocation([GpuRequest("gpus", 1, EXAMPLE)], [0], "n1", slices)


def test_no_requests_allocate_nothing() -> None:
    result = allocation([], [], "n1", SLICES)
    assert result.devices.results == []


def test_the_allocation_carries_the_classes_config_then_the_claims() -> None:
    def opaque(what: str) -> OpaqueDeviceConfiguration:
        return OpaqueDeviceConfiguration(driver=EXAMPLE, parameters={"what": what})

    requests = [
        GpuRequest("a", 1, EXAMPLE, device_class=EXAMPLE),
        GpuRequest("b", 1, NVIDIA, device_class=NVIDIA),
    ]
    result = allocation(
        requests,
        [0, 1],
        "n1",
        SLICES,
        config=[
            DeviceClaimConfiguration(opaque=opaque("claim-all")),
            DeviceClaimConfiguration(opaque=opaque("claim-b"), requests=["b"]),
        ],
        class_config={EXAMPLE: [DeviceClassConfiguration(opaque=opaque("class"))]},
    )
    assert [c.to_dict() for c in result.devices.config] == [
        {"source": "FromClass", "requests": ["a"], "opaque": opaque("class").to_dict()},
        {"source": "FromClaim", "opaque": opaque("claim-all").to_dict()},
        {"source": "FromClaim", "requests": ["b"], "opaque": opaque("claim-b").to_dict()},
    ]


def test_a_requests_tolerations_are_in_its_results() -> None:
    toleration = DeviceToleration(key="k", operator="Exists", effect="NoExecute")
    request = GpuRequest("gpus", 2, EXAMPLE, tolerations=(toleration,))
    result = allocation([request], [0, 1], "n1", SLICES)
    assert [r.tolerations for r in result.devices.results] == [[toleration], [toleration]]
    assert allocation([GpuRequest("gpus", 1, EXAMPLE)], [0], "n1", SLICES).to_dict()["devices"][
        "results"
    ] == [{"device": "ex-n1-0", "driver": EXAMPLE, "pool": "n1", "request": "gpus"}]


# --- reservation and the status write -------------------------------------------


def test_the_claim_is_reserved_for_the_pod() -> None:
    consumer = reserved_for(a_pod([]))
    assert consumer.to_dict() == {"resource": "pods", "name": "p", "uid": "uid-1"}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (None, r"^metadata\.name"),
        (ObjectMeta(uid="u"), r"^metadata\.name"),
        (ObjectMeta(name="p"), r"^metadata\.uid: pod 'p'"),
    ],
)
def test_a_pod_without_name_or_uid_cannot_be_a_consumer(
    meta: ObjectMeta | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        reserved_for(Pod(metadata=meta))


def test_the_status_patch_holds_the_allocation_and_the_reservation() -> None:
    result = allocation([GpuRequest("gpus", 1, EXAMPLE)], [2], "n1", SLICES)
    consumer = reserved_for(a_pod([]))
    patch = claim_status_patch(result, consumer)
    assert patch == {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "gpus", "driver": EXAMPLE, "pool": "n1", "device": "ex-n1-2"}
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": ["n1"]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "uid-1"}],
        }
    }


def test_the_status_patch_keeps_the_other_consumers_once() -> None:
    result = allocation([], [], "n1", [])
    other = ResourceClaimConsumerReference(resource="pods", name="q", uid="uid-2")
    consumer = ResourceClaimConsumerReference(resource="pods", name="p", uid="uid-1")
    reserved = claim_status_patch(result, consumer, reserved=[other])["status"]["reservedFor"]
    assert [c["uid"] for c in reserved] == ["uid-2", "uid-1"]
    again = claim_status_patch(result, consumer, reserved=[consumer, other])
    assert [c["uid"] for c in again["status"]["reservedFor"]] == ["uid-1", "uid-2"]


# --- properties -----------------------------------------------------------------

DRIVERS = (EXAMPLE, NVIDIA)
MAX_INDEX = 16
# Every index on both nodes, for both drivers: names tell driver, node and index apart.
ALL_SLICES = [
    a_slice(driver, node, {f"{driver[4:6]}-{node}-{i}": i for i in range(MAX_INDEX)})
    for driver in DRIVERS
    for node in ("n1", "n2")
]


@st.composite
def splits(draw: st.DrawFn) -> tuple[list[GpuRequest], list[int]]:
    """Requests with any counts and drivers, and as many distinct indices in any order."""
    counts = draw(st.lists(st.integers(1, 4), max_size=4))
    requests = [
        GpuRequest(f"r{i}", count, draw(st.sampled_from(DRIVERS))) for i, count in enumerate(counts)
    ]
    indices = draw(st.permutations(range(MAX_INDEX)))[: sum(counts)]
    return requests, list(indices)


@given(splits())
def test_each_index_is_one_device_handed_out_once_in_request_order(
    split: tuple[list[GpuRequest], list[int]],
) -> None:
    requests, indices = split
    results = allocation(requests, indices, "n1", ALL_SLICES).devices.results
    expected = [
        (request.request, request.driver, f"{request.driver[4:6]}-n1-{index}")
        for request, index in zip(
            [r for r in requests for _ in range(r.count)], indices, strict=True
        )
    ]
    assert [(r.request, r.driver, r.device) for r in results] == expected
    assert len({(r.driver, r.device) for r in results}) == len(indices)


TEXT = st.text(max_size=10)
CLASSES = st.one_of(st.sampled_from(sorted(GPU_CLASSES)), TEXT)
exacts = st.builds(
    ExactDeviceRequest,
    deviceClassName=CLASSES,
    adminAccess=st.none() | st.booleans(),
    allocationMode=st.none() | st.sampled_from(["ExactCount", "All"]) | TEXT,
    count=st.none() | st.integers(-3, 2**40),
    capacity=st.none()
    | st.builds(
        CapacityRequirements,
        requests=st.none() | st.dictionaries(TEXT, st.just("1"), max_size=2),
    ),
    derivedAttributes=st.none()
    | st.lists(st.builds(DeviceDerivedAttribute, expression=TEXT, name=TEXT), max_size=1),
    selectors=st.none()
    | st.lists(
        st.builds(DeviceSelector, cel=st.builds(CELDeviceSelector, expression=TEXT)),
        max_size=1,
    ),
    tolerations=st.none() | st.lists(st.builds(DeviceToleration, key=st.none() | TEXT), max_size=2),
)
requests = st.builds(
    DeviceRequest,
    name=st.sampled_from(["", "a", "b", "gpus"]),
    exactly=st.none() | exacts,
    firstAvailable=st.none()
    | st.lists(st.builds(DeviceSubRequest, name=TEXT, deviceClassName=CLASSES), max_size=1),
)
claims = st.builds(
    ResourceClaim,
    metadata=st.just(ObjectMeta(name="c")),
    spec=st.none()
    | st.builds(
        ResourceClaimSpec,
        devices=st.none()
        | st.builds(
            DeviceClaim,
            requests=st.none() | st.lists(requests, max_size=4),
            constraints=st.none()
            | st.lists(st.builds(DeviceConstraint, matchAttribute=TEXT), max_size=1),
            config=st.none()
            | st.lists(st.builds(DeviceClaimConfiguration, requests=st.none()), max_size=1),
        ),
    ),
)


def refusal(claim: ResourceClaim) -> str | None:
    """The InvalidClaim's message, or None: any other exception fails the test."""
    try:
        claim_gpu_requests(claim, GPU_CLASSES)
    except InvalidClaim as refused:
        return str(refused)
    return None


@given(claims)
def test_any_claim_is_counts_of_gpus_or_an_invalid_claim(claim: ResourceClaim) -> None:
    message = refusal(claim)
    if message is not None:
        assert message.startswith("spec.devices.")
        return
    gpu_requests = claim_gpu_requests(claim, GPU_CLASSES)
    asked = (claim.spec.devices.requests or []) if claim.spec and claim.spec.devices else []
    assert [r.request for r in gpu_requests] == [r.name for r in asked]
    for gpu_request, request in zip(gpu_requests, asked, strict=True):
        assert gpu_request.count >= 1
        assert gpu_request.count == (request.exactly.count or 1)
        assert gpu_request.driver == GPU_CLASSES[request.exactly.deviceClassName]


# Claims Slurm can meet: known classes, counts, nothing that chooses devices.
good_requests = st.lists(
    st.tuples(st.sampled_from(sorted(GPU_CLASSES)), st.none() | st.integers(1, 64)),
    max_size=5,
)


@given(good_requests, st.sampled_from([None, "ExactCount"]))
def test_any_claim_of_known_classes_is_its_counts_of_gpus(
    asked: list[tuple[str, int | None]], mode: str | None
) -> None:
    claim = a_claim(
        *(
            exact(f"r{i}", device_class, count=count, allocationMode=mode)
            for i, (device_class, count) in enumerate(asked)
        )
    )
    gpu_requests = claim_gpu_requests(claim, GPU_CLASSES)
    assert [(r.request, r.driver, r.count) for r in gpu_requests] == [
        (f"r{i}", GPU_CLASSES[device_class], count or 1)
        for i, (device_class, count) in enumerate(asked)
    ]
    assert total_gpus(gpu_requests) == sum(count or 1 for _, count in asked)


# -- the scheduler's --dra-gpu-class --------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        (
            "gpu.nvidia.com=gpu.nvidia.com:minor",
            GpuClass("gpu.nvidia.com", "gpu.nvidia.com", "minor"),
        ),
        (
            "gpu.example.com=gpu.example.com",
            GpuClass("gpu.example.com", "gpu.example.com", "index"),
        ),
        ("a=b:gpu.nvidia.com/minor", GpuClass("a", "b", "gpu.nvidia.com/minor")),
    ],
)
def test_a_gpu_class_reads_its_driver_and_index_attribute(text: str, parsed: GpuClass) -> None:
    assert parse_gpu_class(text) == parsed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu.nvidia.com", "CLASS=DRIVER"),
        ("=gpu.nvidia.com", "CLASS ''"),
        ("GPU=gpu.nvidia.com", "CLASS 'GPU'"),
        ("gpu.nvidia.com=", "DRIVER ''"),
        ("gpu.nvidia.com=gpu_nvidia", "DRIVER 'gpu_nvidia'"),
        ("a=b:", "INDEX_ATTRIBUTE ''"),
        ("a=b:9minor", "INDEX_ATTRIBUTE '9minor'"),
        ("a=b:Bad/minor", "INDEX_ATTRIBUTE 'Bad/minor'"),
    ],
)
def test_a_bad_gpu_class_is_refused_naming_the_part(text: str, names: str) -> None:
    with pytest.raises(ValueError, match=names.replace("[", r"\[")):
        parse_gpu_class(text)


@pytest.mark.unit
@given(st.text(max_size=40))
def test_any_gpu_class_text_is_read_or_refused_with_value_error(text: str) -> None:
    try:
        parsed = parse_gpu_class(text)
    except ValueError:
        return
    # What is read writes back to the same text (or the default attribute's).
    written = f"{parsed.device_class}={parsed.driver}:{parsed.index_attribute}"
    assert written == text or f"{written}" == f"{text}:index"


_DNS = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_IDENT = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@pytest.mark.unit
@given(_DNS, _DNS, st.one_of(st.none(), _IDENT))
def test_any_well_formed_gpu_class_reads_back_as_written(
    device_class: str, driver: str, attribute: str | None
) -> None:
    text = f"{device_class}={driver}" + (f":{attribute}" if attribute else "")
    assert parse_gpu_class(text) == GpuClass(device_class, driver, attribute or "index")
