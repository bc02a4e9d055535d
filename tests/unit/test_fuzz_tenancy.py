"""Property-based tests of the tenancy ConfigMap's parser (sunk.scheduler.tenancy)
and of what a pod's author may then be in Slurm (sunk.scheduler.request.identity_of).

Whatever an admin writes (or mistypes) into the ConfigMap and whatever a pod's
author writes on a pod: the parser raises nothing but TenancyError, a parsed
tenancy never grants a uid below 1000, above MAX_ID or reserved (a daemon's,
an admin's, nobody's), a pod is never given a uid or gid outside its
namespace's grant, and a tenancy written out reads back the same.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from sunk.scheduler.request import (
    ANNOTATION_GROUP_ID,
    ANNOTATION_USER_ID,
    InvalidPod,
    Options,
    identity_of,
)
from sunk.scheduler.tenancy import (
    MAX_ID,
    MIN_ID,
    RESERVED,
    Tenancy,
    TenancyError,
    parse_tenancy,
)

pytestmark = pytest.mark.unit

# Ids near the edges that matter: the floor, the reserved ids, the top.
EDGES = [0, 1, 999, 1000, 1001, 5000, 64029, 64030, 64036, 64037, 64040, 64041, 64042]
EDGES += [65531, 65532, 65533, 65534, 65535, MAX_ID, MAX_ID + 1, 2**32, 2**63]
ids = st.one_of(st.sampled_from(EDGES), st.integers(0, 70000), st.integers(-5, 2**40))


@st.composite
def id_ranges(draw: st.DrawFn) -> str:
    low = draw(ids)
    if draw(st.booleans()):
        return str(low)
    return f"{low}-{low + draw(st.integers(-3, 3000))}"


def _id_text(draw: st.DrawFn) -> Any:
    """What an admin might write where an id range goes: mostly ranges, sometimes junk."""
    return draw(
        st.one_of(
            id_ranges(),
            ids,
            st.text(alphabet="0123456789- ,x", max_size=12),
            st.none(),
            st.lists(st.integers(), max_size=2),
        )
    )


names = st.text(alphabet="abcdefgh-", min_size=1, max_size=6)


@st.composite
def grants(draw: st.DrawFn) -> dict[str, Any]:
    """A grant as YAML data: near-valid, with any field possibly off."""
    uids = draw(id_ranges())
    low = int(uids.split("-", 1)[0]) if uids.split("-", 1)[0].isdigit() else 0
    grant: dict[str, Any] = {
        "namespaces": draw(st.lists(names, max_size=3)),
        "uids": uids if draw(st.integers(0, 9)) else _id_text(draw),
        "user": low if draw(st.booleans()) else draw(ids),
    }
    if draw(st.booleans()):
        grant["gids"] = draw(id_ranges())
        grant["group"] = draw(ids)
    for field in ("accounts", "partitions", "qos", "reservations"):
        if draw(st.booleans()):
            grant[field] = draw(st.lists(names, max_size=3))
    if not draw(st.integers(0, 19)):
        grant[draw(names)] = draw(st.integers())  # a field that does not exist
    return grant


@st.composite
def documents(draw: st.DrawFn) -> str:
    document: dict[str, Any] = {"tenants": draw(st.lists(grants(), max_size=4))}
    if draw(st.booleans()):
        document["reserved"] = draw(st.lists(st.one_of(id_ranges(), ids), max_size=3))
    return yaml.safe_dump(document)


@st.composite
def valid_tenancies(draw: st.DrawFn) -> str:
    """Tenancies an admin would write: granted ranges clear of the reserved ids."""
    tenants = []
    namespaces = draw(st.lists(names, unique=True, max_size=6))
    start = draw(st.sampled_from([1000, 5000, 63000, 65536, 10**6, MAX_ID - 300]))
    for index, chunk in enumerate(namespaces[i : i + 2] for i in range(0, len(namespaces), 2)):
        low = start + index * 100 + draw(st.integers(0, 20))
        high = low + draw(st.integers(0, 40))
        if RESERVED.within(low, high).ranges:
            continue
        grant: dict[str, Any] = {
            "namespaces": chunk,
            "uids": f"{low}-{high}" if high > low else str(low),
            "user": draw(st.integers(low, high)),
        }
        if draw(st.booleans()):
            grant["gids"], grant["group"] = f"{low}-{high}", low
        for field in ("accounts", "partitions", "qos", "reservations"):
            grant[field] = draw(st.lists(names, max_size=2))
        tenants.append(grant)
    document: dict[str, Any] = {"tenants": tenants}
    if draw(st.booleans()):
        document["reserved"] = draw(
            st.lists(st.sampled_from(["70000", "80000-80010", 90000]), max_size=2)
        )
    return yaml.safe_dump(document)


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
texts = st.one_of(
    documents(),
    st.text(max_size=200),
    yaml_values.map(yaml.safe_dump),
    st.dictionaries(st.sampled_from(["tenants", "reserved", "x"]), yaml_values).map(yaml.safe_dump),
)


def _owned(tenancy: Tenancy) -> None:
    """Every uid and gid the tenancy grants is one a tenant may have."""
    reserved = tenancy.reserved_ids()
    for uid in tenancy.uids():
        assert MIN_ID <= uid <= MAX_ID
        assert uid not in reserved
        assert uid not in RESERVED
    for grant in tenancy.tenants:
        assert grant.allows_uid(grant.user)
        if grant.group is not None:
            assert grant.allows_gid(grant.group)
        for low, high in reserved:  # each end of each reserved range, and below the floor
            for number in (low, high, MIN_ID - 1):
                assert not grant.allows_uid(number)
                assert not grant.allows_gid(number)


@pytest.mark.fuzz
@given(texts)
def test_the_parser_raises_only_its_own_error_and_grants_no_reserved_id(text: str) -> None:
    refused = ""
    try:
        tenancy = parse_tenancy(text, "cm")
    except TenancyError as error:
        refused = str(error)
    if refused:
        assert refused.startswith("cm: ")  # it names where the tenancy came from
    else:
        _owned(tenancy)


@pytest.mark.fuzz
@given(st.one_of(valid_tenancies(), documents()))
def test_a_tenancy_written_out_reads_back_the_same(text: str) -> None:
    try:
        tenancy = parse_tenancy(text, "cm")
    except TenancyError:
        return  # refused: nothing to write out
    again = parse_tenancy(tenancy.to_yaml(), "written")
    assert again == tenancy
    assert again.reserved_ids() == tenancy.reserved_ids()
    assert again.uids() == tenancy.uids()


annotation_ids = st.one_of(
    st.none(),
    ids.map(str),
    st.text(alphabet="0123456789-+ x", max_size=8),
)


@pytest.mark.fuzz
@given(st.one_of(valid_tenancies(), documents()), names, annotation_ids, annotation_ids)
def test_a_pod_is_never_given_an_id_its_namespace_was_not_granted(
    text: str, namespace: str, user_id: str | None, group_id: str | None
) -> None:
    """Whatever the pod's author writes: InvalidPod, or an identity within the grant."""
    try:
        tenancy = parse_tenancy(text, "cm")
    except TenancyError:
        return  # refused: no pod is served by it
    annotations = {
        key: value
        for key, value in ((ANNOTATION_USER_ID, user_id), (ANNOTATION_GROUP_ID, group_id))
        if value is not None
    }
    pod = Pod(metadata=ObjectMeta(name="p", namespace=namespace, annotations=annotations))
    try:
        identity = identity_of(pod, tenancy, "cm", Options())
    except InvalidPod:
        return
    grant = tenancy.grant_for(namespace)
    assert grant is not None
    assert grant.allows_uid(identity.user_id)
    assert identity.user_id not in tenancy.reserved_ids()
    assert identity.user_id >= MIN_ID
    if identity.group_id is not None:
        assert grant.allows_gid(identity.group_id)
        assert identity.group_id not in tenancy.reserved_ids()
