"""The `sunk` command's plugins: command groups found through entry points, and only those."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib.metadata import EntryPoint

import pytest
import typer
from typer.testing import CliRunner

from sunk import cli

PLUGIN_MODULE = "sunk_plugin_for_tests"


@pytest.fixture
def plugin_module() -> Iterator[types.ModuleType]:
    """An importable plugin module whose `group` has one command, `world`."""
    module = types.ModuleType(PLUGIN_MODULE)
    group = typer.Typer(help="A plugin's group.")

    @group.command()
    def world() -> None:
        print("hello from the plugin")

    module.group = group  # type: ignore[attr-defined]
    module.not_a_group = "text"  # type: ignore[attr-defined]
    sys.modules[PLUGIN_MODULE] = module
    yield module
    del sys.modules[PLUGIN_MODULE]


def offer(monkeypatch: pytest.MonkeyPatch, *entries: tuple[str, str]) -> None:
    """Make `entries` (name, "module:object") the installed entry points of sunk's group."""
    points = [EntryPoint(name, value, cli.PLUGIN_GROUP) for name, value in entries]

    def entry_points(*, group: str) -> list[EntryPoint]:
        return points if group == cli.PLUGIN_GROUP else []

    monkeypatch.setattr(cli, "entry_points", entry_points)


def test_an_installed_plugin_offers_its_group(
    monkeypatch: pytest.MonkeyPatch, plugin_module: types.ModuleType
) -> None:
    offer(monkeypatch, ("hello", f"{PLUGIN_MODULE}:group"))
    app = typer.Typer()
    app.command()(cli.version)
    for name, group in cli.plugin_groups():
        app.add_typer(group, name=name)
    result = CliRunner().invoke(app, ["hello", "world"])
    assert result.exit_code == 0, result.output
    assert result.output == "hello from the plugin\n"


def test_an_entry_point_whose_package_is_absent_offers_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What the image sees: the wheel's entry points name the test bed, which it lacks.
    offer(monkeypatch, ("local", "sunk_package_that_is_not_installed.cli:local"))
    assert cli.plugin_groups() == []


def test_a_broken_plugin_is_an_error_not_silence(
    monkeypatch: pytest.MonkeyPatch, plugin_module: types.ModuleType
) -> None:
    offer(monkeypatch, ("hello", f"{PLUGIN_MODULE}.missing_submodule:group"))
    with pytest.raises(ModuleNotFoundError):
        cli.plugin_groups()
    offer(monkeypatch, ("hello", f"{PLUGIN_MODULE}:not_a_group"))
    with pytest.raises(TypeError, match=r"not a typer\.Typer"):
        cli.plugin_groups()


def test_sunks_own_commands_load_no_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    def entry_points(*, group: str) -> list[EntryPoint]:
        raise AssertionError(f"plugins looked up for one of sunk's own commands ({group})")

    monkeypatch.setattr(cli, "entry_points", entry_points)
    with pytest.raises(SystemExit) as exited:
        cli.main(["version"])
    assert exited.value.code == 0
