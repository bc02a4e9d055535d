"""Hostlist expressions: what we write, Slurm reads back as the same names."""

from __future__ import annotations

import random
import re

import pytest

from sunk.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("", []),
        ("tb1", ["tb1"]),
        ("a,b", ["a", "b"]),
        ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
        ("x[1]y,z", ["x1y", "z"]),
        ("/dev/nvidia[0-1]", ["/dev/nvidia0", "/dev/nvidia1"]),
    ],
)
def test_expand(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("a[1-", "never closed"),
        ("a]", "without '['"),
        ("a[[1]]", "nested"),
        ("a[3-1]", "backwards"),
        ("a[x]", "bad range"),
        ("a[1-y]", "bad range"),
        ("a,,b", "empty element"),
        ("a b", "whitespace"),
        ("a[0-9999999]", "more than"),
    ],
)
def test_bad_hostlists_say_what_is_wrong(expr: str, message: str) -> None:
    with pytest.raises(HostlistError, match=re.escape(message)) as error:
        expand(expr)
    assert repr(expr) in str(error.value)


def test_compress() -> None:
    assert compress([]) == ""
    assert compress(["tb1"]) == "tb1"
    assert compress(["gpu03", "gpu01", "gpu02", "gpu07", "login"]) == "gpu[01-03,07],login"
    assert compress(["n9", "n10", "n08"]) == "n[08,9-10]"  # widths never mix in a range
    assert compress(["a1", "a1", "a2"]) == "a[1-2]"
    assert compress(["r1-n1", "r1-n2", "r2-n1"]) == "r1-n[1-2],r2-n1"


def test_compress_round_trips() -> None:
    rng = random.Random(4)  # noqa: S311 - test data, not secrets
    for _ in range(200):
        names = {
            f"{rng.choice(['gpu', 'cpu', 'r1-n'])}{rng.randrange(0, 120):0{rng.choice([1, 3])}d}"
            for _ in range(rng.randrange(1, 40))
        }
        assert sorted(expand(compress(names))) == sorted(names)
