"""Run Pulumi programs with the real engine built in .tools/bin, offline.

The pulumi CLI and the kubernetes provider plugin are built from source
(tools/build-pulumi.sh). The module proxy refuses the pulumi-language-python host and the
command and tls provider modules (tools/README.md), so:

- the Python SDK's Automation API serves the program from an in-process language server
  (`pulumi up --client=...`) in place of the language host;
- `pulumi-resource-tls` and `pulumi-resource-command` are the stand-ins in tools/plugins/bin,
  which the engine starts from PATH like any plugin (each module says what it leaves out).

Everything else is the real thing: the engine's state, diffs, replacements, resource options
and secrets, the kubernetes provider's apply and await logic, and the dynamic providers'
process (pulumi-resource-pulumi-python).

`ProjectStack` runs the whole program (__main__.py) for a stack of this project, the way a
user runs `pulumi up` in a checkout: Pulumi.yaml's defaults, the stack's Pulumi.<stack>.yaml,
what `pulumi config set` adds (secrets encrypted), a local file backend.
"""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
from collections.abc import Callable, Mapping
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
from components.kubeconfig import CONTEXT_KEY, KUBECONFIG_KEY
from stack_config import StackConfig, parse_stack_config

from .tools import find_tool, require_tool, tools_bin

REPO_ROOT = Path(__file__).resolve().parents[2]

PROJECT = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())["name"]
"""The project name, as Pulumi.yaml says it (the config namespace too)."""

STAND_IN_PLUGINS = REPO_ROOT / "tools" / "plugins" / "bin"
"""pulumi-resource-tls and pulumi-resource-command: the stand-ins the engine finds on PATH."""

COMMAND_RECORD_VARIABLE = "GPU_CLUSTER_COMMAND_RECORD"
"""Set to a file, the command stand-in records each command there instead of running it."""

# The engine and the two scripts it runs Python dynamic providers with.
PULUMI_ENGINE_TOOLS = ("pulumi", "pulumi-resource-pulumi-python", "pulumi-language-python-exec")

# The state of these stacks is throwaway, so a fixed passphrase is fine here and only here.
LOCAL_PASSPHRASE = "gpu-cluster-local-only"


def engine_env(state_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for the CLI: local backend, passphrase secrets, plugins from .tools/bin."""
    return {
        "PATH": os.pathsep.join((str(tools_bin()), str(STAND_IN_PLUGINS), os.environ["PATH"])),
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
    return parse_stack_config(project_config(stack, overrides))


def node_layers_program(config: StackConfig) -> auto.PulumiFn:
    """The stack's node layers (ExtendedResourceNodes, TaintedGpuPool) as an inline program.

    These are the layers built on Python dynamic providers, pool labels included.
    """

    def program() -> None:
        # No kubernetes object is declared, so no kubernetes Provider is needed.
        access = ClusterAccess(provider=cast(Any, None))
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


# ------------------------------------------------------------------------- the whole program

# The engine, the scripts it runs dynamic providers with, and the kubernetes provider plugin.
WHOLE_PROGRAM_TOOLS = (*PULUMI_ENGINE_TOOLS, "pulumi-resource-kubernetes")

# Steps that leave a resource as it was (`pulumi up`'s "same", a read, a refresh's check).
UNCHANGED_OPS = frozenset({"same", "read", "refresh"})


def project_config(stack: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Pulumi.yaml's defaults, Pulumi.<stack>.yaml and `overrides`: keys without the project
    namespace, values as YAML has them (objects as dicts)."""
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    values = {key: spec.get("default") for key, spec in (project.get("config") or {}).items()}
    document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack}.yaml").read_text()) or {}
    for key, value in (document.get("config") or {}).items():
        namespace, _, name = key.partition(":")
        if namespace == PROJECT:
            values[name] = value
    values.update(overrides or {})
    return values


def whole_program() -> None:
    """__main__.py, run as the language host runs it."""
    runpy.run_path(str(REPO_ROOT / "__main__.py"), run_name="__main__")


