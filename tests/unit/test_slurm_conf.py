"""slurm.conf's KillWait as the scheduler reads it (sunk.slurm.conf): what the
slurm chart renders, what a person may add in `slurmConfigExtra`, and text
that is not slurm.conf at all."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunk.slurm.conf import DEFAULT_KILL_WAIT, SlurmConfError, kill_wait

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("", DEFAULT_KILL_WAIT),
        ("ClusterName=hpc\nKillWait=35\n", 35),
        ("killwait=40", 40),  # keys are case-insensitive
        ("MinJobAge=30 KillWait=12 MessageTimeout=5", 12),  # pairs share a line
        ("KillWait = 20", 20),
        ('KillWait="25"', 25),
        ("#KillWait=3\n", DEFAULT_KILL_WAIT),
        ("ClusterName=hpc # KillWait=3", DEFAULT_KILL_WAIT),
        ("Comment=a\\#b KillWait=7", 7),  # an escaped # is not a comment
        ("OverKillWait=9", DEFAULT_KILL_WAIT),  # another key
        ("Epilog=KillWait=9", DEFAULT_KILL_WAIT),  # a value, not a key
        ("KillWait=35\nKillWait=35", 35),  # the same twice is no conflict
    ],
)
def test_kill_wait(text: str, seconds: int) -> None:
    assert kill_wait(text) == seconds


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("KillWait=abc", "KillWait='abc': not a number"),
        ("KillWait=-1", "not a number"),
        ("KillWait=70000", "0-65535"),
        ("KillWait=\uff13\uff10", "not a number"),  # fullwidth digits, not ASCII
        ("KillWait=30\nKillWait=60", "set more than once: 30, 60"),
    ],
)
def test_a_kill_wait_sunk_cannot_take_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(SlurmConfError, match=problem):
        kill_wait(text)


pairs = st.tuples(
    st.sampled_from(["KillWait", "killwait", "MinJobAge", "Epilog", "Kill", "X.Y"]),
    st.one_of(st.integers(0, 70000).map(str), st.text(max_size=6)),
)


@pytest.mark.fuzz
@given(st.text(max_size=200))
def test_any_text_gives_seconds_or_an_error_naming_kill_wait(text: str) -> None:
    try:
        seconds = kill_wait(text)
    except SlurmConfError as error:
        problem = str(error)
    else:
        assert 0 <= seconds <= 65535
        return
    assert problem.startswith("KillWait")


@pytest.mark.fuzz
@given(st.lists(pairs, max_size=6), st.integers(0, 65535))
def test_what_is_written_reads_back(others: list[tuple[str, str]], seconds: int) -> None:
    """A KillWait line among other pairs (none of them KillWait) reads back."""
    lines = [
        f"{k}={v}" for k, v in others if k.lower() != "killwait" and v.strip() and "#" not in v
    ]
    lines.insert(len(lines) // 2, f"KillWait={seconds}")
    assert kill_wait("\n".join(lines)) == seconds
