"""NVIDIA's container toolkit settings that let a container take GPUs by its
own environment or mounts (pure), table-tested and property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sunk.gpus.toolkit import ENVVAR, VOLUME_MOUNTS, unsafe_settings

pytestmark = pytest.mark.unit

SAFE = f"{ENVVAR} = false\n"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        (SAFE, []),
        (SAFE + f"{VOLUME_MOUNTS} = false\n", []),
        # NVIDIA's shipped file: the setting left out, so its default, true.
        ('[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n', [ENVVAR]),
        (f"{ENVVAR} = true\n", [ENVVAR]),
        (f'{ENVVAR} = "false"\n', [ENVVAR]),  # a string, not the boolean the toolkit reads
        (SAFE + f"{VOLUME_MOUNTS} = true\n", [VOLUME_MOUNTS]),
        # Under a table it is another key: the toolkit reads the top level.
        (f"[nvidia-container-runtime]\n{ENVVAR} = false\n", [ENVVAR]),
        ("this is = = not toml", ["not TOML"]),
    ],
)
def test_each_setting_that_lets_a_container_take_gpus_is_named(text: str, named: list[str]) -> None:
    said = unsafe_settings(text, "/etc/nvidia-container-runtime/config.toml")
    assert len(said) == len(named), said
    for line, what in zip(said, named, strict=True):
        assert line.startswith("/etc/nvidia-container-runtime/config.toml: ")
        assert what in line


@pytest.mark.fuzz
@given(st.text())
def test_any_text_is_judged_without_raising(text: str) -> None:
    said = unsafe_settings(text)
    assert isinstance(said, list)
    assert all(isinstance(line, str) and line for line in said)


values = st.one_of(st.booleans(), st.integers(-5, 5), st.sampled_from(['"false"', '"true"', '""']))


@pytest.mark.fuzz
@given(st.dictionaries(st.sampled_from([ENVVAR, VOLUME_MOUNTS, "other-key"]), values))
def test_a_setting_is_named_exactly_when_it_is_not_the_boolean_false(
    settings: dict[str, object],
) -> None:
    text = "".join(
        f"{key} = {str(value).lower() if isinstance(value, bool) else value}\n"
        for key, value in settings.items()
    )
    said = unsafe_settings(text)
    envvar = settings.get(ENVVAR, True) is not False
    mounts = settings.get(VOLUME_MOUNTS, False) is not False
    assert [ENVVAR in line for line in said].count(True) == envvar
    assert [VOLUME_MOUNTS in line for line in said].count(True) == mounts
