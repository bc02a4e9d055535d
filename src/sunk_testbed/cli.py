"""`sunk local` and `sunk testbed`: the test bed's commands, a plugin of the `sunk` command.

pyproject.toml registers `local` and `testbed` as entry points of
`sunk.cli.PLUGIN_GROUP`; sunk's command adds them when the test bed is
installed (the development install), so sunk itself never imports it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from sunk_testbed.paths import default_state_dir

local = typer.Typer(help="A local cluster on this machine: real Kubernetes, real Slurm.")
testbed = typer.Typer(help="The test bed behind `sunk local` and the tests.")

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


@testbed.command("prepare")
def prepare_caches(
    workloads: Annotated[
        bool,
        typer.Option(
            "--workloads", help="Also the JobSet and LeaderWorkerSet controllers and images."
        ),
    ] = False,
) -> None:
    """Build or reuse the cached Kubernetes binaries and Slurm root filesystem."""
    _require_root()
    from sunk_testbed.bed import Bed

    prepared = Bed(default_state_dir()).prepare(_log, workloads=workloads)
    kind = "cold" if prepared.cold else "warm"
    _log(f"test bed caches ready ({kind}) in {prepared.seconds:.1f}s")
    print(json.dumps({"cold": prepared.cold, "seconds": round(prepared.seconds, 1)}))


@local.command("up")
def local_up(state: StateOption = None) -> None:
    """Start the local cluster (idempotent): control plane, nodes, both charts; then wait
    until Slurm is usable and print how to use it."""
    _require_root()
    from sunk_testbed.bed import Bed

    started = time.monotonic()
    access = Bed(state or default_state_dir()).up(_log)
    _log(f"[green]local cluster up[/green] in {time.monotonic() - started:.1f}s")
    print(
        f"kubeconfig:   {access.kube.admin_kubeconfig}\n"
        f"login:        {access.user}@{access.login_address} (key {access.ssh_key})\n"
        f"slurm nodes:  {', '.join(access.nodes)}\n"
        f"\n"
        f"  sunk local ssh                      # a login shell on the login pod\n"
        f"  sunk local ssh sinfo\n"
        f"  sunk local ssh srun -N{len(access.nodes)} hostname\n"
        f"  export KUBECONFIG={access.kube.admin_kubeconfig}; kubectl -n slurm get pods,nodesets\n"
        f"  sunk local down\n"
    )


@local.command("down")
def local_down(state: StateOption = None) -> None:
    """Stop everything `sunk local up` started, and nothing else."""
    _require_root()
    from sunk_testbed.bed import Bed

    Bed(state or default_state_dir()).down()
    _log("local cluster stopped")


@local.command("status")
def local_status(state: StateOption = None) -> None:
    """Show which parts of the local cluster run."""
    from sunk_testbed.bed import Bed

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
    "ssh",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def local_ssh(ctx: typer.Context, state: StateOption = None) -> None:
    """Log in to the local cluster's login pod over ssh (or run COMMAND there): sinfo,
    sbatch, srun, sacct… as its user, as on any Slurm cluster."""
    _require_root()
    from sunk_testbed import charts
    from sunk_testbed.bed import USER_NAME, Bed

    bed = Bed(state or default_state_dir())
    try:
        address = bed.login_address()
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from exc
    argv = charts.ssh_argv(bed.ssh_key(), USER_NAME, address, ctx.args)
    if sys.stdin.isatty() and not ctx.args:
        argv.insert(1, "-t")
    os.execvp(argv[0], argv)  # noqa: S606 - this process becomes the ssh session
