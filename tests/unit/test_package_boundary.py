"""The product (`sunk`, what the image runs) never imports the workshop (`sunk_testbed`).

The workshop may import the product; never the other way, not even lazily:
the image's wheel holds `sunk` alone and installs only `[project].dependencies`.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from importlib.metadata import packages_distributions
from pathlib import Path
from typing import Any

import pytest
import typer

REPO = Path(__file__).resolve().parents[2]
PRODUCT = "sunk"
WORKSHOP = "sunk_testbed"


def _pyproject() -> dict[str, Any]:
    with (REPO / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)


def _sources(package: str) -> list[Path]:
    return sorted((REPO / "src" / package).rglob("*.py"))


def _imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for each absolute import in `path`, at any depth (lazy ones too),
    and for each importlib.import_module / __import__ of a literal name."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name | ast.Attribute)
            and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr)
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _top_level(module: str) -> str:
    return module.partition(".")[0]


def _distribution_name(requirement: str) -> str:
    """The PEP 503 normalized project name of a requirement such as `PyYAML>=6`."""
    match = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group()).lower()


def _third_party_distributions(package: str) -> dict[str, set[str]]:
    """For each installed distribution `package` imports from: the places that do."""
    distributions_of = packages_distributions()
    found: dict[str, set[str]] = {}
    for path in _sources(package):
        for line, module in _imported_modules(path):
            top = _top_level(module)
            if top in sys.stdlib_module_names or top in {"__future__", PRODUCT, WORKSHOP}:
                continue
            where = f"{path.relative_to(REPO)}:{line} imports {module}"
            distributions = distributions_of.get(top)
            assert distributions, f"{where}: no installed distribution provides it"
            for distribution in distributions:
                found.setdefault(_distribution_name(distribution), set()).add(where)
    return found


def test_the_product_never_imports_the_workshop() -> None:
    offences = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for path in _sources(PRODUCT)
        for line, module in _imported_modules(path)
        if _top_level(module) == WORKSHOP
    ]
    assert _sources(PRODUCT), "no product sources found"
    assert offences == []


def test_the_product_at_run_time_loads_no_workshop_module() -> None:
    # A fresh interpreter: this test session has imported the workshop already.
    probe = textwrap.dedent(
        f"""
        import pkgutil, importlib, sys
        import {PRODUCT}, {PRODUCT}.cli
        for info in pkgutil.walk_packages({PRODUCT}.__path__, "{PRODUCT}."):
            if info.name != "{PRODUCT}.__main__":  # runs the command
                importlib.import_module(info.name)
        try:
            {PRODUCT}.cli.main(["version"])  # one of sunk's own commands
        except SystemExit as exit:
            assert exit.code == 0, exit.code
        print(sorted(m for m in sys.modules if m.partition(".")[0] == "{WORKSHOP}"))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]", result.stdout


def test_the_products_third_party_imports_are_its_dependencies() -> None:
    declared = {_distribution_name(r) for r in _pyproject()["project"]["dependencies"]}
    imported = _third_party_distributions(PRODUCT)
    undeclared = {name: sorted(where) for name, where in imported.items() if name not in declared}
    assert undeclared == {}, "imported by sunk, missing from [project].dependencies"
    assert sorted(declared - imported.keys()) == [], "declared, never imported by sunk"


def test_the_workshops_third_party_imports_are_installed_by_its_extra() -> None:
    project = _pyproject()["project"]
    declared = {
        _distribution_name(r)
        for r in project["dependencies"] + project["optional-dependencies"]["testbed"]
    }
    imported = _third_party_distributions(WORKSHOP)
    undeclared = {name: sorted(where) for name, where in imported.items() if name not in declared}
    assert undeclared == {}, "imported by the test bed, in neither dependencies nor testbed"
    extra = {_distribution_name(r) for r in project["optional-dependencies"]["testbed"]}
    assert sorted(extra - imported.keys()) == [], "in the testbed extra, never imported"


def test_the_wheel_holds_the_product_alone() -> None:
    assert _pyproject()["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["src/sunk"]


@pytest.mark.parametrize("command", ["local", "testbed"])
def test_the_workshops_commands_are_sunk_plugins(command: str) -> None:
    from sunk.cli import PLUGIN_GROUP

    # Read from pyproject.toml, not the installed metadata, which an editable
    # install refreshes only when it is reinstalled.
    entry = _pyproject()["project"]["entry-points"][PLUGIN_GROUP][command]
    module, _, name = entry.partition(":")
    assert _top_level(module) == WORKSHOP
    group = getattr(__import__(module, fromlist=[name]), name)
    assert isinstance(group, typer.Typer)
