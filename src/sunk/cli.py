"""The `sunk` command."""

from __future__ import annotations

import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated

import typer
from typer.main import get_command_name

from sunk import __version__
from sunk.service import run_until_terminated

app = typer.Typer(help="sunk: Slurm on Kubernetes.", no_args_is_help=True)

# Entry points of this group add command groups to `sunk` (name: the command,
# object: a typer.Typer). The development install's test bed offers `local`
# and `testbed` this way, so sunk itself never names it.
PLUGIN_GROUP = "sunk.commands"


# Options every component that talks to Slurm and Kubernetes takes.
SlurmrestdOption = Annotated[
    str, typer.Option("--slurmrestd", envvar="SUNK_SLURMRESTD_URL", help="slurmrestd base URL.")
]
JwtKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--jwt-key",
        envvar="SUNK_JWT_KEY_FILE",
        help="The cluster's HS256 jwt key, to mint tokens for --slurm-user (or --jwt-token).",
    ),
]
JwtTokenOption = Annotated[
    Path | None,
    typer.Option(
        "--jwt-token",
        envvar="SUNK_JWT_TOKEN_FILE",
        help="A file `sunk tokens` keeps a fresh token in (a mounted Secret): no key needed.",
    ),
]
SlurmUserOption = Annotated[
    str,
    typer.Option("--slurm-user", envvar="SUNK_SLURM_USER", help="Slurm user the tokens name."),
]
KubeconfigOption = Annotated[
    Path | None,
    typer.Option("--kubeconfig", envvar="KUBECONFIG", help="Default: the pod's service account."),
]
LeaseNamespaceOption = Annotated[
    str,
    typer.Option(
        "--lease-namespace", envvar="POD_NAMESPACE", help="Namespace of the leader Lease."
    ),
]
VerboseOption = Annotated[bool, typer.Option("-v", "--verbose")]
MetricsPortOption = Annotated[
    int, typer.Option(help="Port of the Prometheus /metrics endpoint (0: none).")
]


