"""ControlPlaneFeatures: admission plugins and feature gates, the kubeadm way.

The change is made where kubeadm keeps it, then kubeadm applies it:

1. the kube-system/kubeadm-config ClusterConfiguration gets the admission plugins
   (apiServer) and feature gates (apiServer, controllerManager, scheduler) through the API
   (`KubeadmConfig`, a dynamic provider that also refuses gates the live API server does not
   know or has locked);
2. each control-plane host, one at a time, runs `kubeadm upgrade node phase control-plane`,
   which rewrites its static pod manifests from that configuration, backs up the old ones,
   waits for the pods and rolls back on failure; a manifest with hand edits kubeadm would
   drop is refused first, naming them;
3. each kubelet host, one at a time, gets the gates as a kubeadm patch in a directory of this
   stack and runs `kubeadm upgrade node phase kubelet-config --patches` with every stack's
   patch on the host (per node, so the cluster-wide kubelet-config ConfigMap is left alone),
   unless the kubelet already runs with kubeadm's rendering; settings of the node's kubelet
   config that kubeadm would drop are refused first, naming them.

Everything is one chain over SSH with pinned host keys. `pulumi destroy` walks it backwards:
kubelet patches out, the ClusterConfiguration back to what it was, then every control-plane
host regenerated from it (the `-guard-` commands run first on `up` and last on destroy).

The record on the ConfigMap and the directory on each host are keyed by the stack's id
(node_api.stack_identity), which `pulumi stack rename` keeps; what an earlier version keyed by
the stack's name is adopted by the next `up` (the name comes from KubeadmConfig's state).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
from pulumi_command import remote

from components.cluster_access import ClusterAccess
from components.control_plane_features.commands import (
    control_plane_command,
    guard_commands,
    kubelet_command,
    stack_directory,
)
from components.control_plane_features.provider import KubeadmConfig
from components.control_plane_features.settings import DEFAULT_STATE_DIR, ControlPlaneSettings
from components.handoffs import NO_NEEDS, ControlPlaneNeeds
from components.inventory import NodeSettings
from components.providers.node_api import stack_identity, stack_label
from components.settings import PROJECT

TOKEN = f"{PROJECT}:index:ControlPlaneFeatures"


@dataclass(frozen=True, kw_only=True)
class RemoteHost:
    """A host reached over SSH; `name` is its Kubernetes Node name."""

    name: str
    """Node name."""
    address: str
    """Address SSH connects to."""
    host_key: str
    """The host's SSH public key (`ssh-ed25519 AAAA...`); the connection is refused otherwise."""
    previous_names: tuple[str, ...] = ()
    """Names the host had before a rename: its commands are aliased, not replaced."""


@dataclass(frozen=True, kw_only=True)
class SshAccess:
    """How to log in to the hosts. The user must be root or have passwordless sudo."""

    user: str
    """SSH user."""
    port: int = 22
    """SSH port."""
    private_key: pulumi.Output[str] | None = None
    """The private key, a Pulumi secret; None uses the SSH agent ($SSH_AUTH_SOCK)."""


