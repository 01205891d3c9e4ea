"""Where a Helm chart comes from: pinned chart versions, chart repositories (HTTP or OCI) and
local chart archives, the Helm Release arguments for each, and how chart values merge."""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.settings import Rule, text

# Helm's chart versions are SemVer 2 (an optional leading v is accepted by Helm).
_CHART_VERSION = re.compile(
    r"v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?",
    re.ASCII,
)
_HELM_REPOSITORY = re.compile(r"(https?|oci)://[!-~]+", re.ASCII)


def is_chart_version(value: str) -> bool:
    return _CHART_VERSION.fullmatch(value) is not None


def is_helm_repository(value: str) -> bool:
    return _HELM_REPOSITORY.fullmatch(value) is not None


def is_local_chart(value: str) -> bool:
    """A chart archive (.tgz) or a chart directory (with Chart.yaml), relative to the project."""
    path = Path(value)
    if path.is_dir():
        return (path / "Chart.yaml").is_file()
    return path.is_file() and path.name.endswith((".tgz", ".tar.gz"))


def is_chart_source(value: str) -> bool:
    return is_helm_repository(value) or is_local_chart(value)


@dataclass(frozen=True)
class HelmChart:
    """The chart a Helm layer installs: its name in the chart repository, the version the stack
    pins, and the CRDs it carries (the file the tools build renders from the chart's Go module,
    for the local chart that stands in for it; None when it carries none the stack needs). A
    layer's row in the table of layers names it (Layer.chart), so the local cluster's stand-in
    charts follow the layers."""

    name: str
    version: str
    crds: str | None = None

    def release_chart(self, source: str, version: str) -> dict[str, Any]:
        """helm_chart() of this chart from `source` at `version`."""
        return helm_chart(self.name, source, version)


def helm_chart(chart: str, source: str, version: str) -> dict[str, Any]:
    """The Helm Release's chart arguments for where the chart comes from.

    `source` is a chart repository URL (the chart is `chart` in its index), an OCI registry
    path (`oci://host/path`: the chart is `<path>/<chart>`), or a local chart archive or
    directory, e.g. a copy made with `helm pull` for an air-gapped install (its own version).
    """
    if source.startswith(("http://", "https://")):
        return {"chart": chart, "version": version, "repository_opts": {"repo": source}}
    if source.startswith("oci://"):
        return {"chart": f"{source.rstrip('/')}/{chart}", "version": version}
    return {"chart": source}


HELM_REPOSITORY = text(
    is_chart_source,
    "expected a chart repository URL (https://... or http://...), an OCI registry "
    "(oci://host/path), or an existing local chart archive (.tgz) or chart directory "
    "(with Chart.yaml)",
)


def chart_version(example: str) -> Rule:
    return text(is_chart_version, f"expected a pinned chart version, e.g. {example}")


def free_values(allowed: str = "expected an object of chart values") -> Rule:
    """Free-form chart values: any object with string keys, kept as written."""
    return Rule(allowed, lambda v: isinstance(v, Mapping) and all(isinstance(k, str) for k in v))


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `override` merged in: objects merge key by key, anything else replaces."""
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        current = merged.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            merged[key] = deep_merge(current, value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged
