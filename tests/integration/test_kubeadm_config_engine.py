"""KubeadmConfig under the real Pulumi engine, against the harness's kube-apiserver.

The engine serializes the provider into pulumi-resource-pulumi-python and calls check, diff,
create, update and delete with its own state: the gate check at preview, a second `up` that
changes nothing, an update in place, and a destroy that leaves the ConfigMap as it was. Two
stacks on one cluster share what they both want until the last one is destroyed, and a
stack wanting a gate at the value another stack set otherwise is refused at preview.
The remote commands of the layer need pulumi-command, which cannot be built here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from kubernetes import client
from pulumi import automation as auto

from components.providers.kubeadm_config import KubeadmConfig
from tests.integration.conftest import require_tools
from tests.integration.test_kubeadm_config_live import CLUSTER_CONFIGURATION
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.pulumi_engine import PULUMI_ENGINE_TOOLS, inline_stack, use_cluster


def _program(plugins: list[str], gates: dict[str, bool], stack: str) -> auto.PulumiFn:
    def program() -> None:
        config = KubeadmConfig(
            "kubeadm-config",
            stack=stack,
            admission_plugins=plugins,
            feature_gates=gates,
        )
        pulumi.export("gates", config.gates)
        pulumi.export("notes", config.notes)

    return program


class Engine:
    def __init__(self, cp: LocalControlPlane, state_dir: Path) -> None:
        self.cp = cp
        self.state_dir = state_dir
        self.api = cp.api_client()
        self.core = client.CoreV1Api(self.api)

    def stack(self, plugins: list[str], gates: dict[str, bool], name: str = "engine") -> auto.Stack:
        """The Pulumi stack `name`, whose KubeadmConfig records itself under the same name."""
        stack = inline_stack(
            "gpu-cluster-kubeadm", name, _program(plugins, gates, name), self.state_dir
        )
        use_cluster(stack, self.cp.kubeconfig_yaml())
        return stack

    def document(self) -> dict[str, Any]:
        cm = self.core.read_namespaced_config_map("kubeadm-config", "kube-system")
        assert cm.data is not None
        return dict(yaml.safe_load(cm.data["ClusterConfiguration"]))

    def api_server_args(self) -> dict[str, str]:
        extra = self.document()["apiServer"]["extraArgs"]
        return {e["name"]: e["value"] for e in extra}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    require_tools(*CONTROL_PLANE_TOOLS, *PULUMI_ENGINE_TOOLS)
    with LocalControlPlane() as cp:
        result = Engine(cp, tmp_path_factory.mktemp("pulumi-kubeadm"))
        result.core.create_namespaced_config_map(
            "kube-system",
            client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name="kubeadm-config"),
                data={"ClusterConfiguration": CLUSTER_CONFIGURATION},
            ),
        )
        try:
            yield result
        finally:
            result.api.close()


def test_kubeadm_config_engine_up_rerun_update_destroy(engine: Engine) -> None:
    gates = {"CPUManagerPolicyBetaOptions": True, "InPlacePodVerticalScaling": True}
    stack = engine.stack(["ExtendedResourceToleration"], gates)
    first = stack.up()
    assert first.summary.resource_changes == {"create": 2}
    assert first.outputs["gates"].value == {"CPUManagerPolicyBetaOptions": True}
    assert first.outputs["notes"].value == {
        "InPlacePodVerticalScaling": "GA and locked to true: nothing to set"
    }
    assert engine.api_server_args()["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )

    # No credentials in the state: the provider reads them from the run's stack config.
    (state,) = engine.state_dir.glob("backend/.pulumi/stacks/**/engine.json")
    text = state.read_text()
    resources = json.loads(text)["checkpoint"]["latest"]["resources"]
    (config,) = [r for r in resources if r["type"].endswith(":KubeadmConfig")]
    for side in ("inputs", "outputs"):
        assert not {"kubeconfig", "context"} & set(config[side]), side
    assert "client-key-data" not in text

    again = stack.up()
    assert again.summary.resource_changes == {"same": 2}

    # Rotated credentials (another user of the same cluster) are no change to the stack.
    rotated = yaml.safe_load(engine.cp.kubeconfig_yaml())
    rotated["users"][0]["name"] = rotated["contexts"][0]["context"]["user"] = "rotated"
    use_cluster(stack, yaml.safe_dump(rotated))
    assert stack.preview().change_summary == {"same": 2}

    updated = engine.stack([], {"CPUManagerPolicyBetaOptions": False}).up()
    assert updated.summary.resource_changes == {"same": 1, "update": 1}
    args = engine.api_server_args()
    assert args["enable-admission-plugins"] == "NodeRestriction"
    assert args["feature-gates"] == "CPUManagerPolicyBetaOptions=false"

    stack.destroy()
    assert engine.document() == yaml.safe_load(CLUSTER_CONFIGURATION)


def test_kubeadm_config_engine_preview_refuses_an_unknown_gate(engine: Engine) -> None:
    before = engine.document()
    stack = engine.stack([], {"NoSuchGate": True})
    with pytest.raises(auto.CommandError) as excinfo:
        stack.preview()
    assert "feature gate 'NoSuchGate' is unknown to the API server" in str(excinfo.value)
    assert engine.document() == before


def test_kubeadm_config_engine_two_stacks_share_items_until_neither_wants_them(
    engine: Engine,
) -> None:
    gates = {"CPUManagerPolicyBetaOptions": True}
    first = engine.stack(["ExtendedResourceToleration"], gates, name="engine-a")
    second = engine.stack(["ExtendedResourceToleration"], gates, name="engine-b")
    try:
        first.up()
        second.up()
        first.destroy()
        args = engine.api_server_args()
        assert args["enable-admission-plugins"] == "NodeRestriction,ExtendedResourceToleration"
        assert args["feature-gates"] == "CPUManagerPolicyBetaOptions=true"
        assert "CPUManagerPolicyBetaOptions=true" in json.dumps(engine.document()["scheduler"])

        second.destroy()
        assert engine.document() == yaml.safe_load(CLUSTER_CONFIGURATION)
    finally:  # the module's ConfigMap as it was for the other tests, whatever failed
        first.destroy()
        second.destroy()


def test_kubeadm_config_engine_preview_refuses_a_gate_another_stack_set_otherwise(
    engine: Engine,
) -> None:
    first = engine.stack([], {"CPUManagerPolicyBetaOptions": True}, name="engine-a")
    first.up()
    try:
        second = engine.stack([], {"CPUManagerPolicyBetaOptions": False}, name="engine-b")
        with pytest.raises(auto.CommandError) as excinfo:
            second.preview()
        assert (
            "feature-gates item CPUManagerPolicyBetaOptions of apiServer is set to true by stack "
            "engine-a; stack engine-b wants false" in str(excinfo.value)
        )
    finally:
        first.destroy()
    assert engine.document() == yaml.safe_load(CLUSTER_CONFIGURATION)