@dataclass(frozen=True, kw_only=True)
class ControlPlaneFeaturesArgs:
    """Inputs of ControlPlaneFeatures."""

    access: ClusterAccess
    """Cluster credentials for the kubeadm-config ConfigMap and the feature-gate check."""
    ssh: SshAccess
    """SSH login shared by every host."""
    control_plane_hosts: Sequence[RemoteHost]
    """kubeadm control-plane hosts, regenerated one at a time in this order."""
    kubelet_hosts: Sequence[RemoteHost] = ()
    """Hosts whose kubelet gets the feature gates (a kubeadm patch each), after the control plane."""
    admission_plugins: Sequence[str] = ()
    """Admission plugins added to the API server's enable-admission-plugins."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Feature gates for the API server, controller manager, scheduler and the kubelets."""
    runtime_config: Mapping[str, bool] = field(default_factory=dict)
    """API versions {group/version: on} for the API server's --runtime-config."""
    state_dir: str = DEFAULT_STATE_DIR
    """Directory on the hosts holding a subdirectory per stack, named by its id (kubelet
    patches, record). Stacks sharing hosts share it: a kubelet gets every stack's patch found
    there."""
    ready_timeout_seconds: int = 300
    """How long a restarted kubelet may take to be healthy before its old config is restored."""

    @classmethod
    def from_settings(
        cls,
        settings: ControlPlaneSettings,
        *,
        access: ClusterAccess,
        ssh_private_key: pulumi.Output[str] | None,
        inventory: Sequence[NodeSettings],
        needs: ControlPlaneNeeds = NO_NEEDS,
    ) -> ControlPlaneFeaturesArgs:
        """ControlPlaneFeatures' inputs: the controlPlane settings with hosts resolved to their
        inventory addresses and host keys, the SSH key (a Pulumi secret, or None for the SSH
        agent) and the cluster access for kubeadm's ConfigMap; with what other layers `needs` of
        the control plane added to the gates and API versions."""
        nodes = {node.name: node for node in inventory}

        def resolve(names: Sequence[str]) -> tuple[RemoteHost, ...]:
            return tuple(
                RemoteHost(
                    name=n,
                    address=nodes[n].address,
                    host_key=" ".join(settings.host_keys.get(n, "").split()[:2]),
                    previous_names=nodes[n].previous_names,
                )
                for n in names
            )

        return cls(
            access=access,
            ssh=SshAccess(user=settings.user, port=settings.port, private_key=ssh_private_key),
            control_plane_hosts=resolve(settings.hosts),
            kubelet_hosts=resolve(settings.kubelet_hosts),
            admission_plugins=settings.admission_plugins,
            feature_gates={**settings.feature_gates, **needs.feature_gates},
            runtime_config={**settings.runtime_config, **needs.runtime_config},
            ready_timeout_seconds=settings.ready_timeout_seconds,
            state_dir=settings.state_dir,
        )

    def __post_init__(self) -> None:
        if not self.control_plane_hosts:
            raise ValueError("control_plane_hosts: got []; at least one host is required")
        for key, hosts in (
            ("control_plane_hosts", self.control_plane_hosts),
            ("kubelet_hosts", self.kubelet_hosts),
        ):
            names = [h.name for h in hosts]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{key}: got {twice} twice; each host may be listed once")
            keyless = [h.name for h in hosts if not h.host_key.strip()]
            if keyless:
                raise ValueError(f"{key}: {keyless} have no host_key; every host key is pinned")
        if not self.state_dir.startswith("/"):
            raise ValueError(f"state_dir: got {self.state_dir!r}; expected an absolute path")
        if self.ready_timeout_seconds < 1:
            raise ValueError(
                f"ready_timeout_seconds: got {self.ready_timeout_seconds}; expected >= 1"
            )
        for gate, value in self.feature_gates.items():
            if not isinstance(value, bool):
                raise ValueError(f"feature_gates.{gate}: got {value!r}; expected true or false")


