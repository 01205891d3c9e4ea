"""CRDs that a chart would install, for the charts whose CRDs the program's own objects need.

kube-prometheus-stack ships the monitoring.coreos.com CRDs; the stack creates a PrometheusRule
and a ServiceMonitor of those kinds. The build renders the same CRDs from the Prometheus
Operator's Go API module with controller-gen (tools/build-tools.sh: monitoring-crds.yaml),
so the API server validates those objects against the real schemas. They are installed when
the release is created and left on delete, as Helm does with a chart's crds/ directory.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import yaml
from kubernetes import client, dynamic

from tools.harness.controlplane import require_tool

from .recorded import ChartCrds

MONITORING_CRDS = "monitoring-crds.yaml"
CHART_CRDS = {"kube-prometheus-stack": MONITORING_CRDS}
FIELD_MANAGER = "helm"


def install_crds(api_client: Any, file_name: str, timeout: float = 60.0) -> list[str]:
    """Apply every CRD of the built file and wait until each is Established; their names."""
    documents = [d for d in yaml.safe_load_all(require_tool(file_name).read_text()) if d]
    api = dynamic.DynamicClient(api_client)
    crds = api.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
    names = []
    for crd in documents:
        crds.server_side_apply(
            body=crd,
            name=crd["metadata"]["name"],
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
        )
        names.append(crd["metadata"]["name"])
    ext = client.ApiextensionsV1Api(api_client)
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            status: Any = ext.read_custom_resource_definition(name).status
            if any(c.type == "Established" and c.status == "True" for c in status.conditions or []):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"CRD {name} not Established after {timeout:.0f} s")
            time.sleep(0.2)
    return names


def chart_crds(api_client: Callable[[], Any]) -> ChartCrds:
    """Chart name -> a function that installs that chart's CRDs on the cluster."""

    def installer(file_name: str) -> Callable[[], None]:
        def install() -> None:
            install_crds(api_client(), file_name)

        return install

    return {chart: installer(file_name) for chart, file_name in CHART_CRDS.items()}
