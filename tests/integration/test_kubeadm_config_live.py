"""KubeadmConfigProvider against the real kube-apiserver: the ConfigMap edit and the gate check.

The provider's check/create/update/delete run as the Pulumi engine would call them, through
the production `KubeConfigMapApi`, on a kube-system/kubeadm-config ConfigMap the test creates
with the ClusterConfiguration kubeadm v1.37 writes (v1beta4).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from components.control_plane_features.provider import (
    ConfigMapApi,
    KubeadmConfigProvider,
    KubeConfigMapApi,
    annotation_key,
    feature_stages,
)
from tests.fake_node_api import configured, stack_config_request
from tools.harness import LocalControlPlane

CLUSTER_CONFIGURATION = """\
apiServer:
  extraArgs:
  - name: authorization-mode
    value: Node,RBAC
  - name: enable-admission-plugins
    value: NodeRestriction
apiVersion: kubeadm.k8s.io/v1beta4
caCertificateValidityPeriod: 87600h0m0s
certificateValidityPeriod: 8760h0m0s
certificatesDir: /etc/kubernetes/pki
clusterName: kubernetes
controlPlaneEndpoint: 10.0.0.11:6443
controllerManager: {}
dns: {}
encryptionAlgorithm: RSA-2048
etcd:
  local:
    dataDir: /var/lib/etcd
imageRepository: registry.k8s.io
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
networking:
  dnsDomain: cluster.local
  serviceSubnet: 10.96.0.0/12
proxy: {}
scheduler: {}
"""


@pytest.fixture
def kubeconfig(control_plane: LocalControlPlane) -> str:
    return control_plane.kubeconfig_yaml()


@pytest.fixture
def core(api_client: Any) -> Iterator[client.CoreV1Api]:
    """CoreV1Api with a fresh kube-system/kubeadm-config, deleted after the test."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(
        "kube-system",
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="kubeadm-config"),
            data={"ClusterConfiguration": CLUSTER_CONFIGURATION},
        ),
    )
    try:
        yield core
    finally:
        core.delete_namespaced_config_map("kubeadm-config", "kube-system")


def _configmap(core: client.CoreV1Api) -> dict[str, Any]:
    response: Any = core.read_namespaced_config_map(
        "kubeadm-config", "kube-system", _preload_content=False
    )
    return dict(json.loads(response.data))


def _document(core: client.CoreV1Api) -> dict[str, Any]:
    return dict(yaml.safe_load(_configmap(core)["data"]["ClusterConfiguration"]))


def _annotations(core: client.CoreV1Api) -> dict[str, str]:
    return dict(_configmap(core)["metadata"].get("annotations") or {})


def _args(core: client.CoreV1Api, component: str) -> dict[str, str]:
    extra = (_document(core).get(component) or {}).get("extraArgs") or []
    return {e["name"]: e["value"] for e in extra}


def _props(**overrides: Any) -> dict[str, Any]:
    return {
        "stack": "live",
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": {},
        "gates": {},
        "notes": {},
        **overrides,
    }


def test_kubeadm_config_live_create_update_delete(core: client.CoreV1Api, kubeconfig: str) -> None:
    provider = KubeadmConfigProvider()
    provider.configure(stack_config_request(kubeconfig))
    gates = {"CPUManagerPolicyBetaOptions": False}
    outs = provider.create(_props(feature_gates=gates, gates=gates)).outs
    assert outs is not None
    assert _args(core, "apiServer")["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )
    assert _args(core, "scheduler") == {"feature-gates": "CPUManagerPolicyBetaOptions=false"}
    assert json.loads(_annotations(core)[annotation_key("live")]) == outs["added"]

    news = _props(admission_plugins=[], feature_gates={}, gates={})
    provider.update("id", outs, news)
    assert _document(core) == yaml.safe_load(CLUSTER_CONFIGURATION)

    provider.delete("id", news)
    assert _document(core) == yaml.safe_load(CLUSTER_CONFIGURATION)
    assert annotation_key("live") not in _annotations(core)


def test_kubeadm_config_live_retries_after_a_concurrent_write(
    core: client.CoreV1Api, kubeconfig: str
) -> None:
    class Interleaved(KubeConfigMapApi):
        """The real API, with someone else's write landing between our read and our write."""

        raced = False

        def merge_patch_configmap(
            self, namespace: str, name: str, patch: dict[str, Any]
        ) -> dict[str, Any]:
            if not self.raced:
                self.raced = True
                doc = _document(core)
                doc["apiServer"]["extraArgs"].append({"name": "audit-log-maxage", "value": "7"})
                core.patch_namespaced_config_map(
                    name, namespace, {"data": {"ClusterConfiguration": yaml.safe_dump(doc)}}
                )
            return super().merge_patch_configmap(namespace, name, patch)

    api = Interleaved(kubeconfig, None)
    provider = configured(KubeadmConfigProvider(lambda _k, _c: api))
    provider.create(_props())
    assert api.raced
    args = _args(core, "apiServer")
    assert args["audit-log-maxage"] == "7"  # the other write survived
    assert args["enable-admission-plugins"] == "NodeRestriction,ExtendedResourceToleration"


def test_kubeadm_config_live_check_reads_the_api_servers_gates(kubeconfig: str) -> None:
    api: ConfigMapApi = KubeConfigMapApi(kubeconfig, None)
    stages = feature_stages(api.metrics())
    # v1.37.2: GA and on, and a beta gate.
    assert stages["InPlacePodVerticalScaling"] == ("", True)
    assert stages["CPUManagerPolicyBetaOptions"][0] == "BETA"
    provider = KubeadmConfigProvider()
    provider.configure(stack_config_request(kubeconfig))
    result = provider.check(
        {},
        _props(
            feature_gates={
                "InPlacePodVerticalScaling": True,
                "CPUManagerPolicyBetaOptions": False,
                "NoSuchGate": True,
            },
        ),
    )
    assert [f.reason for f in result.failures] == [
        f"feature gate 'NoSuchGate' is unknown to the API server {api.server} "
        "(not in its kubernetes_feature_enabled metric)"
    ]
    assert result.inputs["gates"] == {"CPUManagerPolicyBetaOptions": False}
    assert result.inputs["notes"] == {
        "InPlacePodVerticalScaling": "GA and locked to true: nothing to set"
    }
