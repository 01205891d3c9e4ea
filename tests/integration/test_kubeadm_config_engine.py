"""KubeadmConfig under the real Pulumi engine, against the harness's kube-apiserver.

The engine serializes the provider into pulumi-resource-pulumi-python and calls check, diff,
create, update and delete with its own state: the gate check at preview, a second `up` that
changes nothing, an update in place, and a destroy that leaves the ConfigMap as it was. Two
stacks on one cluster share what they both want until the last one is destroyed, and a
stack wanting a gate at the value another stack set otherwise is refused at preview.
A stack whose state and record an earlier version keyed by the stack's name continues: the
next `up` moves the record to the stack's id. The remote commands of the layer run in
test_control_plane_rename_engine.py.
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

from components.control_plane_features.provider import (
    ANNOTATION_PREFIX,
    LABEL_PREFIX,
    KubeadmConfig,
)
from components.providers.node_api import stack_identity, stack_label
from tests.integration.conftest import require_tools
from tests.integration.test_kubeadm_config_live import CLUSTER_CONFIGURATION
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane
from tools.harness.pulumi_engine import PULUMI_ENGINE_TOOLS, inline_stack, use_cluster


def _program(plugins: list[str], gates: dict[str, bool]) -> auto.PulumiFn:
    def program() -> None:
        config = KubeadmConfig(
            "kubeadm-config",
            stack=stack_identity(),
            label=stack_label(),
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
        """The Pulumi stack `name`, whose KubeadmConfig records itself under the stack's id."""
        stack = inline_stack("gpu-cluster-kubeadm", name, _program(plugins, gates), self.state_dir)
        use_cluster(stack, self.cp.kubeconfig_yaml())
        return stack

    def document(self) -> dict[str, Any]:
        cm = self.core.read_namespaced_config_map("kubeadm-config", "kube-system")
        assert cm.data is not None
        return dict(yaml.safe_load(cm.data["ClusterConfiguration"]))

    def annotations(self) -> dict[str, str]:
        cm = self.core.read_namespaced_config_map("kubeadm-config", "kube-system")
        return dict((cm.metadata.annotations if cm.metadata else None) or {})

    def stack_id(self, label: str) -> str:
        """The id of the stack whose record is labelled `label` on the ConfigMap."""
        annotations = self.annotations()
        (key,) = [k for k, v in annotations.items() if k.startswith(LABEL_PREFIX) and v == label]
        return key.rsplit("/", 1)[1]

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
    assert first.summary.resource_changes == {"create": 3}  # the stack, its id, the edit
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
    assert again.summary.resource_changes == {"same": 3}

    # Rotated credentials (another user of the same cluster) are no change to the stack.
    rotated = yaml.safe_load(engine.cp.kubeconfig_yaml())
    rotated["users"][0]["name"] = rotated["contexts"][0]["context"]["user"] = "rotated"
    use_cluster(stack, yaml.safe_dump(rotated))
    assert stack.preview().change_summary == {"same": 3}

    updated = engine.stack([], {"CPUManagerPolicyBetaOptions": False}).up()
    assert updated.summary.resource_changes == {"same": 2, "update": 1}
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
        # engine-b's id is minted by its first `up`: its preview names it by its label.
        first_id = engine.stack_id("organization/gpu-cluster-kubeadm/engine-a")
        assert (
            "feature-gates item CPUManagerPolicyBetaOptions of apiServer is set to true by stack "
            f"organization/gpu-cluster-kubeadm/engine-a (stack id {first_id}); stack "
            "organization/gpu-cluster-kubeadm/engine-b wants false" in str(excinfo.value)
        )
    finally:
        first.destroy()
    assert engine.document() == yaml.safe_load(CLUSTER_CONFIGURATION)


def test_kubeadm_config_engine_adopts_a_record_keyed_by_the_stack_name(engine: Engine) -> None:
    gates = {"CPUManagerPolicyBetaOptions": True}
    stack = engine.stack(["ExtendedResourceToleration"], gates, name="engine-named")
    try:
        stack.up()
        # The state and the ConfigMap as an earlier version left them: keyed by the stack's
        # name, no label beside the record.
        label = "organization/gpu-cluster-kubeadm/engine-named"
        stack_id = engine.stack_id(label)
        deployment = stack.export_stack()
        for resource in dict(deployment.deployment or {})["resources"]:
            if resource["type"].endswith(":KubeadmConfig"):
                for side in ("inputs", "outputs"):
                    resource[side]["stack"] = "engine-named"
                    resource[side].pop("label", None)
                    resource[side].pop("former", None)
        stack.import_stack(deployment)
        record = engine.annotations()[f"{ANNOTATION_PREFIX}/{stack_id}"]
        engine.core.patch_namespaced_config_map(
            "kubeadm-config",
            "kube-system",
            {
                "metadata": {
                    "annotations": {
                        f"{ANNOTATION_PREFIX}/{stack_id}": None,
                        f"{LABEL_PREFIX}/{stack_id}": None,
                        f"{ANNOTATION_PREFIX}/engine-named": record,
                    }
                }
            },
        )

        # The next `up`, without the plugin: adopted, then what it no longer wants goes.
        engine.stack([], gates, name="engine-named").up()
        assert set(engine.annotations()) == {
            f"{ANNOTATION_PREFIX}/{stack_id}",
            f"{LABEL_PREFIX}/{stack_id}",
        }
        assert engine.api_server_args()["enable-admission-plugins"] == "NodeRestriction"

        stack.destroy()
        assert engine.document() == yaml.safe_load(CLUSTER_CONFIGURATION)
    finally:
        stack.destroy()