def _component_logging(verbose: bool) -> None:
    import logging

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        # One line per HTTP request is a trace, not a log (and costs CPU at load).
        for noisy in ("httpx2", "httpcore2"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def version() -> None:
    """Print sunk's version."""
    print(__version__)


@app.command()
def operator(
    slurmrestd: SlurmrestdOption,
    jwt_key: JwtKeyOption = None,
    jwt_token: JwtTokenOption = None,
    slurm_user: SlurmUserOption = "slurm",
    kubeconfig: KubeconfigOption = None,
    namespace: Annotated[
        str | None, typer.Option(help="Watch one namespace (default: all).")
    ] = None,
    lease_namespace: LeaseNamespaceOption = "default",
    metrics_port: MetricsPortOption = 9090,
    topology_configmap: Annotated[
        str | None,
        typer.Option(
            help="[NAMESPACE/]NAME of the slurm chart's topology ConfigMap, which the "
            "topology controller keeps (default namespace: --namespace, else the lease's)."
        ),
    ] = None,
    gres_configmap: Annotated[
        str | None,
        typer.Option(
            help="[NAMESPACE/]NAME of the slurm chart's gres ConfigMap, whose gres.conf the gres "
            "controller writes from each node's GPUs (default namespace: as --topology-configmap)."
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Run the NodeSet controller, and the topology and gres controllers (leader-elected)."""

    from sunk.component import Election, SlurmAccess
    from sunk.nodeset.run import OperatorConfig, run_operator

    _component_logging(verbose)

    def where(value: str | None) -> tuple[str, str] | None:
        if not value:
            return None
        at, _, name = value.rpartition("/")
        return (at or namespace or lease_namespace, name)

    config = OperatorConfig(
        slurm=SlurmAccess(slurmrestd, jwt_key, jwt_token, slurm_user),
        election=Election("sunk-operator", lease_namespace),
        kubeconfig=kubeconfig,
        namespace=namespace,
        metrics_port=metrics_port or None,
        topology_configmap=where(topology_configmap),
        gres_configmap=where(gres_configmap),
    )
    run_until_terminated(run_operator(config))


@app.command()
def tokens(
    grant: Annotated[
        list[str],
        typer.Option(help="SECRET=SLURM_USER: keep a token for SLURM_USER in Secret SECRET."),
    ],
    jwt_key: Annotated[
        Path | None,
        typer.Option("--jwt-key", envvar="SUNK_JWT_KEY_FILE", help="The cluster's HS256 jwt key."),
    ] = None,
    signing_keys: Annotated[
        Path | None,
        typer.Option(
            help="Directory of RS256 keys, <kid>.pem (a mounted Secret): sign with the newest "
            "one Slurm takes (instead of --jwt-key)."
        ),
    ] = None,
    slurmrestd: Annotated[
        str | None,
        typer.Option(
            envvar="SUNK_SLURMRESTD_URL",
            help="slurmrestd, to ask whether Slurm takes a newer key before signing with it.",
        ),
    ] = None,
    namespace: Annotated[
        str, typer.Option(envvar="POD_NAMESPACE", help="Namespace of the Secrets.")
    ] = "default",
    kubeconfig: KubeconfigOption = None,
    lifetime: Annotated[float, typer.Option(help="Seconds each token is valid.")] = 3600.0,
    refresh: Annotated[
        float, typer.Option(help="Seconds between fresh tokens (under half the lifetime).")
    ] = 600.0,
    owner_service_account: Annotated[
        str | None,
        typer.Option(
            envvar="POD_SERVICE_ACCOUNT",
            help="Own the Secrets by this ServiceAccount: deleted with it.",
        ),
    ] = None,
    tenant_tokens: Annotated[
        str | None,
        typer.Option(
            help="Secret to keep a token in for every uid the tenancy grants (key: the "
            "uid), which the scheduler acts as each tenant with."
        ),
    ] = None,
    tenancy_configmap: Annotated[
        str | None,
        typer.Option(help="The scheduler's tenancy ConfigMap, whose granted uids get tokens."),
    ] = None,
    metrics_port: MetricsPortOption = 9090,
    verbose: VerboseOption = False,
) -> None:
    """Keep a fresh Slurm token in each component's Secret (the one holder of the key)."""
    from sunk.tokens.run import TokenGrant, main

    _component_logging(verbose)
    try:
        grants = [TokenGrant.parse(text) for text in grant]
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
    if (tenant_tokens is None) != (tenancy_configmap is None):
        raise typer.BadParameter("--tenant-tokens and --tenancy-configmap go together")
    if (jwt_key is None) == (signing_keys is None):
        raise typer.BadParameter("give either --jwt-key or --signing-keys")
    from sunk.slurm.auth import MAX_TOKEN_LIFETIME

    if not 0 < lifetime <= MAX_TOKEN_LIFETIME:
        raise typer.BadParameter(f"--lifetime: a token lives at most {MAX_TOKEN_LIFETIME}s")
    run_until_terminated(
        main(
            jwt_key,
            namespace,
            grants,
            kubeconfig,
            lifetime,
            refresh,
            owner_service_account,
            tenant_tokens,
            tenancy_configmap,
            signing_keys,
            slurmrestd,
            metrics_port or None,
        )
    )


@app.command()
def syncer(
    slurmrestd: SlurmrestdOption,
    jwt_key: JwtKeyOption = None,
    jwt_token: JwtTokenOption = None,
    slurm_user: SlurmUserOption = "slurm",
    kubeconfig: KubeconfigOption = None,
    namespace: Annotated[
        str | None, typer.Option(help="Namespace of the slurmd pods (default: all).")
    ] = None,
    drain_on_condition: Annotated[
        list[str] | None,
        typer.Option(help="A node condition type that drains its Slurm node while True."),
    ] = None,
    lock_effect: Annotated[
        str, typer.Option(help="Effect of the node-lock taint while a job runs.")
    ] = "NoExecute",
    metrics_port: MetricsPortOption = 9090,
    lease_namespace: LeaseNamespaceOption = "default",
    slurm_writes: Annotated[
        float, typer.Option(help="Slurm writes per second (burst: --slurm-burst; 0: no limit).")
    ] = 20.0,
    slurm_burst: Annotated[int, typer.Option(help="Slurm writes allowed at once.")] = 50,
    kube_writes: Annotated[
        float, typer.Option(help="Kubernetes writes per second (0: no limit).")
    ] = 50.0,
    kube_burst: Annotated[int, typer.Option(help="Kubernetes writes allowed at once.")] = 100,
    verbose: VerboseOption = False,
) -> None:
    """Keep Kubernetes and Slurm in step about every node (leader-elected)."""
    from sunk.component import Election, SlurmAccess
    from sunk.syncer.ratelimit import WriteLimits
    from sunk.syncer.run import SyncerConfig, main

    _component_logging(verbose)
    main(
        SyncerConfig(
            slurm=SlurmAccess(slurmrestd, jwt_key, jwt_token, slurm_user),
            election=Election("sunk-syncer", lease_namespace),
            kubeconfig=kubeconfig,
            namespace=namespace,
            watched_conditions=tuple(drain_on_condition or ()),
            lock_effect=lock_effect,
            metrics_port=metrics_port or None,
            limits=WriteLimits(slurm_writes, slurm_burst, kube_writes, kube_burst),
        )
    )


@app.command()
def scheduler(
    slurmrestd: SlurmrestdOption,
    jwt_key: JwtKeyOption = None,
    jwt_token: JwtTokenOption = None,
    slurm_user: SlurmUserOption = "slurm",
    kubeconfig: KubeconfigOption = None,
    scheduler_name: Annotated[
        str, typer.Option(help="Place pods whose spec.schedulerName is this.")
    ] = "sunk-scheduler",
    namespace: Annotated[
        str | None, typer.Option(help="Place pods of one namespace (default: all).")
    ] = None,
    slurmd_namespace: Annotated[
        str | None, typer.Option(help="Namespace of the NodeSet pods (default: all).")
    ] = None,
    partition: Annotated[
        str | None, typer.Option(help="Slurm partition of the NodeSet nodes (default: Slurm's).")
    ] = None,
    constraint: Annotated[
        str | None, typer.Option(help="Slurm constraint limiting jobs to NodeSet nodes.")
    ] = None,
    gpu_type: Annotated[
        list[str] | None,
        typer.Option(help="PRODUCT=TYPE: GPU product label value → Slurm GRES type."),
    ] = None,
    dra_gpu_class: Annotated[
        list[str] | None,
        typer.Option(
            help="CLASS=DRIVER[:INDEX_ATTRIBUTE] (repeat for each): a DeviceClass whose "
            "ResourceClaims the scheduler allocates with the GPUs Slurm gives the pod's job, "
            "the devices of DRIVER whose INDEX_ATTRIBUTE (default: index) is Slurm's GPU index."
        ),
    ] = None,
    kill_wait: Annotated[
        int, typer.Option(help="Slurm's KillWait (s); longer pod grace periods are refused.")
    ] = 30,
    slurm_config: Annotated[
        str | None,
        typer.Option(
            help="[NAMESPACE/]NAME of the ConfigMap holding slurm.conf (the slurm chart's "
            "<release>-config; default namespace: --slurmd-namespace, else the lease's): "
            "KillWait is read from it and followed, and --kill-wait is not used."
        ),
    ] = None,
    poll_interval: Annotated[float, typer.Option(help="Seconds between Slurm polls.")] = 0.25,
    lease_namespace: LeaseNamespaceOption = "default",
    metrics_port: MetricsPortOption = 9090,
    job_seal_secret: Annotated[
        str,
        typer.Option(
            help="Secret in the lease namespace with the secret that seals the "
            "scheduler's jobs (created on first start)."
        ),
    ] = "sunk-scheduler-seal",  # noqa: S107 - a Secret's name, not a secret
    tenancy_configmap: Annotated[
        str,
        typer.Option(
            help="ConfigMap in the lease namespace whose `tenancy.yaml` grants namespaces "
            "their Slurm accounts, partitions, QOS and uids (none listed: none served)."
        ),
    ] = "sunk-scheduler-tenancy",
    tenant_tokens: Annotated[
        Path | None,
        typer.Option(
            envvar="SUNK_TENANT_TOKENS_DIR",
            help="Directory with a Slurm token per granted uid, kept by `sunk tokens` "
            "(a mounted Secret): jobs are submitted and ended as their tenant. "
            "Without it, tokens are minted from --jwt-key.",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Place pods on NodeSet nodes through Slurm jobs (leader-elected)."""
    from sunk.component import Election, SlurmAccess
    from sunk.scheduler.claims import parse_gpu_class
    from sunk.scheduler.run import SchedulerConfig, main

    _component_logging(verbose)
    types = dict(item.split("=", 1) for item in gpu_type or [])
    classes = {}
    for text in dra_gpu_class or []:
        try:
            parsed = parse_gpu_class(text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--dra-gpu-class") from None
        classes[parsed.device_class] = parsed
    slurm_conf = None
    if slurm_config:
        where, _, name = slurm_config.rpartition("/")
        slurm_conf = (where or slurmd_namespace or lease_namespace, name)
    main(
        SchedulerConfig(
            slurm=SlurmAccess(slurmrestd, jwt_key, jwt_token, slurm_user),
            election=Election(scheduler_name, lease_namespace),
            kubeconfig=kubeconfig,
            scheduler_name=scheduler_name,
            namespace=namespace,
            slurmd_namespace=slurmd_namespace,
            partition=partition,
            constraint=constraint,
            gpu_types=types,
            gpu_classes=classes,
            kill_wait=kill_wait,
            slurm_config=slurm_conf,
            poll_interval=poll_interval,
            metrics_port=metrics_port or None,
            seal_secret_name=job_seal_secret,
            tenancy_configmap=tenancy_configmap,
            tenant_tokens_dir=tenant_tokens,
        )
    )


@app.command("gpu-plugin")
def gpu_plugin(
    node_name: Annotated[
        str, typer.Option(envvar="NODE_NAME", help="This node (the pods bound to it are read).")
    ],
    slurmd_namespace: Annotated[
        str,
        typer.Option(
            envvar="POD_NAMESPACE",
            help="The Slurm cluster's namespace: its NodeSet's slurmd pod gets every GPU.",
        ),
    ],
    kubeconfig: KubeconfigOption = None,
    resource: Annotated[
        str, typer.Option(help="Extended resource of the GPUs, one device per GPU.")
    ] = "nvidia.com/gpu",
    device_dir: Annotated[
        Path, typer.Option(help="Where the GPUs' device files (nvidiaN) are found.")
    ] = Path("/dev"),
    socket_dir: Annotated[
        Path, typer.Option(help="Directory of the device plugin sockets.")
    ] = Path("/var/lib/kubelet/plugins/sunk.dev"),
    host_socket_dir: Annotated[
        Path | None,
        typer.Option(help="--socket-dir as the kubelet sees it (default: same)."),
    ] = None,
    registry_dir: Annotated[
        Path,
        typer.Option(help="The kubelet's plugin watcher directory (<root-dir>/plugins_registry)."),
    ] = Path("/var/lib/kubelet/plugins_registry"),
    rescan: Annotated[float, typer.Option(help="Seconds between scans of --device-dir.")] = 10.0,
    toolkit_config: Annotated[
        Path | None,
        typer.Option(
            help="NVIDIA's container toolkit config.toml as mounted here: no GPU is served while "
            "it lets a container take GPUs by its own environment or mounts (missing: no toolkit)."
        ),
    ] = None,
    cdi_spec_dir: Annotated[
        list[Path] | None,
        typer.Option(
            help="A directory of the node's CDI specs as mounted here (repeat for each): their "
            "edits for the GPUs go to sunk's container steps."
        ),
    ] = None,
    publish_gpus: Annotated[
        bool,
        typer.Option(
            help="Write the indices of the GPUs found on this node's Node (annotation "
            "sunk.dev/gpus), again after each change: needs patch on nodes."
        ),
    ] = False,
    metrics_port: MetricsPortOption = 9090,
    verbose: VerboseOption = False,
) -> None:
    """Serve the node's GPUs to its kubelet: to the pods Slurm allocated them to, and all of
    them to the node's slurmd pod (a device plugin, one per node)."""
    from sunk.gpus.run import GpuPluginConfig, main

    _component_logging(verbose)
    run_until_terminated(
        main(
            GpuPluginConfig(
                node=node_name,
                slurmd_namespace=slurmd_namespace,
                resource=resource,
                device_dir=device_dir,
                socket_dir=socket_dir,
                host_socket_dir=host_socket_dir,
                registry_dir=registry_dir,
                kubeconfig=kubeconfig,
                rescan_seconds=rescan,
                toolkit_config=toolkit_config,
                cdi_spec_dirs=tuple(cdi_spec_dir or ()),
                metrics_port=metrics_port or None,
                publish_gpus=publish_gpus,
            )
        )
    )


def plugin_groups() -> list[tuple[str, typer.Typer]]:
    """The command groups installed plugins offer, by command name.

    An entry point whose package is not installed is skipped: the image's
    wheel holds only `sunk`, but carries the project's entry points.
    """
    groups = []
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            group = entry.load()
        except ModuleNotFoundError as error:
            if error.name != entry.module.partition(".")[0]:
                raise  # the plugin is there but broken: say so
            continue
        if not isinstance(group, typer.Typer):
            raise TypeError(f"entry point {entry.name} = {entry.value}: not a typer.Typer")
        groups.append((entry.name, group))
    return groups


def main(argv: list[str] | None = None) -> None:
    """The `sunk` command. Plugins are loaded only for a command line that does not name
    one of sunk's own commands, so a component never loads them."""
    args = sys.argv[1:] if argv is None else argv
    own = {
        info.name or get_command_name(info.callback.__name__)
        for info in app.registered_commands
        if info.callback is not None
    }
    if not args or args[0] not in own:
        for name, group in plugin_groups():
            app.add_typer(group, name=name)
    app(args=args)
