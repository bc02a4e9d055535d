"""Configuration files of the test bed's real Kubernetes nodes, as pure functions.

Each node has a containerd and a kubelet of its own; all nodes of a bed share
one network namespace (the bed's "machine room", `sunk_testbed.nodes`) with a
bridge, one kube-proxy and the cluster DNS. Everything a node owns (cgroup
root, directories, sockets, address, IP range) is named here from the node's
index and its directory, so two nodes never share state.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CLUSTER_DOMAIN = "cluster.local"
# The second address of the bed's service range, as kubeadm gives kube-dns.
CLUSTER_DNS_IP = "10.96.0.10"
BRIDGE = "br0"  # inside the bed's network namespace, so the name is private to it
KUBELET_PORT = 10250  # each node listens on its own address, so all can use it
# cgroup v1 hierarchies kubelet needs its cgroupRoot in (blocker 2 of the notes).
CGROUP_CONTROLLERS = (
    "pids",
    "cpu",
    "cpuacct",
    "systemd",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
)
# Node indices 1..126: node N owns 10.B.N.0/24 within the pods' /17.
MAX_NODES = 126


@dataclass(frozen=True)
class Subnet:
    """One bed's addresses (a /16 picked free on the host):

    10.B.0.1/17          the bridge's address: every pod's gateway
    10.B.N.1/32          node N's address (its InternalIP, where its kubelet listens)
    10.B.N.2-254         node N's pods
    10.B.255.1/30        the host's end of the link into the bed's namespace
    10.B.255.2/30        the namespace's end; the host routes 10.B.0.0/17 through it
    """

    network: ipaddress.IPv4Network

    def _at(self, offset: int) -> str:
        return str(self.network.network_address + offset)

    @property
    def pods(self) -> str:
        return str(ipaddress.IPv4Network((self.network.network_address, 17)))

    @property
    def gateway(self) -> str:
        return self._at(1)

    @property
    def host_address(self) -> str:
        """Where pods reach the host: the apiserver, the registry, a host Slurm."""
        return self._at(255 * 256 + 1)

    @property
    def namespace_address(self) -> str:
        return self._at(255 * 256 + 2)

    def node_address(self, index: int) -> str:
        _check_index(index)
        return self._at(index * 256 + 1)

    def pod_range(self, index: int) -> tuple[str, str]:
        _check_index(index)
        return self._at(index * 256 + 2), self._at(index * 256 + 254)


def _check_index(index: int) -> None:
    if not 1 <= index <= MAX_NODES:
        raise ValueError(f"node index must be 1..{MAX_NODES}, not {index}")


@dataclass(frozen=True)
class NodePaths:
    """Everything on disk that belongs to one node, under its directory."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd" / "config.toml"

    @property
    def registry_hosts(self) -> Path:
        return self.root / "containerd" / "certs.d"

    @property
    def cdi_dir(self) -> Path:
        """Where the node's containerd reads CDI specs (a real node's /etc/cdi)."""
        return self.root / "cdi"

    @property
    def runc_root(self) -> Path:
        return self.root / "runc"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.root / "cni" / "ipam"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def resolv_conf(self) -> Path:
        return self.root / "resolv.conf"


def cgroup_root(bed_tag: str, node: str) -> str:
    """The node's cgroupRoot: every pod of the node lives below it, in each hierarchy."""
    return f"/sunk-{bed_tag}-{node}"


def containerd_config(paths: NodePaths, *, sandbox_image: str, cni_bin_dir: str, runc: str) -> str:
    """containerd 2.x (config version 3) for one node.

    `restrict_oom_score_adj`: the machine lacks CAP_SYS_RESOURCE, so the pause
    container's -998 is refused (blocker 1). `netns_mounts_under_state_dir`: a
    netns made by `ip netns add` re-mounts /run/netns and hides CRI's (blocker 8).
    CDI on, its specs in the node's own directory (the bed's stand-in GPUs).
    NRI, tracing and the debug socket are off: nothing here uses them, and their
    default paths are machine-wide.
    """
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    images = "plugins.'io.containerd.cri.v1.images'"
    return f"""version = 3
root = {_toml(paths.containerd_root)}
state = {_toml(paths.containerd_state)}
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = {_toml(paths.containerd_socket)}

[ttrpc]
  address = {_toml(Path(f"{paths.containerd_socket}.ttrpc"))}

[debug]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = {_toml(paths.root / "containerd" / "opt")}

[{runtime}]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = true
  cdi_spec_dirs = [{_toml(paths.cdi_dir)}]

[{runtime}.cni]
  bin_dirs = [{_toml(cni_bin_dir)}]
  conf_dir = {_toml(paths.cni_conf_dir)}
  max_conf_num = 1

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_toml(runc)}
  Root = {_toml(paths.runc_root)}
  SystemdCgroup = false

# Each node keeps its images unpacked only: a layer's compressed blob goes once
# unpacked (the bed's nodes share one disk, which a full one fills with
# DiskPressure evictions).
[{images}]
  discard_unpacked_layers = true

[{images}.pinned_images]
  sandbox = {_toml(sandbox_image)}

[{images}.registry]
  config_path = {_toml(paths.registry_hosts)}

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def _toml(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def registry_hosts_toml(endpoint: str) -> str:
    """containerd's hosts.toml mapping a registry name to a plain-HTTP endpoint."""
    return (
        f"server = {_toml(endpoint)}\n\n"
        f"[host.{_toml(endpoint)}]\n"
        '  capabilities = ["pull", "resolve"]\n'
    )


