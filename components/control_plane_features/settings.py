"""The controlPlane section of the stack config: ControlPlaneFeatures' settings.

Imports nothing of the component: ControlPlaneFeaturesArgs.from_settings (component.py) turns
these settings into the component's inputs (hosts resolved to their inventory addresses and
pinned host keys, the SSH key from the top-level secret sshPrivateKey).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, Field, field_validator
from pydantic import ValidationInfo as FieldInfo
from pydantic_core import core_schema

from components.control_plane_features.admission_plugins import admission_plugins_for
from components.control_plane_features.feature_gates import unknown_gate_problem
from components.kubernetes_names import NodeRef, NodeRefs
from components.settings import (
    BOOL,
    PROJECT,
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
# An OpenSSH public key line: type, base64 blob, optional comment.
_HOST_KEY = re.compile(
    r"(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|sk-ssh-ed25519@openssh\.com|"
    r"sk-ecdsa-sha2-nistp256@openssh\.com) [A-Za-z0-9+/]+={0,3}( [!-~ ]*)?",
    re.ASCII,
)
HOST_KEY = text(
    lambda v: _HOST_KEY.fullmatch(v.strip()) is not None,
    "expected an OpenSSH public key line (ssh-ed25519 AAAA..., ecdsa-sha2-nistp256 AAAA... or "
    "ssh-rsa AAAA...)",
)
STATE_DIR = text(
    lambda v: re.fullmatch(r"(/[A-Za-z0-9._-]+)+/?", v) is not None and "/../" not in f"{v}/",
    "expected an absolute path of letters, digits, '.', '_' and '-'",
)
_GROUP_VERSION = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/)?v[0-9]+((alpha|beta)[0-9]+)?",
    re.ASCII,
)
GROUP_VERSION = text(
    lambda v: _GROUP_VERSION.fullmatch(v) is not None and v != "api/all",
    "expected an API group/version, e.g. scheduling.k8s.io/v1beta1 (or v1 for the core group)",
)
FEATURE_GATE = text(
    lambda v: _CAMEL_CASE.fullmatch(v) is not None,
    "expected a feature gate name in CamelCase, e.g. InPlacePodVerticalScaling",
)


DEFAULT_STATE_DIR = f"/etc/kubernetes/{PROJECT}"
"""Where hosts keep each stack's kubelet patches and record (a directory per stack id)."""


@dataclass(frozen=True)
class InventoryNode(NodeRef):
    """A key naming a node of the inventory: one it lacks (a typo) would pin nothing, so it is
    refused with the inventory's names."""

    def validate(self, value: Any, info: core_schema.ValidationInfo) -> Any:
        inventory = context_value(info, "inventory")
        if isinstance(value, str) and inventory is not None and value not in inventory:
            raise problem(f"{self.allowed}; allowed: {', '.join(inventory) or 'none listed'}")
        return super().validate(value, info)


def _known_gate(name: str, info: FieldInfo) -> str:
    version = context_value(info, "kubernetes_version")
    why = unknown_gate_problem(name, version) if version else None
    if why:
        raise problem(why)
    return name


def _known_plugin(name: str, info: FieldInfo) -> str:
    # The plugin names of the configured version's kube-apiserver (components/admission-plugins
    # .yaml, generated from the binary by tools/admission_plugins.py), else the nearest minor's.
    version = context_value(info, "kubernetes_version") or ""
    source, known = admission_plugins_for(version)
    if name not in known:
        raise problem(
            f"unknown admission plugin in kube-apiserver {source}; allowed: {', '.join(known)}"
        )
    return name


class ControlPlaneSettings(Settings):
    """Admission plugins and feature gates set in kubeadm's configuration and applied by kubeadm
    on each host over SSH (controlPlane).

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
    host_keys: dict[Annotated[str, InventoryNode()], Annotated[str, HOST_KEY]] = Field(
        default_factory=dict
    )
    """{node name: its SSH host public key}, each node in the inventory; every host SSH reaches
    is pinned (ssh-keyscan it from a trusted network, or read /etc/ssh/*.pub on it). Required
    for each host when enabled."""
    hosts: NodeRefs = Field(default=(), validate_default=True)
    """Control-plane hosts (inventory names, reached at their address), regenerated by kubeadm
    one at a time in this order. Required when enabled."""
    kubelet_hosts: NodeRefs = Field(default=(), validate_default=True)
    """Hosts whose kubelet gets the feature gates (a kubeadm patch each), after the control plane."""
    admission_plugins: Annotated[
        tuple[Annotated[str, ADMISSION_PLUGIN, AfterValidator(_known_plugin)], ...],
        AfterValidator(unique("each plugin may be listed once; it is listed twice")),
    ] = ()
    """Admission plugins added to --enable-admission-plugins (existing ones are kept)."""
    feature_gates: dict[
        Annotated[str, FEATURE_GATE, AfterValidator(_known_gate)], Annotated[bool, BOOL]
    ] = Field(default_factory=dict)
    """Feature gates {Name: true | false} for the API server, controller manager, scheduler and
    the kubelets; checked against the live API server's feature metric at preview."""
    runtime_config: dict[Annotated[str, GROUP_VERSION], Annotated[bool, BOOL]] = Field(
        default_factory=dict
    )
    """API versions {group/version: true | false} added to the API server's --runtime-config
    (existing entries are kept), e.g. {scheduling.k8s.io/v1beta1: true}."""
    ready_timeout_seconds: Annotated[int, between(30, 1800)] = 300
    """How long a restarted kubelet may take to be healthy before its old config is restored."""
    state_dir: Annotated[str, STATE_DIR] = DEFAULT_STATE_DIR
    """Directory on the hosts for each stack's kubelet patches and record."""

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
                f"{PROJECT}:sshPrivateKey < key), unless controlPlane.sshAgent is true",
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
        # hostKeys refused already (a node it names is not in the inventory): which hosts it
        # pins is not known, so none is reported as lacking a key.
        pinned = "host_keys" in info.data
        keys = info.data.get("host_keys") or {}
        for i, name in enumerate(hosts):
            if name in inventory and not inventory[name]:
                raise problem(
                    f"node has no address in {PROJECT}:nodes; SSH needs one",
                    at=f"[{i}]",
                    value=name,
                )
            if info.data.get("enabled") and pinned and name not in keys:
                raise problem(
                    "no SSH host key in controlPlane.hostKeys; every host key is pinned "
                    "(ssh-keyscan the host from a trusted network, or read /etc/ssh/*.pub on it)",
                    at=f"[{i}]",
                    value=name,
                )
        return hosts
