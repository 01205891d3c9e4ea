"""Where a chart comes from: a chart repository, an OCI registry or a local copy (air-gapped)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.charts import helm_chart
from stack_config import parse_stack_config
from tests.conftest import run_program

RELEASE = "monitoring-release"


def test_a_repository_url_names_the_chart_in_its_index() -> None:
    assert helm_chart("gpu-operator", "https://helm.ngc.nvidia.com/nvidia", "v26.3.3") == {
        "chart": "gpu-operator",
        "version": "v26.3.3",
        "repository_opts": {"repo": "https://helm.ngc.nvidia.com/nvidia"},
    }


def test_an_oci_registry_holds_the_chart_under_its_path() -> None:
    assert helm_chart("gpu-operator", "oci://registry.lab/charts/", "v26.3.3") == {
        "chart": "oci://registry.lab/charts/gpu-operator",
        "version": "v26.3.3",
    }


def test_a_local_copy_is_the_chart_itself() -> None:
    source = "charts/gpu-operator-v26.3.3.tgz"
    assert helm_chart("gpu-operator", source, "v26.3.3") == {"chart": source}


def _monitoring(repository: str) -> dict[str, Any]:
    return {
        "enabled": True,
        "grafanaAdminSecret": "grafana-admin",
        "createNamespace": False,
        "repository": repository,
    }


def test_config_refuses_a_local_chart_that_is_not_there(tmp_path: Path) -> None:
    missing = str(tmp_path / "kube-prometheus-stack-88.2.0.tgz")
    with pytest.raises(Exception) as refused:
        parse_stack_config({"monitoring": _monitoring(missing)})
    assert f"gpu-cluster:monitoring.repository: got '{missing}'" in str(refused.value)
    assert "local chart archive (.tgz) or chart directory" in str(refused.value)


@pytest.mark.usefixtures("empty_kubeconfig_env")
def test_program_installs_a_local_chart_directory_without_a_repository(tmp_path: Path) -> None:
    chart = tmp_path / "kube-prometheus-stack"
    chart.mkdir()
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: kube-prometheus-stack\n")
    recording = run_program("dev", {"monitoring": _monitoring(str(chart))})
    inputs = recording.named(RELEASE).inputs
    assert inputs["chart"] == str(chart)
    assert "repositoryOpts" not in inputs