def cni_config(subnet: Subnet, index: int, ipam_dir: Path) -> dict[str, Any]:
    """The bed's one bridge; each node hands out addresses from its own /24."""
    first, last = subnet.pod_range(index)
    return {
        "cniVersion": "1.0.0",
        "name": "sunk",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": subnet.pods,
                                "rangeStart": first,
                                "rangeEnd": last,
                                "gateway": subnet.gateway,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(
    paths: NodePaths,
    *,
    address: str,
    cgroup_root: str,
    client_ca: Path,
) -> dict[str, Any]:
    """KubeletConfiguration of one node.

    cgroup v1 needs `failCgroupV1: false` from 1.35 on (blocker 3);
    `protectKernelDefaults` keeps kubelet from changing host sysctls (blocker 7).
    The Lease is renewed every 2 s (a quarter of its duration) because the bed's
    controller manager declares a node NotReady after 10 s without one.
    Eviction thresholds are low: the bed's disk is shared with everything else
    on the machine and a test must not see its pods evicted for that.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": address,
        "healthzPort": 10248,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "protectKernelDefaults": True,
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "podLogsDir": str(paths.pod_logs),
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(paths.resolv_conf),
        "nodeLeaseDurationSeconds": 8,
        "nodeStatusUpdateFrequency": "4s",
        "nodeStatusReportFrequency": "1m",
        # How often a pod's ConfigMap volumes are refreshed (default 1m): a
        # topology or slurm.conf change reaches Slurm within ~10 s, not ~75 s
        # (measured), so the tests that wait for one stay short.
        "syncFrequency": "10s",
        "serializeImagePulls": False,
        "evictionHard": {
            "memory.available": "50Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "shutdownGracePeriod": "0s",
    }


def kube_proxy_config(
    kubeconfig: Path, subnet: Subnet, metrics_address: str, node: str
) -> dict[str, Any]:
    """One kube-proxy (iptables) in the bed's namespace serves every node there.

    It goes by the name of one of them (`node`): kube-proxy waits up to 30 s
    for the Node of its own name before it writes any rule, and the host's
    name is no node's. conntrack limits are machine-wide sysctls: left alone
    (0 = do not set).
    """
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "hostnameOverride": node,
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "clusterCIDR": subnet.pods,
        "bindAddress": subnet.namespace_address,
        "healthzBindAddress": f"{subnet.namespace_address}:10256",
        "metricsBindAddress": f"{metrics_address}:10249",
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def coredns_corefile() -> str:
    """Cluster names only: no `forward`, so no query ever leaves the machine."""
    return f""".:5353 {{
    errors
    health :8080
    ready :8181
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 30
    loop
    reload 5s
}}
"""


COREDNS_LABELS = {"k8s-app": "kube-dns"}


def coredns_manifests(image: str) -> list[dict[str, Any]]:
    """Cluster DNS as a real cluster runs it: a Deployment and the kube-dns Service."""
    labels = COREDNS_LABELS
    meta = {"namespace": "kube-system"}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "coredns", **meta},
            "automountServiceAccountToken": True,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", **meta}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": coredns_corefile()},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", "labels": labels, **meta},
            "spec": {
                # Two, on different nodes where there are two, as clusters run it:
                # a node powered off does not take the cluster's names with it.
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "affinity": {
                            "podAntiAffinity": {
                                "preferredDuringSchedulingIgnoredDuringExecution": [
                                    {
                                        "weight": 100,
                                        "podAffinityTerm": {
                                            "labelSelector": {"matchLabels": labels},
                                            "topologyKey": "kubernetes.io/hostname",
                                        },
                                    }
                                ]
                            }
                        },
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "dnsPolicy": "Default",
                        "tolerations": [{"operator": "Exists"}],
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "IfNotPresent",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 5353, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 5353, "protocol": "TCP"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "resources": {
                                    "requests": {"cpu": "10m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "securityContext": {
                                    "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "labels": labels, **meta},
            "spec": {
                "clusterIP": CLUSTER_DNS_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 5353, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 5353, "protocol": "TCP"},
                ],
            },
        },
    ]


def kubernetes_endpoint_slice(host_address: str, apiserver_port: int) -> dict[str, Any]:
    """The `kubernetes` Service's endpoint: the apiserver as pods reach it, through
    the host's end of the link (the bed's apiserver runs with
    `--endpoint-reconciler-type=none`, so nobody else writes it)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "sunk-testbed",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [host_address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": apiserver_port, "protocol": "TCP"}],
    }


def dump_yaml(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False)
