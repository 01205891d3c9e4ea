"""The controlPlane section of the stack config: ControlPlaneFeatures' settings.

Kept beside components/control_plane_features.py rather than in it, so that module can take it
over: `args()` turns these settings into ControlPlaneFeaturesArgs (hosts resolved to their
inventory addresses, the SSH key from the top-level secret sshPrivateKey).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated

import pulumi
from pydantic import AfterValidator, Field, field_validator
from pydantic import ValidationInfo as FieldInfo

from components.control_plane_features import (
    ADMISSION_PLUGINS,
    ControlPlaneFeaturesArgs,
    RemoteHost,
    SshAccess,
)
from components.feature_gates import unknown_gate_problem
from components.settings import (
    BOOL,
    NodeRefs,
    Settings,
    between,
    context_value,
    problem,
    text,
    unique,
)

_CAMEL_CASE = re.compile(r"[A-Z][A-Za-z0-9]*", re.ASCII)
# Linux user names as useradd accepts them by default (NAME_REGEX), at most 32 characters.
_SSH_USER = re.compile(r"[a-z_][a-z0-9_.-]{0,31}", re.ASCII)

SSH_USER = text(
    lambda v: v == "" or _SSH_USER.fullmatch(v) is not None,
    "expected a user name (lowercase, digits, '_', '-', '.')",
)
ADMISSION_PLUGIN = text(
    lambda v: _CAMEL_CASE.fullmatch(v) is not None,
    "expected a plugin name (letters and digits, CamelCase)",
)
FEATURE_GATE = text(
    lambda v: _CAMEL_CASE.fullmatch(v) is not None,
    "expected a feature gate name in CamelCase, e.g. InPlacePodVerticalScaling",
)


def _known_gate(name: str, info: FieldInfo) -> str:
    version = context_value(info, "kubernetes_version")
    why = unknown_gate_problem(name, version) if version else None
    if why:
        raise problem(why)
    return name


def _known_plugin(name: str) -> str:
    if name not in ADMISSION_PLUGINS:
        raise problem(f"unknown admission plugin; allowed: {', '.join(ADMISSION_PLUGINS)}")
    return name


class ControlPlaneSettings(Settings):
    """Admission plugins and feature gates edited over SSH on kubeadm hosts (controlPlane).

    The SSH private key is the top-level secret key sshPrivateKey.
    """

    enabled: Annotated[bool, BOOL] = False
    """Build the ControlPlaneFeatures layer."""
    user: Annotated[str, SSH_USER] = Field(default="", validate_default=True)
    """SSH user: root or with passwordless sudo. Required when enabled."""
    port: Annotated[int, between(1, 65535)] = 22
    """SSH port."""
    ssh_agent: Annotated[bool, BOOL] = Field(default=False, validate_default=True)
    """Use the SSH agent ($SSH_AUTH_SOCK) instead of sshPrivateKey."""
    hosts: NodeRefs = Field(default=(), validate_default=True)
    """Control-plane hosts (inventory names, reached at their address), edited one at a time
    in this order. Required when enabled."""
    kubelet_hosts: NodeRefs = ()
    """Hosts whose kubelet gets the feature gates, after the control plane."""
    admission_plugins: Annotated[
        tuple[Annotated[str, ADMISSION_PLUGIN, AfterValidator(_known_plugin)], ...],
        AfterValidator(unique("each plugin may be listed once; it is listed twice")),
    ] = ()
    """Admission plugins added to --enable-admission-plugins (existing ones are kept)."""
    feature_gates: dict[
        Annotated[str, FEATURE_GATE, AfterValidator(_known_gate)], Annotated[bool, BOOL]
    ] = Field(default_factory=dict)
    """Feature gates {Name: true | false} for kube-apiserver and the kubelets; gates locked or
    removed in kubernetesVersion are left out with a warning."""
    ready_timeout_seconds: Annotated[int, between(30, 1800)] = 300
    """How long a restarted component may take to be healthy before the edit is rolled back."""
    persist_kubeadm_config: Annotated[bool, BOOL] = True
    """Also edit the kubeadm-config and kubelet-config ConfigMaps (survives kubeadm upgrade)."""

    @field_validator("user")
    @classmethod
    def _user_when_enabled(cls, user: str, info: FieldInfo) -> str:
        if info.data.get("enabled") and not user:
            raise problem("required when controlPlane.enabled is true")
        return user

    @field_validator("ssh_agent")
    @classmethod
    def _key_or_agent(cls, agent: bool, info: FieldInfo) -> bool:
        key_set = context_value(info, "ssh_key_set")
        if info.data.get("enabled") and key_set is False and not agent:
            raise problem(
                "required when controlPlane.enabled is true (pulumi config set --secret "
                "gpu-cluster:sshPrivateKey < key), unless controlPlane.sshAgent is true",
                key="sshPrivateKey",
                value="",
            )
        return agent

    @field_validator("hosts", "kubelet_hosts")
    @classmethod
    def _hosts_have_addresses(cls, hosts: tuple[str, ...], info: FieldInfo) -> tuple[str, ...]:
        if info.field_name == "hosts" and info.data.get("enabled") and not hosts:
            raise problem("required when controlPlane.enabled is true", value=[])
        inventory = context_value(info, "inventory") or {}
        for i, name in enumerate(hosts):
            if name in inventory and not inventory[name]:
                raise problem(
                    "node has no address in gpu-cluster:nodes; SSH needs one",
                    at=f"[{i}]",
                    value=name,
                )
        return hosts

    def args(
        self,
        *,
        ssh_private_key: pulumi.Output[str] | None,
        addresses: Mapping[str, str],
        kubernetes_version: str,
    ) -> ControlPlaneFeaturesArgs:
        """ControlPlaneFeatures' inputs: these settings with hosts resolved to their addresses,
        the SSH key (a Pulumi secret, or None for the agent) and the cluster's version."""

        def resolve(names: Sequence[str]) -> tuple[RemoteHost, ...]:
            return tuple(RemoteHost(name=n, address=addresses[n]) for n in names)

        return ControlPlaneFeaturesArgs(
            ssh=SshAccess(user=self.user, port=self.port, private_key=ssh_private_key),
            control_plane_hosts=resolve(self.hosts),
            kubelet_hosts=resolve(self.kubelet_hosts),
            kubernetes_version=kubernetes_version,
            admission_plugins=self.admission_plugins,
            feature_gates=self.feature_gates,
            ready_timeout_seconds=self.ready_timeout_seconds,
            persist_kubeadm_config=self.persist_kubeadm_config,
        )
