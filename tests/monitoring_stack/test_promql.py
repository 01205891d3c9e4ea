"""The GPU dashboard and alert rules, checked with Prometheus' own code.

- promtool (tools/go/promtool, Prometheus 3.15.0): `check rules` and `test rules` on the rules
  exactly as MonitoringStack renders them, and `test rules` on dashboard panels (promql_expr_test
  on each panel's query as Grafana sends it) with series written as Prometheus stores them;
- promql-metrics (same module): Prometheus' PromQL parser on every dashboard expression,
  reporting the metric names each one selects, which must all be in tests/monitoring_stack/fixtures/metrics.yaml.

Rules and dashboard are rendered for every kind of GPU resource at once (TEST_RESOURCES: whole
GPUs, time-slicing renamed, MIG mixed); no one stack has the last two together, and what holds
for the three holds for each.

Both are built by tools/build-tools.sh; without them these tests skip (and fail under CI=true).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.gpu_resources import GpuResources
from components.monitoring_stack.manifests import (
    DASHBOARD_FILE,
    GATE_RULES_FILE,
    RULES_FILE,
    gate_rule_groups,
    gpu_dashboard,
    kube_state_metrics_label,
    load_dashboard,
    rule_groups,
    stack_values,
)
from components.monitoring_stack.settings import (
    KUBE_STATE_METRICS,
    LABELS_ALLOWLIST,
    MonitoringStackSettings,
    parse_labels_allowlist,
)
from tests.integration.conftest import built_tool

REPO = Path(__file__).resolve().parents[2]
RULES_TEST_FILE = RULES_FILE.with_name("gpu.rules.test.yaml")
METRICS_FIXTURE = Path(__file__).resolve().parent / "fixtures" / "metrics.yaml"
TEST_RESOURCES = GpuResources(
    names=("nvidia.com/gpu", "nvidia.com/gpu.shared"), prefixes=("nvidia.com/mig-",)
)
# dcgm-exporter's series as Prometheus stores them under the stack's ServiceMonitor
# (honorLabels false): the target's pod/namespace/container are the exporter pod's, and the
# exporter's own labels for the workload using a GPU are renamed exported_* on conflict.
# Ref: https://github.com/prometheus/prometheus/blob/v3.15.0/scrape/scrape.go (mutateSampleLabels)
EXPORTER = (
    'job="dcgm-exporter", pod="nvidia-dcgm-exporter-7k2xq", namespace="gpu-operator", '
    'container="nvidia-dcgm-exporter"'
)
WORKLOAD = 'exported_pod="train-0", exported_namespace="ml", exported_container="main"'
# A series selector (metric{matchers}) and a matcher on a kube-state-metrics `label_*` label.
_SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}")
_KSM_LABEL_MATCHER = re.compile(r"\b(label_[a-zA-Z0-9_]+)\s*(?:=~|!~|!=|=)")


@pytest.fixture(scope="module")
def promtool() -> Path:
    return built_tool("promtool")


@pytest.fixture(scope="module")
def promql_metrics() -> Path:
    return built_tool("promql-metrics")


def _run(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _parse(promql_metrics: Path, expressions: list[str]) -> list[dict[str, Any]]:
    """Prometheus' parser on each expression: [{expr, error, metrics}]."""
    result = _run(promql_metrics, stdin=json.dumps(expressions))
    assert result.returncode == 0, result.stderr
    return list(json.loads(result.stdout))


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # collapsed rows hold their panels
    return panels


