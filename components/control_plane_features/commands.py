"""The commands ControlPlaneFeatures runs on its hosts: kubeadm.sh with each step's variables.

Pure functions, settings in, shell command lines out; components/control_plane_features/component.py runs
them over SSH (one remote.Command per host and step) and hands in what the ClusterConfiguration
edit set (the gates, what the stack added) once it is known.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parent / "hostscripts" / "kubeadm.sh"
"""The host side: a few kubeadm commands and the hand-edit check (POSIX sh)."""


def host_command(action: str, variables: Mapping[str, str | int]) -> str:
    """The remote command: kubeadm.sh ACTION with `variables`, as root (sudo -n unless root)."""
    assigns = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in variables.items())
    script = shlex.quote(SCRIPT.read_text())
    return (
        'if [ "$(id -u)" -eq 0 ]; then S=""; else S="sudo -n"; fi; '
        f"$S env {assigns} sh -c {script} kubeadm.sh {action}"
    )


def gate_items(gates: Mapping[str, bool]) -> str:
    """`A=true,B=false`: the gates as --feature-gates spells them, sorted."""
    return ",".join(f"{g}={str(v).lower()}" for g, v in sorted(gates.items()))


_STACK_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*", re.ASCII)


def _stack_key(key: str) -> str:
    if not _STACK_KEY.fullmatch(key):
        raise ValueError(
            f"stack key: got {key!r}; expected a stack id or name (letters, digits, '_', '.', '-')"
        )
    return key


def stack_directory(state_dir: str, stack: str) -> str:
    """The stack's directory on the hosts (its kubelet patches and record), named by its id."""
    return f"{state_dir.rstrip('/')}/{_stack_key(stack)}"


def former_directories(former: Sequence[str]) -> str:
    """FORMER: the names of the directories an earlier version of the stack kept beside
    STACK_DIR (keyed by the stack's name), adopted as the stack's wherever found."""
    return " ".join(sorted({_stack_key(k) for k in former}))


def guard_commands(stack_dir: str) -> tuple[str, str]:
    """(create, delete) of a control-plane host's guard: on `up` it refuses hand-edited
    manifests before the ConfigMap changes; on destroy it regenerates the host once the
    ConfigMap is back."""
    return (
        host_command("check", {"STACK_DIR": stack_dir}),
        host_command("control-plane", {"STACK_DIR": stack_dir}),
    )


def control_plane_command(
    stack_dir: str,
    plugins: Sequence[str],
    gates: Mapping[str, bool],
    added: Mapping[str, Any],
    former: Sequence[str] = (),
    runtime_config: Mapping[str, bool] | None = None,
) -> str:
    """Regenerate a control-plane host from the ClusterConfiguration.

    OURS names the stack's plugins, gates and API versions (the hand-edit check leaves them); CONFIG digests
    what the ConfigMap carries for this stack, so any change to it re-runs the phase; FORMER
    (when any) names the directories of the stack's record an earlier version left.
    """
    ours = " ".join(sorted({*plugins, *gates, *(runtime_config or {})}))
    state: dict[str, Any] = {"plugins": list(plugins), "gates": dict(gates), "added": added}
    if runtime_config:  # only when set: the digest of a stack without one stays as it was
        state["runtime_config"] = dict(runtime_config)
    digest = hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()
    variables: dict[str, str | int] = {"STACK_DIR": stack_dir, "OURS": ours, "CONFIG": digest[:16]}
    if former:
        variables["FORMER"] = former_directories(former)
    return host_command("control-plane", variables)


def kubelet_command(
    action: str,
    stack_dir: str,
    timeout_seconds: int,
    gates: Mapping[str, bool],
    former: Sequence[str] = (),
) -> str:
    """A kubelet host's `kubelet` (patch in) or `kubelet-remove` (patch out) command.

    The removal gets the gates too: it takes them out even when the host's patch is gone,
    comparing with what the kubelet runs with. FORMER (when any) names the directories of the
    stack's patch an earlier version left: adopted first, so their gates are the stack's too.
    """
    variables: dict[str, str | int] = {
        "STACK_DIR": stack_dir,
        "TIMEOUT": timeout_seconds,
        "GATES": gate_items(gates),
    }
    if former:
        variables["FORMER"] = former_directories(former)
    return host_command(action, variables)
