"""Finding the binaries the harness runs, and checking the pinned ones are the pinned release.

One setting says where they are: ``$GPU_CLUSTER_TOOLS_BIN``, else ``<repo>/.tools/bin`` (the
directory ``tools/build-tools.sh`` builds into). A directory of prebuilt binaries serves as well
as a built one; either way, before a Kubernetes or etcd binary is run its version output must
name the release ``tools/build-tools.sh`` pins (read from that script, the versions' one home).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

from .child_process import ControlPlaneError

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "tools" / "build-tools.sh"
TOOLS_BIN_ENV = "GPU_CLUSTER_TOOLS_BIN"
CONTROL_PLANE_TOOLS = ("etcd", "kube-apiserver")

_KUBERNETES = "k8s_version"
_ETCD = "etcd_version"
PINNED_BY: Mapping[str, str] = {
    "etcd": _ETCD,
    "kube-apiserver": _KUBERNETES,
    "kube-controller-manager": _KUBERNETES,
    "kube-scheduler": _KUBERNETES,
    "kubeadm": _KUBERNETES,
}
"""Each version-checked tool and the build script variable that pins its release."""

_VERSION_ARGS: Mapping[str, tuple[str, ...]] = {"kubeadm": ("version", "-o", "short")}
"""How a tool prints its version, where it is not ``--version``."""

_REPORTED = re.compile(r"(?:Kubernetes |etcd Version: )v?(\d+\.\d+\.\d+\S*)|^v(\d+\.\d+\.\d+\S*)$")


class ToolNotFoundError(ControlPlaneError):
    """A required binary is neither built nor provided."""


class ToolVersionError(ControlPlaneError):
    """A binary reports another release than the pinned one."""


def tools_bin() -> Path:
    """Directory holding the tools: ``$GPU_CLUSTER_TOOLS_BIN`` or ``<repo>/.tools/bin``."""
    env = os.environ.get(TOOLS_BIN_ENV)
    return Path(env) if env else REPO_ROOT / ".tools" / "bin"


@functools.cache
def pinned_versions(script: Path = BUILD_SCRIPT) -> dict[str, str]:
    """The ``<name>_version=vX.Y.Z`` assignments of the build script, by variable name."""
    found = re.findall(r"^(\w+_version)=(\S+)$", script.read_text(), flags=re.MULTILINE)
    return dict(found)


def pinned_version(name: str) -> str | None:
    """The release the build script pins for tool ``name`` (``v1.37.2``), None if unchecked."""
    variable = PINNED_BY.get(name)
    return None if variable is None else pinned_versions()[variable]


def reported_version(path: Path) -> str:
    """The release ``path`` says it is (``v1.37.2``), from its version output."""
    argv = [str(path), *_VERSION_ARGS.get(path.name, ("--version",))]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolVersionError(f"{path} cannot report its version: {exc}") from exc
    for line in (done.stdout + done.stderr).splitlines():
        match = _REPORTED.search(line.strip())
        if match:
            return "v" + (match.group(1) or match.group(2))
    output = (done.stdout + done.stderr).strip() or "no output"
    raise ToolVersionError(f"{path} reports no version for `{' '.join(argv[1:])}`: {output}")


@functools.cache
def _checked(path: Path, mtime_ns: int, size: int) -> str:
    del mtime_ns, size  # part of the cache key: a replaced binary is checked again
    return reported_version(path)


def check_version(name: str, path: Path) -> None:
    """Raise :class:`ToolVersionError` unless the pinned tool ``name`` at ``path`` reports
    the pinned release (tools without a pin pass)."""
    pinned = pinned_version(name)
    if pinned is None:
        return
    stat = path.stat()
    reported = _checked(path.resolve(), stat.st_mtime_ns, stat.st_size)
    if reported != pinned:
        raise ToolVersionError(
            f"{name} at {path} is {reported}, but {BUILD_SCRIPT.relative_to(REPO_ROOT)} pins"
            f" {pinned}: provide the {pinned} binary in ${TOOLS_BIN_ENV} or build it"
            f" (tools/build-tools.sh {name})"
        )


def find_tool(name: str) -> Path | None:
    """Path of the tool ``name``, or None if it is missing or not executable.

    A ``.yaml`` name is a data file the build installs beside the binaries (kwok's stages).
    """
    path = tools_bin() / name
    usable = path.suffix == ".yaml" or os.access(path, os.X_OK)
    return path if path.is_file() and usable else None


def missing_tools(names: Iterable[str] = CONTROL_PLANE_TOOLS) -> list[str]:
    """The subset of ``names`` that is not there."""
    return [name for name in names if find_tool(name) is None]


def require_tool(name: str) -> Path:
    """Like :func:`find_tool`, but raises :class:`ToolNotFoundError` when it is missing and
    :class:`ToolVersionError` when a pinned tool is another release."""
    path = find_tool(name)
    if path is None:
        raise ToolNotFoundError(
            f"{name} not found in {tools_bin()}: run `make tools` (tools/build-tools.sh)"
            f" or point ${TOOLS_BIN_ENV} at a directory holding it"
        )
    check_version(name, path)
    return path
