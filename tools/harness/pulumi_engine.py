"""Run Pulumi programs with the real engine built in .tools/bin, offline.

The pulumi CLI is built from source (tools/build-pulumi.sh), but the module proxy refuses
the pulumi-language-python host and the kubernetes/command/tls provider modules (see
tools/README.md). The Python SDK's Automation API serves the program from an in-process
language server (`pulumi up --client=...`), so programs whose resources are Python dynamic
providers run under the real engine: state, diffs, secrets, refresh and the provider
process (pulumi-resource-pulumi-python) are the real ones.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import pulumi
import yaml
from pulumi import automation as auto

from components import (
    ClusterAccess,
    ExtendedResourceNodes,
    ExtendedResourceNodesArgs,
    TaintedGpuPool,
    TaintedGpuPoolArgs,
)
from components.providers.credentials import CONTEXT_KEY, KUBECONFIG_KEY
from stack_config import StackConfig, parse_stack_config

from .controlplane import find_tool, tools_bin

REPO_ROOT = Path(__file__).resolve().parents[2]

# The engine and the two scripts it runs Python dynamic providers with.
PULUMI_ENGINE_TOOLS = ("pulumi", "pulumi-resource-pulumi-python", "pulumi-language-python-exec")

# The state of these stacks is throwaway, so a fixed passphrase is fine here and only here.
LOCAL_PASSPHRASE = "gpu-cluster-local-only"


def engine_env(state_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the CLI: local backend, passphrase secrets, plugins from .tools/bin."""
    return {
        "PATH": f"{tools_bin()}{os.pathsep}{os.environ.get('PATH', '')}",
        "PULUMI_BACKEND_URL": f"file://{state_dir / 'backend'}",
        "PULUMI_CONFIG_PASSPHRASE": LOCAL_PASSPHRASE,
        "PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION": "true",
        "PULUMI_SKIP_UPDATE_CHECK": "true",
        # pulumi-resource-pulumi-python runs dynamic providers with this virtualenv's python.
        "PULUMI_RUNTIME_VIRTUALENV": str(REPO_ROOT / ".venv"),
        "PYTHONPATH": str(REPO_ROOT),
        **(extra or {}),
    }


def inline_stack(
    project: str,
    stack: str,
    program: auto.PulumiFn,
    state_dir: Path,
    env: Mapping[str, str] | None = None,
) -> auto.Stack:
    """A stack of `program` with its project, backend and home under `state_dir`."""
    pulumi = find_tool("pulumi")
    if pulumi is None:
        raise FileNotFoundError(f"pulumi is not built in {tools_bin()}: run `make pulumi-tools`")
    (state_dir / "backend").mkdir(parents=True, exist_ok=True)
    (state_dir / "project").mkdir(parents=True, exist_ok=True)
    options = auto.LocalWorkspaceOptions(
        work_dir=str(state_dir / "project"),
        pulumi_home=str(state_dir / "home"),
        env_vars=engine_env(state_dir, env),
        secrets_provider="passphrase",
        project_settings=auto.ProjectSettings(name=project, runtime="python"),
        pulumi_command=auto.PulumiCommand(root=str(pulumi.parent.parent), skip_version_check=True),
    )
    return auto.create_or_select_stack(stack, project, program, opts=options)


def use_cluster(stack: auto.Stack, kubeconfig: str, context: str = "") -> None:
    """Point the stack at a cluster the way a user does: the kubeconfig as a secret config value.

    The node providers read it from the stack config on every run (credentials.py).
    """
    stack.set_config(KUBECONFIG_KEY, auto.ConfigValue(kubeconfig, secret=True))
    stack.set_config(CONTEXT_KEY, auto.ConfigValue(context))


def stack_file_config(stack: str, overrides: Mapping[str, Any] | None = None) -> StackConfig:
    """The validated config of Pulumi.<stack>.yaml (over Pulumi.yaml's defaults).

    `overrides` stand for what `pulumi config set` adds (e.g. a stack's secrets).
    """
    document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    values = {k.partition(":")[2]: v for k, v in (document.get("config") or {}).items()}
    return parse_stack_config({**values, **(overrides or {})})


def node_layers_program(config: StackConfig) -> auto.PulumiFn:
    """The stack's node layers (ExtendedResourceNodes, TaintedGpuPool) as an inline program.

    These are the layers built on Python dynamic providers, pool labels included.
    """

    def program() -> None:
        # No kubernetes object is declared, so no kubernetes Provider is needed.
        access = ClusterAccess(
            provider=cast(Any, None), kubeconfig=pulumi.Output.secret(""), context=None
        )
        extended = ExtendedResourceNodes(
            "extended-resources",
            ExtendedResourceNodesArgs(access=access, nodes=config.extended_resources),
        )
        pool = TaintedGpuPool(
            "gpu-pool",
            TaintedGpuPoolArgs.from_settings(config.gpu_pool, access=access),
            pulumi.ResourceOptions(depends_on=[extended]),  # as in __main__.py
        )
        pulumi.export("gpuNodes", pool.nodes)
        pulumi.export("gpuTaint", pool.taint)
        pulumi.export("gpuNodeLabels", pool.labels)
        pulumi.export("advertisedResources", extended.resources)

    return program


def node_layers_resource_count(config: StackConfig) -> int:
    """Resources node_layers_program registers: the stack, two components, one node set each."""
    return 1 + 2 + 2