def dashboard_expressions(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression in the dashboard: panel targets and variable selectors."""
    expressions = [t["expr"] for p in _panels(dashboard) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # Grafana's label_values(<series selector>, <label>): the selector is PromQL.
        query = variable["query"]["query"]
        assert query.startswith("label_values(") and query.endswith(")"), query
        selector, _, label = query[len("label_values(") : -1].rpartition(",")
        assert label.strip(), query
        expressions.append(selector.strip())
    return expressions


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in rule_groups(TEST_RESOURCES) for rule in group["rules"]]


# allocation dra: the DeviceClasses GPUCluster installs, claimed or asked for by name.
DRA_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
DRA_RESOURCES = GpuResources(
    names=tuple(f"deviceclass.resource.kubernetes.io/{c}" for c in DRA_CLASSES), prefixes=()
)


def every_mode_expressions() -> list[str]:
    """The dashboard's and the rules' expressions in both allocation models."""
    groups = rule_groups(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES)
    dashboard = gpu_dashboard(DRA_RESOURCES, allocation="dra", device_classes=DRA_CLASSES)
    return (
        dashboard_expressions(gpu_dashboard(TEST_RESOURCES))
        + rule_expressions()
        + dashboard_expressions(dashboard)
        + [rule["expr"] for group in groups for rule in group["rules"]]
    )


def _rendered_rules(tmp_path: Path, rules_text: str | None = None) -> Path:
    """The rules as the stack deploys them (TEST_RESOURCES) beside a copy of their promtool
    tests; `rules_text` stands in for gpu.rules.yaml. Returns the tests' path."""
    source = RULES_FILE
    if rules_text is not None:
        source = tmp_path / "source.rules.yaml"
        source.write_text(rules_text)
    groups = rule_groups(TEST_RESOURCES, path=source)
    (tmp_path / RULES_FILE.name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(RULES_TEST_FILE, tmp_path / RULES_TEST_FILE.name)
    return tmp_path / RULES_TEST_FILE.name


def _panel_expr(dashboard: dict[str, Any], title: str, ref_id: str = "A") -> str:
    """A panel query as Grafana sends it with every node selected: `$node` is the variable's
    allValue, a constant variable its value."""
    (expr,) = [
        t["expr"]
        for p in _panels(dashboard)
        if p["title"] == title
        for t in p["targets"]
        if t["refId"] == ref_id
    ]
    return _interpolate(dashboard, str(expr))


def _interpolate(dashboard: dict[str, Any], expr: str) -> str:
    values: dict[str, str] = {}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "constant":
            values[variable["name"]] = variable["query"]
        elif variable["type"] == "query" and variable.get("includeAll"):
            values[variable["name"]] = variable["allValue"]
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, expr
    return expr


def _promtool_expr(
    promtool: Path,
    tmp_path: Path,
    series: dict[str, str],
    expr: str,
    expected: dict[str, float],
    eval_time: str = "1m",
) -> subprocess.CompletedProcess[str]:
    """promtool's promql_expr_test: `expr` over `series` (selector: values) at `eval_time`
    gives exactly `expected` (labels: value)."""
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": eval_time,
                        "exp_samples": [{"labels": k, "value": v} for k, v in expected.items()],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "panel.test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return _run(promtool, "test", "rules", path)


def _fixture_metrics() -> dict[str, dict[str, str]]:
    return dict(yaml.safe_load(METRICS_FIXTURE.read_text())["metrics"])


def test_promql_dashboard_json_loads_with_targets_and_unique_ids() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] == load_dashboard()["uid"]
    panels = _panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["expr"].strip() for t in panel["targets"])


def test_promql_every_dashboard_expression_parses(promql_metrics: Path) -> None:
    expressions = dashboard_expressions(gpu_dashboard(TEST_RESOURCES))
    assert len(expressions) >= 10
    failures = [r for r in _parse(promql_metrics, expressions) if r["error"]]
    assert failures == []


def test_promql_every_rule_expression_parses(promql_metrics: Path) -> None:
    results = _parse(promql_metrics, rule_expressions())
    assert len(results) == 7
    assert [r for r in results if r["error"]] == []


def test_promql_parser_rejects_broken_expressions(promql_metrics: Path) -> None:
    results = _parse(
        promql_metrics,
        [
            "sum by (node) (DCGM_FI_DEV_GPU_UTIL",
            "max_over_time(DCGM_FI_DEV_XID_ERRORS[5m)",
            'DCGM_FI_DEV_GPU_TEMP{node=~"$node"} >',
        ],
    )
    assert all(r["error"] for r in results), results


def test_promql_parser_reports_selected_metrics(promql_metrics: Path) -> None:
    (result,) = _parse(
        promql_metrics,
        ['sum by (node) (a_metric{x="1"}) / on (node) {__name__="b_metric"} + rate(c_metric[5m])'],
    )
    assert result == {
        "expr": result["expr"],
        "error": "",
        "metrics": ["a_metric", "b_metric", "c_metric"],
    }


