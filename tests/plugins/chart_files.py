"""The slurm chart's Python files (charts/slurm/files: they run in the Slurm
image, not as part of a package), imported for tests as modules."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

FILES = Path(__file__).parents[2] / "charts" / "slurm" / "files"


def chart_module(name: str) -> ModuleType:
    """charts/slurm/files/<name>.py as module `chart_<name>` (registered, so
    its dataclasses find their module)."""
    spec = importlib.util.spec_from_file_location(f"chart_{name}", FILES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
