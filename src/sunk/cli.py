"""The `sunk` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sunk import __version__
from sunk.testbed.paths import default_state_dir

app = typer.Typer(help="sunk: Slurm on Kubernetes.", no_args_is_help=True)
local = typer.Typer(help="A local cluster on this machine: real Kubernetes, real Slurm.")
testbed = typer.Typer(help="The test bed behind `sunk local` and the tests.")
app.add_typer(local, name="local")
app.add_typer(testbed, name="testbed")

console = Console(stderr=True)
StateOption = Annotated[
    Path | None,
    typer.Option(
        "--state",
        help="State directory of the local cluster [default: /var/lib/sunk/local].",
        envvar="SUNK_STATE",
        show_default=False,
    ),
]


def _log(message: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")


def _require_root() -> None:
    if os.geteuid() != 0:
        console.print(
            "[red]sunk local needs root[/red]: it creates namespaces, mounts and chroots."
        )
        raise typer.Exit(2)


@app.command()
def version() -> None:
    """Print sunk's version."""
    print(__version__)


@testbed.command("prepare")
def testbed_prepare() -> None:
    """Build or reuse the cached Kubernetes binaries and Slurm root filesystem."""
    _require_root()
    from sunk.testbed.bed import Bed

    prepared = Bed(default_state_dir()).prepare(_log)
    kind = "cold" if prepared.cold else "warm"
    _log(f"test bed caches ready ({kind}) in {prepared.seconds:.1f}s")
    print(json.dumps({"cold": prepared.cold, "seconds": round(prepared.seconds, 1)}))


@local.command("up")
def local_up(state: StateOption = None) -> None:
    """Start the local cluster (idempotent) and print how to use it."""
    _require_root()
    from sunk.testbed.bed import Bed

    started = time.monotonic()
    access = Bed(state or default_state_dir()).up(_log)
    _log(f"[green]local cluster up[/green] in {time.monotonic() - started:.1f}s")
    print(
        f"kubeconfig:      {access.kube.admin_kubeconfig}\n"
        f"slurmrestd:      {access.slurm.restd_url}\n"
        f"slurm nodes:     {', '.join(access.slurm.nodes)}\n"
        f"\n"
        f"  export KUBECONFIG={access.kube.admin_kubeconfig}\n"
        f"  kubectl get namespaces\n"
        f"  sunk local slurm sinfo\n"
        f"  sunk local slurm srun -N{len(access.slurm.nodes)} hostname\n"
    )


@local.command("down")
def local_down(state: StateOption = None) -> None:
    """Stop everything `sunk local up` started, and nothing else."""
    _require_root()
    from sunk.testbed.bed import Bed

    Bed(state or default_state_dir()).down()
    _log("local cluster stopped")


@local.command("status")
def local_status(state: StateOption = None) -> None:
    """Show which parts of the local cluster run."""
    from sunk.testbed.bed import Bed

    state = state or default_state_dir()
    status = Bed(state).status()
    if not status:
        console.print("local cluster: not running")
        raise typer.Exit(1)
    for name, alive in status.items():
        mark = "[green]running[/green]" if alive else "[red]stopped[/red]"
        console.print(f"{name:28} {mark}")
    summary = state / "bed.json"
    if summary.exists():
        print(summary.read_text())
    if not all(status.values()):
        raise typer.Exit(1)


@local.command(
    "slurm",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def local_slurm(ctx: typer.Context, state: StateOption = None) -> None:
    """Run a Slurm command (sinfo, squeue, srun, sbatch, scontrol…) in the local cluster."""
    _require_root()
    from sunk.testbed.bed import Bed

    if not ctx.args:
        console.print("usage: sunk local slurm COMMAND [ARGS…]")
        raise typer.Exit(2)
    try:
        result = Bed(state or default_state_dir()).slurm().run(ctx.args, check=False)
    except subprocess.TimeoutExpired as exc:
        console.print(f"[red]timed out[/red]: {exc}")
        raise typer.Exit(124) from exc
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    raise typer.Exit(result.returncode)