def test_promql_dashboard_and_rules_use_only_known_metrics(promql_metrics: Path) -> None:
    known = _fixture_metrics()
    results = _parse(promql_metrics, every_mode_expressions())
    unknown = {(m, r["expr"]) for r in results for m in r["metrics"] if m not in known}
    assert unknown == set()


def test_promql_metrics_fixture_lists_only_used_metrics_with_a_source(
    promql_metrics: Path,
) -> None:
    results = _parse(promql_metrics, every_mode_expressions())
    used = {m for r in results for m in r["metrics"]}
    known = _fixture_metrics()
    assert set(known) == used
    # prometheus: `up`, the scrape's own series (the absence alerts).
    assert {entry["source"] for entry in known.values()} == {
        "dcgm-exporter",
        "kube-state-metrics",
        "kube-state-metrics custom resource state",
        "prometheus",
    }


def _selected_ksm_labels(expressions: list[str]) -> dict[str, set[str]]:
    """metric -> the kube-state-metrics `label_*` labels the expressions match on it."""
    selected: dict[str, set[str]] = {}
    for expr in expressions:
        for metric, matchers in _SELECTOR.findall(expr):
            labels = set(_KSM_LABEL_MATCHER.findall(matchers))
            if labels:
                selected.setdefault(metric, set()).update(labels)
    return selected


@pytest.mark.parametrize(
    "values",
    [
        {},
        {KUBE_STATE_METRICS: {LABELS_ALLOWLIST: ["nodes=[topology.kubernetes.io/zone]"]}},
        {KUBE_STATE_METRICS: {LABELS_ALLOWLIST: ["pods=[app]", "nodes=[kubernetes.io/os]"]}},
    ],
    ids=["default", "user-node-labels", "user-pod-and-node-labels"],
)
def test_promql_node_labels_the_alerts_select_are_allow_listed_in_the_chart_values(
    values: dict[str, Any],
) -> None:
    """kube_node_labels carries a node label only when kube-state-metrics allow-lists it: every
    label_* the rules and dashboard select is in the allowlist the stack hands to the chart,
    with or without the user's own entries in monitoring.values."""
    known = _fixture_metrics()
    selected = _selected_ksm_labels(
        rule_expressions() + dashboard_expressions(gpu_dashboard(TEST_RESOURCES))
    )
    assert selected, "no rule selects a kube-state-metrics label_* label"
    chart = stack_values(MonitoringStackSettings(values=values), "s")[KUBE_STATE_METRICS]
    allowlist = parse_labels_allowlist(chart[LABELS_ALLOWLIST])
    for metric, labels in selected.items():
        resource = known[metric].get("allowlist")
        assert resource, (
            f"{metric}: tests/monitoring_stack/fixtures/metrics.yaml names no allowlist resource"
        )
        exported = {kube_state_metrics_label(key) for key in allowlist.get(resource, [])}
        assert labels <= exported, (metric, chart[LABELS_ALLOWLIST])


def test_promql_dashboard_shows_the_gpu_views(promql_metrics: Path) -> None:
    results = _parse(promql_metrics, dashboard_expressions(gpu_dashboard(TEST_RESOURCES)))
    used = {m for r in results for m in r["metrics"]}
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "kube_node_status_allocatable",
        "kube_pod_container_resource_requests",
    } <= used


