"""What the slurm chart asks of the topology (`settings.yaml` in its topology ConfigMap)."""

from __future__ import annotations

from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sunk.topology.problems import ConfigError, Problem

SETTINGS_KEY = "settings.yaml"

Plugin = Literal["none", "tree", "block"]
TopologyFile = Literal["topology.yaml", "topology.conf"]
TOPOLOGY_FILES: tuple[TopologyFile, ...] = ("topology.yaml", "topology.conf")


class TreeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    levels: tuple[str, ...] = ()  # label keys, the top level first


class BlockSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str = ""
    sizes: tuple[int, ...] = ()  # BlockSizes; () = the smallest block's size


class TopologySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    plugin: Plugin = "none"
    # topology.yaml for Slurm 25.05 and later, topology.conf for 24.11.
    file: TopologyFile = "topology.yaml"
    tree: TreeSettings = Field(default_factory=TreeSettings)
    block: BlockSettings = Field(default_factory=BlockSettings)

    def also(self) -> Literal["tree", "block"] | None:
        """The second topology asked for: the other plugin's settings given
        beside `plugin`'s. topology.yaml then holds it too, not as the
        cluster's default: partitions choose it with `Topology=<its name>`."""
        if self.plugin == "tree" and self.block.label:
            return "block"
        if self.plugin == "block" and self.tree.levels and all(self.tree.levels):
            return "tree"
        return None


def parse_settings(text: str | None) -> TopologySettings:
    """The settings, or a ConfigError naming each field that is wrong."""
    try:
        raw = yaml.safe_load(text or "") or {}
    except yaml.YAMLError as error:
        raise ConfigError([Problem(SETTINGS_KEY, f"not YAML: {error}")]) from None
    try:
        settings = TopologySettings.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(
            [
                Problem(".".join(str(p) for p in e["loc"]) or SETTINGS_KEY, e["msg"])
                for e in error.errors()
            ]
        ) from None
    problems: list[Problem] = []
    if settings.plugin == "tree" and not (settings.tree.levels and all(settings.tree.levels)):
        problems.append(Problem("tree.levels", "the tree needs at least one label key"))
    if settings.plugin == "block" and not settings.block.label:
        problems.append(Problem("block.label", "blocks need a label key"))
    if settings.plugin != "none" and settings.file == "topology.conf" and settings.also():
        other = "block.label" if settings.plugin == "tree" else "tree.levels"
        problems.append(
            Problem(other, "topology.conf holds one topology: a second needs topology.yaml")
        )
    if problems:
        raise ConfigError(problems)
    return settings
