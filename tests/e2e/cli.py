"""The same scenarios through the real Pulumi CLI, where the provider plugins are installed.

On a machine with the kubernetes, command and tls provider plugins and the Python language
host (`pulumi plugin ls`), `GPU_CLUSTER_E2E=cli` makes AppliedStack run `pulumi up` and
`pulumi destroy` of a copy of the project, with a local file backend, instead of the
harness engine (engine.py). The scenarios only use what both give: the outputs, the steps
of each run, and the cluster itself. The build machines cannot install those plugins
(tools/README.md), so this mode is not run there; it is kept thin on purpose.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .engine import PROJECT, REPO_ROOT, Step

MODE_VARIABLE = "GPU_CLUSTER_E2E"
REQUIRED_PLUGINS = (("resource", "kubernetes"), ("resource", "command"), ("resource", "tls"))
PROJECT_FILES = ("Pulumi.yaml", "__main__.py", "stack_config.py", "requirements.txt")
PROJECT_DIRS = ("components", "policies")
PASSPHRASE = "gpu-cluster-e2e-only"


def cli_mode() -> bool:
    """Whether the scenarios run through the real CLI (asked for with GPU_CLUSTER_E2E=cli)."""
    return os.environ.get(MODE_VARIABLE) == "cli"


def missing_plugins() -> list[str]:
    """The provider plugins `pulumi plugin ls` does not list."""
    if shutil.which("pulumi") is None:
        return ["the pulumi CLI"]
    listed = subprocess.run(
        ["pulumi", "plugin", "ls", "--json"], check=True, capture_output=True, text=True
    ).stdout
    have = {(p.get("kind"), p.get("name")) for p in json.loads(listed or "[]")}
    return [f"{kind} {name}" for kind, name in REQUIRED_PLUGINS if (kind, name) not in have]


class CliStack:
    """`pulumi up` / `destroy` of the project for one stack, in a scratch copy."""

    def __init__(self, stack: str, workdir: Path, config: Mapping[str, Any], secrets: set[str]):
        self.stack = stack
        self.project = workdir / "project"
        self.env = {
            **os.environ,
            "PULUMI_BACKEND_URL": f"file://{workdir / 'backend'}",
            "PULUMI_CONFIG_PASSPHRASE": PASSPHRASE,
        }
        (workdir / "backend").mkdir(parents=True, exist_ok=True)
        self.project.mkdir(parents=True, exist_ok=True)
        for name in PROJECT_FILES:
            shutil.copy2(REPO_ROOT / name, self.project / name)
        for name in PROJECT_DIRS:
            shutil.copytree(REPO_ROOT / name, self.project / name, dirs_exist_ok=True)
        shutil.copy2(REPO_ROOT / f"Pulumi.{stack}.yaml", self.project / f"Pulumi.{stack}.yaml")
        self._run("stack", "select", "--create", stack)
        for key, value in config.items():
            text = value if isinstance(value, str) else json.dumps(value)
            flags = ["--secret"] if key in secrets else ["--plaintext"]
            self._run("config", "set", f"{PROJECT}:{key}", text, *flags)
        self.outputs: dict[str, Any] = {}

    def _run(self, *args: str) -> str:
        return subprocess.run(
            ["pulumi", *args, "--stack", self.stack, "--non-interactive"],
            cwd=self.project,
            env=self.env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def _steps(self, summary: Mapping[str, int]) -> list[Step]:
        return [Step(op, f"{op}-{i}") for op, count in summary.items() for i in range(count)]

    def up(self) -> list[Step]:
        self._run("up", "--yes", "--skip-preview")
        history = json.loads(self._run("stack", "history", "--json"))
        self.outputs = json.loads(self._run("stack", "output", "--json", "--show-secrets"))
        return self._steps(history[0].get("resourceChanges") or {})

    def destroy(self) -> list[Step]:
        self._run("destroy", "--yes", "--skip-preview")
        history = json.loads(self._run("stack", "history", "--json"))
        return self._steps(history[0].get("resourceChanges") or {})