class ControlPlaneFeatures(pulumi.ComponentResource):
    """Enables admission plugins and feature gates on a kubeadm cluster with kubeadm itself."""

    hosts: pulumi.Output[list[str]]
    """Hosts changed, in order (control plane first)."""
    admission_plugins: pulumi.Output[list[str]]
    """Admission plugins in the ClusterConfiguration and on every control-plane host."""
    feature_gates: pulumi.Output[dict[str, bool]]
    """Feature gates set (the requested ones the API server does not already lock)."""
    skipped_gates: pulumi.Output[dict[str, str]]
    """Requested gates left out, each with the reason (e.g. GA and already on)."""

    def __init__(
        self,
        name: str,
        args: ControlPlaneFeaturesArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        self._args = args
        # One host at a time: each step waits for the previous (the first for the claim).
        self._chain: list[pulumi.Resource] = []
        self._first = args.access.after(opts)
        # Keyed by the stack's id, which a renamed stack keeps (a name would leave the old
        # patch on every host and the old record on the ConfigMap).
        stack = stack_identity()
        plugins = list(args.admission_plugins)

        # Created first and deleted last: on `up` they refuse hand-edited manifests before the
        # ConfigMap changes; on destroy they regenerate each host once the ConfigMap is back.
        guard = stack.apply(lambda s: guard_commands(stack_directory(args.state_dir, s)))
        for host in args.control_plane_hosts:
            self._command("guard", host, guard[0], guard[1])

        config = KubeadmConfig(
            f"{name}-kubeadm-config",
            stack=stack,
            label=stack_label(),
            admission_plugins=plugins,
            feature_gates=dict(args.feature_gates),
            runtime_config=dict(args.runtime_config),
            opts=pulumi.ResourceOptions(parent=self, depends_on=self._previous()),
        )
        self._chain.append(config)
        # The host side of the same record: the id's directory, and the former names
        # KubeadmConfig found in its state, whose directories each command adopts first.
        stack_dir = config.stack.apply(lambda s: stack_directory(args.state_dir, s))
        former = config.former.apply(lambda f: list(f or ()))

        runtime = dict(args.runtime_config)
        regenerate = pulumi.Output.all(stack_dir, config.gates, config.added, former).apply(
            lambda v: control_plane_command(v[0], plugins, v[1] or {}, v[2] or {}, v[3], runtime)
        )
        for host in args.control_plane_hosts:
            self._command("control-plane", host, regenerate)

        def kubelet(action: str) -> pulumi.Output[str]:
            return pulumi.Output.all(stack_dir, config.gates, former).apply(
                lambda v: kubelet_command(
                    action, v[0], args.ready_timeout_seconds, v[1] or {}, v[2]
                )
            )

        for host in args.kubelet_hosts if args.feature_gates else ():
            self._command("kubelet", host, kubelet("kubelet"), kubelet("kubelet-remove"))

        self._publish(config, plugins)

    def _previous(self) -> list[pulumi.Resource]:
        """depends_on of the next step: the last one, or for the first what it waits for."""
        return self._chain[-1:] or self._first

    def _command(
        self,
        suffix: str,
        host: RemoteHost,
        create: pulumi.Input[str] | None,
        delete: pulumi.Input[str] | None = None,
    ) -> None:
        """One step on one host, after the previous step."""
        ssh = self._args.ssh
        cmd = remote.Command(
            f"{self.pulumi_resource_name}-{suffix}-{host.name}",
            connection=remote.ConnectionArgs(
                host=host.address,
                port=ssh.port,
                user=ssh.user,
                private_key=ssh.private_key,
                host_key=host.host_key,
            ),
            create=create,
            # Re-running converges (kubeadm renders from the configuration), so a changed
            # configuration runs the same command in place instead of a replacement.
            update=create,
            delete=delete,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=self._previous(),
                delete_before_replace=True,
                # A renamed host keeps its commands (no delete over SSH on the old name).
                aliases=[
                    pulumi.Alias(name=f"{self.pulumi_resource_name}-{suffix}-{old}")
                    for old in host.previous_names
                ],
            ),
        )
        self._chain.append(cmd)

    def _publish(self, config: KubeadmConfig, plugins: list[str]) -> None:
        """Set and register the outputs, once every step has run."""
        args = self._args
        touched = [h.name for h in args.control_plane_hosts]
        if args.feature_gates:
            touched += [h.name for h in args.kubelet_hosts if h.name not in touched]
        done = pulumi.Output.all(
            *(r.id for r in self._chain if isinstance(r, pulumi.CustomResource))
        )
        self.hosts = done.apply(lambda _: list(touched))
        self.admission_plugins = done.apply(lambda _: list(plugins))
        self.feature_gates = config.gates.apply(lambda g: dict(g or {}))
        self.skipped_gates = config.notes.apply(lambda n: dict(n or {}))
        self.register_outputs(
            {
                "hosts": self.hosts,
                "admission_plugins": self.admission_plugins,
                "feature_gates": self.feature_gates,
                "skipped_gates": self.skipped_gates,
            }
        )
