"""Validation results that name what is wrong and where."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    where: str  # a node's item or a field, e.g. "n1[0].files", "block_sizes"
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"


class ConfigError(ValueError):
    """The configuration would not be accepted (or not mean what was asked)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        listed = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} problem(s):\n{listed}")


def raise_if(problems: Sequence[Problem]) -> None:
    if problems:
        raise ConfigError(problems)
