"""The GPU dashboard and alert rules, checked with Prometheus' own code.

- promtool (tools/go/promtool, Prometheus 3.15.0): `check rules` and `test rules` on the exact
  files MonitoringStack deploys;
- promql-metrics (same module): Prometheus' PromQL parser on every dashboard expression,
  reporting the metric names each one selects, which must all be in tests/fixtures/metrics.yaml.

Both are built by tools/build-tools.sh; without them these tests skip (and fail under CI=true).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.monitoring_stack import (
    DASHBOARD_FILE,
    GATE_RULES_FILE,
    RULES_FILE,
    gate_rule_groups,
    load_dashboard,
)
from tests.integration.conftest import built_tool

REPO = Path(__file__).resolve().parent.parent
RULES_TEST_FILE = RULES_FILE.with_name("gpu.rules.test.yaml")
METRICS_FIXTURE = REPO / "tests" / "fixtures" / "metrics.yaml"


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
    groups = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


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
    expressions = dashboard_expressions(load_dashboard())
    assert len(expressions) >= 10
    failures = [r for r in _parse(promql_metrics, expressions) if r["error"]]
    assert failures == []


def test_promql_every_rule_expression_parses(promql_metrics: Path) -> None:
    results = _parse(promql_metrics, rule_expressions())
    assert len(results) == 4
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
    results = _parse(promql_metrics, dashboard_expressions(load_dashboard()) + rule_expressions())
    unknown = {(m, r["expr"]) for r in results for m in r["metrics"] if m not in known}
    assert unknown == set()


def test_promql_metrics_fixture_lists_only_used_metrics_with_a_source(
    promql_metrics: Path,
) -> None:
    results = _parse(promql_metrics, dashboard_expressions(load_dashboard()) + rule_expressions())
    used = {m for r in results for m in r["metrics"]}
    known = _fixture_metrics()
    assert set(known) == used
    assert {entry["source"] for entry in known.values()} == {"dcgm-exporter", "kube-state-metrics"}


def test_promql_dashboard_shows_the_gpu_views(promql_metrics: Path) -> None:
    results = _parse(promql_metrics, dashboard_expressions(load_dashboard()))
    used = {m for r in results for m in r["metrics"]}
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
        "kube_node_status_allocatable",
        "kube_pod_container_resource_requests",
    } <= used


def test_promql_promtool_checks_the_rules_file(promtool: Path) -> None:
    result = _run(promtool, "check", "rules", "--lint=all", "--lint-fatal", RULES_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 4 rules found" in result.stdout


def test_promql_promtool_unit_tests_fire_each_alert(promtool: Path) -> None:
    result = _run(promtool, "test", "rules", RULES_TEST_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promql_promtool_unit_tests_catch_a_changed_threshold(
    promtool: Path, tmp_path: Path
) -> None:
    changed = RULES_FILE.read_text().replace(
        "(DCGM_FI_DEV_GPU_TEMP) > 85", "(DCGM_FI_DEV_GPU_TEMP) > 95"
    )
    assert changed != RULES_FILE.read_text()
    (tmp_path / RULES_FILE.name).write_text(changed)
    shutil.copy(RULES_TEST_FILE, tmp_path / RULES_TEST_FILE.name)
    result = _run(promtool, "test", "rules", tmp_path / RULES_TEST_FILE.name)
    assert result.returncode != 0
    assert "GpuTemperatureHigh" in result.stdout + result.stderr


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