class ProjectStack:
    """One stack of this project under the real engine, in a project directory of its own.

    The directory holds Pulumi.yaml as committed and Pulumi.<stack>.yaml with `overrides`
    written in, as a user edits the stack file; `secrets` are set the way
    `pulumi config set --secret` sets them (encrypted in the stack file). `steps` records, per
    run, what the engine said it did to each resource (its `op` and the properties that differ).
    """

    def __init__(
        self,
        stack: str,
        state_dir: Path,
        *,
        overrides: Mapping[str, Any] | None = None,
        secrets: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        stack_file: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.name = stack
        self.state_dir = state_dir
        self.project_dir = state_dir / "project"
        self.log = log
        self.steps: list[auto.events.StepEventMetadata] = []
        self.project_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / "Pulumi.yaml", self.project_dir / "Pulumi.yaml")
        self.write_config(stack_file or stack, overrides)
        self.env = {**engine_env(state_dir, env), "PULUMI_HOME": str(state_dir / "home")}
        self.stack = inline_stack(PROJECT, stack, whole_program, state_dir, env)
        for key, value in (secrets or {}).items():
            self.stack.set_config(f"{PROJECT}:{key}", auto.ConfigValue(value, secret=True))

    def write_config(self, stack_file: str, overrides: Mapping[str, Any] | None = None) -> None:
        """The stack file: the committed Pulumi.<stack_file>.yaml with `overrides` set in it.

        Keys the stack holds already (secrets, the encryption salt) are kept.
        """
        path = self.project_dir / f"Pulumi.{self.name}.yaml"
        current = yaml.safe_load(path.read_text()) if path.exists() else {}
        document = yaml.safe_load((REPO_ROOT / f"Pulumi.{stack_file}.yaml").read_text()) or {}
        config = dict(document.get("config") or {})
        for key, value in (current.get("config") or {}).items():
            if isinstance(value, dict) and "secure" in value:
                config[key] = value
        for key, value in (overrides or {}).items():
            config[f"{PROJECT}:{key}"] = value
        document["config"] = config
        if "encryptionsalt" in current:
            document["encryptionsalt"] = current["encryptionsalt"]
        path.write_text(yaml.safe_dump(document, sort_keys=False))

    def _on_event(self, event: auto.events.EngineEvent) -> None:
        pre = event.resource_pre_event
        if pre is not None and pre.metadata.type != "pulumi:pulumi:Stack":
            self.steps.append(pre.metadata)
        if self.log is not None and event.diagnostic_event is not None:
            diagnostic = event.diagnostic_event
            if diagnostic.severity in ("warning", "error"):
                self.log(diagnostic.message.rstrip())

    def _run(self, action: Callable[..., Any], **kwargs: Any) -> Any:
        self.steps = []
        return action(on_event=self._on_event, **kwargs)

    def up(self, **kwargs: Any) -> auto.UpResult:
        return cast(auto.UpResult, self._run(self.stack.up, **kwargs))

    def preview(self, **kwargs: Any) -> auto.PreviewResult:
        return cast(auto.PreviewResult, self._run(self.stack.preview, diff=True, **kwargs))

    def refresh(self, **kwargs: Any) -> auto.RefreshResult:
        return cast(auto.RefreshResult, self._run(self.stack.refresh, **kwargs))

    def destroy(self, **kwargs: Any) -> auto.DestroyResult:
        return cast(auto.DestroyResult, self._run(self.stack.destroy, **kwargs))

    def changes(self) -> list[tuple[str, str]]:
        """(op, URN) of each step of the last run that changed or would change something."""
        return [(s.op.value, s.urn) for s in self.steps if s.op.value not in UNCHANGED_OPS]

    def outputs(self) -> dict[str, Any]:
        """The stack's outputs, secrets revealed."""
        return {key: output.value for key, output in self.stack.outputs().items()}

    def cli(self, *args: str) -> str:
        """The real CLI's `pulumi <args> --stack <name>` in the project (what needs no program:
        `stack export`, `stack history`, `cancel`, ...); its standard output."""
        return subprocess.run(
            [str(require_tool("pulumi")), *args, "--stack", self.name, "--non-interactive"],
            cwd=self.project_dir,
            env={**os.environ, **self.env},
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def deployment(self) -> dict[str, Any]:
        """The stack's state (`pulumi stack export --show-secrets`)."""
        return dict(self.stack.export_stack().deployment or {})

    def resources(self) -> list[dict[str, Any]]:
        """The resources of the stack's state, secrets shown."""
        return list(self.deployment().get("resources") or [])
