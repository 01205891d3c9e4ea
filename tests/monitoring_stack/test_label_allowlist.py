"""monitoring.values' kube-state-metrics label allowlist, checked by the config.

The stack adds the node label the GPU alerts read (nvidia.com/gpu.deploy.operands) to the
allowlist in monitoring.values (tests/monitoring_stack/test_manifests.py), so that allowlist must
be one kube-state-metrics can read; anything else is refused before anything is applied.
"""

from __future__ import annotations

from typing import Any

import pytest

from stack_config import ConfigError, parse_stack_config

ALLOWED = (
    "expected a list of <resource>=[<label>,...] entries (kube-state-metrics' "
    "--metric-labels-allowlist), e.g. nodes=[topology.kubernetes.io/zone]"
)
KEY = "gpu-cluster:monitoring.values.kube-state-metrics"


def _problems(kube_state_metrics: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"monitoring": {"values": {"kube-state-metrics": kube_state_metrics}}})
    return [str(p) for p in excinfo.value.problems]


@pytest.mark.parametrize(
    "allowlist",
    [
        ["nodes"],
        ["nodes=[zone"],
        ["nodes=[a,,b]"],
        ["nodes = [zone]"],
        ["nodes=[a]", ""],
        "nodes=[zone]",
        [{"nodes": ["zone"]}],
    ],
    ids=[
        "no-labels",
        "unclosed",
        "empty-label",
        "space-before-bracket",
        "empty-entry",
        "string",
        "object",
    ],
)
def test_monitoring_label_allowlist_kube_state_metrics_cannot_read_is_refused(
    allowlist: Any,
) -> None:
    assert _problems({"metricLabelsAllowlist": allowlist}) == [
        f"{KEY}.metricLabelsAllowlist: got {allowlist!r}; {ALLOWED}"
    ]


def test_monitoring_label_allowlist_needs_kube_state_metrics_values_as_an_object() -> None:
    assert _problems(["nodes=[zone]"]) == [
        f"{KEY}: got ['nodes=[zone]']; expected an object of chart values"
    ]


@pytest.mark.parametrize(
    "allowlist",
    [
        [],
        ["nodes=[topology.kubernetes.io/zone]"],
        ["nodes=[topology.kubernetes.io/zone,kubernetes.io/os],pods=[app]"],
        ["pods=[*]", "nodes=[]"],
    ],
)
def test_monitoring_label_allowlist_kube_state_metrics_reads_is_accepted(
    allowlist: list[str],
) -> None:
    values = {"kube-state-metrics": {"metricLabelsAllowlist": allowlist}}
    config = parse_stack_config({"monitoring": {"values": values}})
    assert config.monitoring.values == values