def test_promql_promtool_checks_the_rules_as_deployed(promtool: Path, tmp_path: Path) -> None:
    rules = _rendered_rules(tmp_path).with_name(RULES_FILE.name)
    result = _run(promtool, "check", "rules", "--lint=all", "--lint-fatal", rules)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_promql_promtool_unit_tests_fire_each_alert(promtool: Path, tmp_path: Path) -> None:
    result = _run(promtool, "test", "rules", _rendered_rules(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promql_promtool_unit_tests_catch_a_changed_threshold(
    promtool: Path, tmp_path: Path
) -> None:
    changed = RULES_FILE.read_text().replace(
        "(DCGM_FI_DEV_GPU_TEMP) > 85", "(DCGM_FI_DEV_GPU_TEMP) > 95"
    )
    assert changed != RULES_FILE.read_text()
    result = _run(promtool, "test", "rules", _rendered_rules(tmp_path, changed))
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


def test_promql_promtool_unit_tests_catch_alerts_on_nodes_taken_out_on_purpose(
    promtool: Path, tmp_path: Path
) -> None:
    """Without the clause that leaves out a node labelled nvidia.com/gpu.deploy.operands=false,
    the promtool tests fail on each alert that would fire for good on such a node."""
    clause = re.compile(r"\n\s*unless on \(node\)\n\s*kube_node_labels\{\$operands_disabled\}")
    changed, removed = clause.subn("", RULES_FILE.read_text())
    assert removed == 3
    result = _run(promtool, "test", "rules", _rendered_rules(tmp_path, changed))
    assert result.returncode != 0
    for alert in (
        "GpuNodeNoAllocatableGpus",
        "GpuNodeMetricsMissing",
        "DcgmExporterTargetsMissing",
    ):
        assert f"alertname: {alert}" in result.stdout + result.stderr, alert


def test_promql_promtool_checks_the_gate_rules_as_deployed(promtool: Path, tmp_path: Path) -> None:
    # The recording rule that publishes the certificate's expiry, and the alerts on it.
    deployed = tmp_path / "gate.rules.yaml"
    deployed.write_text(yaml.safe_dump({"groups": gate_rule_groups("2028-11-23T11:00:00Z")}))
    result = _run(promtool, "check", "rules", "--lint=all", "--lint-fatal", deployed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 3 rules found" in result.stdout


def test_promql_promtool_gate_alerts_fire_before_the_certificate_expires(
    promtool: Path,
) -> None:
    result = _run(promtool, "test", "rules", GATE_RULES_FILE.with_name("gate.rules.test.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# The dashboard's panels, evaluated by promtool on series written as Prometheus stores them.


def test_promql_per_pod_panels_leave_idle_gpus_out(promtool: Path, tmp_path: Path) -> None:
    """GPU 0 runs ml/train-0, GPU 1 is idle: its series carry only the exporter pod's labels,
    which must not show up as a workload."""
    dashboard = gpu_dashboard(TEST_RESOURCES)
    busy = f'node="gpu-1", gpu="0", UUID="GPU-a", {EXPORTER}, {WORKLOAD}'
    idle = f'node="gpu-1", gpu="1", UUID="GPU-b", {EXPORTER}'
    series = {
        f"DCGM_FI_DEV_GPU_UTIL{{{busy}}}": "80x2",
        f"DCGM_FI_DEV_GPU_UTIL{{{idle}}}": "0x2",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{busy}}}": "0.75x2",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{idle}}}": "0x2",
        f"DCGM_FI_DEV_FB_USED{{{busy}}}": "30000x2",
        f"DCGM_FI_DEV_FB_USED{{{idle}}}": "0x2",
    }
    workload = '{exported_namespace="ml", exported_pod="train-0"}'
    for title, value in [
        ("GPU utilisation per pod", 80.0),
        ("Framebuffer memory used per pod", 30000.0),
    ]:
        expr = _panel_expr(dashboard, title)
        result = _promtool_expr(promtool, tmp_path, series, expr, {workload: value})
        assert result.returncode == 0, f"{title}: {result.stdout}{result.stderr}"


def test_promql_utilisation_panels_show_mig_gpus(promtool: Path, tmp_path: Path) -> None:
    """A MIG-enabled GPU has no DCGM_FI_DEV_GPU_UTIL, only DCGM_FI_PROF_GR_ENGINE_ACTIVE per
    GPU instance; a whole GPU has both, and its GPU_UTIL is the one shown."""
    dashboard = gpu_dashboard(TEST_RESOURCES)
    whole = f'node="gpu-1", gpu="0", UUID="GPU-a", {EXPORTER}, {WORKLOAD}'
    mig = f'node="gpu-2", gpu="0", UUID="GPU-c", {EXPORTER}, GPU_I_PROFILE="3g.40gb"'
    series = {
        f"DCGM_FI_DEV_GPU_UTIL{{{whole}}}": "50x2",
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{whole}}}": "0.6x2",
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig}, GPU_I_ID="1", exported_pod="a", '
        'exported_namespace="ml"}': "0.2x2",
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{mig}, GPU_I_ID="2", exported_pod="b", '
        'exported_namespace="ml"}': "0.4x2",
    }
    per_node = _panel_expr(dashboard, "GPU utilisation per node")
    result = _promtool_expr(
        promtool, tmp_path, series, per_node, {'{node="gpu-1"}': 50.0, '{node="gpu-2"}': 30.0}
    )
    assert result.returncode == 0, result.stdout + result.stderr
    per_pod = _panel_expr(dashboard, "GPU utilisation per pod")
    expected = {
        '{exported_namespace="ml", exported_pod="train-0"}': 50.0,
        '{exported_namespace="ml", exported_pod="a"}': 20.0,
        '{exported_namespace="ml", exported_pod="b"}': 40.0,
    }
    result = _promtool_expr(promtool, tmp_path, series, per_pod, expected)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promql_capacity_panels_count_every_gpu_resource(promtool: Path, tmp_path: Path) -> None:
    """Whole, time-sliced (renamed) and MIG GPUs each appear, per node and resource."""
    dashboard = gpu_dashboard(TEST_RESOURCES)
    series: dict[str, str] = {
        'kube_node_status_allocatable{node="cpu-1", resource="cpu", unit="core"}': "16x2"
    }
    used = {
        ("gpu-1", "nvidia_com_gpu"): (8, 2),
        ("gpu-2", "nvidia_com_gpu_shared"): (32, 1),
        ("gpu-3", "nvidia_com_mig_1g_10gb"): (7, 3),
    }
    for (node, resource), (allocatable, requested) in used.items():
        pod = f'namespace="ml", pod="on-{node}", uid="{node}"'
        series[
            f'kube_node_status_allocatable{{node="{node}", resource="{resource}", unit="integer"}}'
        ] = f"{allocatable}x2"
        series[
            f'kube_pod_container_resource_requests{{{pod}, container="main", node="{node}", '
            f'resource="{resource}", unit="integer"}}'
        ] = f"{requested}x2"
        series[f'kube_pod_status_phase{{{pod}, phase="Running"}}'] = "1x2"

    def per_resource(values: dict[tuple[str, str], int]) -> dict[str, float]:
        return {f'{{node="{n}", resource="{r}"}}': float(v) for (n, r), v in values.items()}

    for title, ref_id, expected in [
        (
            "Free GPUs per node and resource",
            "A",
            per_resource({k: a - r for k, (a, r) in used.items()}),
        ),
        (
            "Allocated vs allocatable GPUs per node and resource",
            "A",
            per_resource({k: a for k, (a, _) in used.items()}),
        ),
        (
            "Allocated vs allocatable GPUs per node and resource",
            "B",
            per_resource({k: r for k, (_, r) in used.items()}),
        ),
    ]:
        expr = _panel_expr(dashboard, title, ref_id)
        result = _promtool_expr(promtool, tmp_path, series, expr, expected)
        assert result.returncode == 0, f"{title} {ref_id}: {result.stdout}{result.stderr}"
    # The node variable lists the three GPU nodes, not the CPU one.
    (variable,) = [v for v in dashboard_expressions(dashboard) if v.startswith("kube_node_status")]
    nodes = f"group by (node) ({_interpolate(dashboard, variable)})"
    expected_nodes = {f'{{node="{n}"}}': 1.0 for n in ("gpu-1", "gpu-2", "gpu-3")}
    result = _promtool_expr(promtool, tmp_path, series, nodes, expected_nodes)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promql_framebuffer_panels_are_in_mebibytes() -> None:
    """DCGM's FB_USED/FB_FREE are MiB: Grafana's `mbytes`, not the SI `decmbytes`."""
    framebuffer = [
        p
        for p in _panels(load_dashboard())
        if any("DCGM_FI_DEV_FB_" in t["expr"] for t in p["targets"])
    ]
    assert len(framebuffer) == 2
    assert {p["fieldConfig"]["defaults"]["unit"] for p in framebuffer} == {"mbytes"}
