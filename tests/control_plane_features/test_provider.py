"""KubeadmConfigProvider: the ClusterConfiguration edit, its record, the gate check.

`FakeConfigMapApi` is a small in-memory stand-in for the two ConfigMap calls and /metrics
(merge patch with a resourceVersion precondition and 409 on conflict). It is a fake; the
integration tests run the same provider against a real kube-apiserver.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from pulumi.output import Unknown

from components.control_plane_features.provider import (
    KubeadmConfigProvider,
    annotation_key,
    check_gates,
    feature_stages,
    label_key,
)
from components.providers.node_api import Conflict, NodeApiError
from tests.fake_node_api import configured

V1BETA4 = """\
apiVersion: kubeadm.k8s.io/v1beta4
kind: ClusterConfiguration
kubernetesVersion: v1.37.2
apiServer:
  extraArgs:
  - name: enable-admission-plugins
    value: NodeRestriction
  - name: feature-gates
    value: SomeOtherGate=false
controllerManager: {}
scheduler: {}
networking:
  podSubnet: 10.244.0.0/16
"""

V1BETA3 = """\
apiVersion: kubeadm.k8s.io/v1beta3
kind: ClusterConfiguration
kubernetesVersion: v1.35.4
apiServer:
  extraArgs:
    authorization-mode: Node,RBAC
"""

METRICS = """\
# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="InPlacePodVerticalScaling",stage=""} 1
kubernetes_feature_enabled{name="CPUManagerPolicyBetaOptions",stage="BETA"} 0
kubernetes_feature_enabled{name="SomeAlphaGate",stage="ALPHA"} 0
"""
SERVER = "https://10.0.0.1:6443"


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            target[key] = _merge(dict(target.get(key) or {}), value)
        else:
            target[key] = value
    return target


class FakeConfigMapApi:
    server = SERVER

    def __init__(self, text: str, metrics: str = METRICS) -> None:
        self.cm: dict[str, Any] = {
            "metadata": {
                "name": "kubeadm-config",
                "namespace": "kube-system",
                "resourceVersion": "1",
            },
            "data": {"ClusterConfiguration": text},
        }
        self._metrics = metrics
        self.writes = 0
        self.before_write: Callable[[], None] | None = None

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any]:
        assert (namespace, name) == ("kube-system", "kubeadm-config")
        return copy.deepcopy(self.cm)

    def merge_patch_configmap(
        self, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        if self.before_write:
            hook, self.before_write = self.before_write, None
            hook()
        if patch["metadata"]["resourceVersion"] != self.cm["metadata"]["resourceVersion"]:
            raise Conflict("ConfigMap kube-system/kubeadm-config changed")
        patch = copy.deepcopy(patch)
        patch["metadata"].pop("resourceVersion")
        _merge(self.cm, patch)
        self.cm["metadata"]["resourceVersion"] = str(
            int(self.cm["metadata"]["resourceVersion"]) + 1
        )
        self.writes += 1
        return copy.deepcopy(self.cm)

    def metrics(self) -> str:
        return self._metrics

    def document(self) -> dict[str, Any]:
        return dict(yaml.safe_load(self.cm["data"]["ClusterConfiguration"]))

    def args(self, component: str) -> dict[str, str]:
        extra = (self.document().get(component) or {}).get("extraArgs") or []
        if isinstance(extra, dict):
            return dict(extra)
        return {e["name"]: e["value"] for e in extra}


def _provider(api: FakeConfigMapApi) -> KubeadmConfigProvider:
    return configured(KubeadmConfigProvider(lambda kubeconfig, context: api))


def _create(provider: KubeadmConfigProvider, props: dict[str, Any]) -> dict[str, Any]:
    outs = provider.create(props).outs
    assert outs is not None
    return outs


STACK_ID = "0b7c3e9a41d24f0e8a6f3d2c1b0a9e8f"
"""The stack's id, as node_api.stack_identity mints it."""
LABEL = "organization/gpu-cluster/dev"


def _stack(name: str) -> dict[str, str]:
    """The `stack` and `label` inputs of stack `name` (its id: `id-<name>`)."""
    return {"stack": f"id-{name}", "label": f"organization/gpu-cluster/{name}"}


def _props(**overrides: Any) -> dict[str, Any]:
    return {
        "stack": STACK_ID,
        "label": LABEL,
        "admission_plugins": ["ExtendedResourceToleration"],
        "feature_gates": {"CPUManagerPolicyBetaOptions": True},
        "gates": {"CPUManagerPolicyBetaOptions": True},
        "notes": {},
        **overrides,
    }


def test_kubeadm_config_adds_plugins_to_the_api_server_and_gates_to_three_components() -> None:
    api = FakeConfigMapApi(V1BETA4)
    _create(_provider(api), _props())
    assert api.args("apiServer") == {
        "enable-admission-plugins": "NodeRestriction,ExtendedResourceToleration",
        "feature-gates": "SomeOtherGate=false,CPUManagerPolicyBetaOptions=true",
    }
    for component in ("controllerManager", "scheduler"):
        assert api.args(component) == {"feature-gates": "CPUManagerPolicyBetaOptions=true"}
    # Everything else in the document is untouched.
    assert api.document()["networking"] == {"podSubnet": "10.244.0.0/16"}


def test_kubeadm_config_records_what_it_added_under_the_stack_id_with_its_label() -> None:
    api = FakeConfigMapApi(V1BETA4)
    outs = _create(_provider(api), _props())
    annotations = api.cm["metadata"]["annotations"]
    record = json.loads(annotations[f"kubeadm-config.gpu-cluster.io/{STACK_ID}"])
    assert record == outs["added"]
    assert record["apiServer"] == {
        "enable-admission-plugins": {"ExtendedResourceToleration": None},
        "feature-gates": {"CPUManagerPolicyBetaOptions": None},
    }
    assert annotations[f"stack.kubeadm-config.gpu-cluster.io/{STACK_ID}"] == LABEL
    assert len(annotations) == 2


def test_kubeadm_config_delete_restores_the_document_exactly() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    outs = _create(provider, _props())
    provider.delete("id", outs)
    assert api.document() == yaml.safe_load(V1BETA4)
    assert not api.cm["metadata"].get("annotations")


def test_kubeadm_config_delete_puts_back_a_gate_value_that_was_there_before() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    gates = {"SomeOtherGate": True}
    outs = _create(provider, _props(admission_plugins=[], feature_gates=gates, gates=gates))
    assert api.args("apiServer")["feature-gates"] == "SomeOtherGate=true"
    provider.delete("id", outs)
    assert api.args("apiServer")["feature-gates"] == "SomeOtherGate=false"


def test_kubeadm_config_leaves_an_entry_that_was_already_there_on_delete() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    outs = _create(provider, _props(admission_plugins=["NodeRestriction"]))
    assert "enable-admission-plugins" not in outs["added"]["apiServer"]
    provider.delete("id", outs)
    assert api.args("apiServer")["enable-admission-plugins"] == "NodeRestriction"


def test_kubeadm_config_update_converges_to_the_new_list() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _create(provider, _props())
    gates = {"SomeAlphaGate": True}
    provider.update("id", olds, _props(admission_plugins=[], feature_gates=gates, gates=gates))
    assert api.args("apiServer") == {
        "enable-admission-plugins": "NodeRestriction",
        "feature-gates": "SomeOtherGate=false,SomeAlphaGate=true",
    }
    assert api.args("scheduler") == {"feature-gates": "SomeAlphaGate=true"}


def test_kubeadm_config_rerun_writes_nothing() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _create(provider, _props())
    provider.update("id", olds, _props())
    assert api.writes == 1


def test_kubeadm_config_refresh_sees_a_plugin_removed_behind_its_back() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    outs = _create(provider, _props())
    in_sync = provider.read("id", outs).outs
    assert in_sync is not None
    assert provider.diff("id", in_sync, _props()).changes is False
    doc = api.document()
    doc["apiServer"]["extraArgs"][0]["value"] = "NodeRestriction"
    api.cm["data"]["ClusterConfiguration"] = yaml.safe_dump(doc)
    drifted = provider.read("id", outs).outs
    assert drifted is not None
    assert drifted["in_sync"] is False
    assert provider.diff("id", drifted, _props()).changes is True
    provider.update("id", drifted, _props())
    assert api.args("apiServer")["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )


def test_kubeadm_config_edits_the_v1beta3_map_form() -> None:
    api = FakeConfigMapApi(V1BETA3)
    provider = _provider(api)
    outs = _create(provider, _props())
    assert api.args("apiServer") == {
        "authorization-mode": "Node,RBAC",
        "enable-admission-plugins": "ExtendedResourceToleration",
        "feature-gates": "CPUManagerPolicyBetaOptions=true",
    }
    provider.delete("id", outs)
    assert api.document() == yaml.safe_load(V1BETA3)


def test_kubeadm_config_keeps_a_concurrent_change_made_between_read_and_write() -> None:
    api = FakeConfigMapApi(V1BETA4)

    def someone_else_writes() -> None:
        doc = api.document()
        doc["apiServer"]["extraArgs"].append({"name": "audit-log-maxage", "value": "7"})
        api.cm["data"]["ClusterConfiguration"] = yaml.safe_dump(doc)
        api.cm["metadata"]["resourceVersion"] = "2"

    api.before_write = someone_else_writes
    _create(_provider(api), _props())
    args = api.args("apiServer")
    assert args["audit-log-maxage"] == "7"
    assert args["enable-admission-plugins"] == "NodeRestriction,ExtendedResourceToleration"


def test_kubeadm_config_refuses_a_configmap_without_cluster_configuration() -> None:
    api = FakeConfigMapApi(V1BETA4)
    api.cm["data"] = {}
    with pytest.raises(NodeApiError, match="kube-system/kubeadm-config has no data key"):
        _create(_provider(api), _props())


def test_kubeadm_config_reads_stages_from_the_feature_metric() -> None:
    assert feature_stages(METRICS) == {
        "InPlacePodVerticalScaling": ("", True),
        "CPUManagerPolicyBetaOptions": ("BETA", False),
        "SomeAlphaGate": ("ALPHA", False),
    }


def test_kubeadm_config_check_refuses_an_unknown_gate_naming_it() -> None:
    _, _, refused = check_gates({"NoSuchGate": True}, feature_stages(METRICS), SERVER)
    assert refused == [
        f"feature gate 'NoSuchGate' is unknown to the API server {SERVER} "
        "(not in its kubernetes_feature_enabled metric)"
    ]


def test_kubeadm_config_check_leaves_out_a_ga_gate_at_its_value_with_a_note() -> None:
    gates, notes, refused = check_gates(
        {"InPlacePodVerticalScaling": True, "CPUManagerPolicyBetaOptions": True},
        feature_stages(METRICS),
        SERVER,
    )
    assert gates == {"CPUManagerPolicyBetaOptions": True}
    assert notes == {"InPlacePodVerticalScaling": "GA and locked to true: nothing to set"}
    assert refused == []


def test_kubeadm_config_check_refuses_a_ga_gate_at_the_other_value() -> None:
    _, _, refused = check_gates(
        {"InPlacePodVerticalScaling": False}, feature_stages(METRICS), SERVER
    )
    assert refused == [
        f"feature gate 'InPlacePodVerticalScaling' is GA and locked to true on the API server "
        f"{SERVER}; it cannot be set to false"
    ]


def test_kubeadm_config_provider_check_reports_failures_and_effective_gates() -> None:
    api = FakeConfigMapApi(V1BETA4)
    gates = {"InPlacePodVerticalScaling": True, "NoSuchGate": False, "SomeAlphaGate": True}
    result = _provider(api).check({}, _props(feature_gates=gates, gates=None))
    assert [f.property for f in result.failures] == ["feature_gates"]
    assert "'NoSuchGate'" in result.failures[0].reason
    assert result.inputs["gates"] == {"SomeAlphaGate": True}
    assert result.inputs["notes"] == {
        "InPlacePodVerticalScaling": "GA and locked to true: nothing to set"
    }


def test_kubeadm_config_annotation_key_is_a_qualified_name() -> None:
    assert annotation_key("prod") == "kubeadm-config.gpu-cluster.io/prod"
    assert annotation_key("org/proj/x" + "y" * 80) == "kubeadm-config.gpu-cluster.io/" + (
        "org-proj-x" + "y" * 53
    )


def test_kubeadm_config_takes_credentials_from_the_run_not_from_its_inputs() -> None:
    seen: list[tuple[str, str | None]] = []
    api = FakeConfigMapApi(V1BETA4)

    def connect(kubeconfig: str, context: str | None) -> FakeConfigMapApi:
        seen.append((kubeconfig, context))
        return api

    provider = configured(KubeadmConfigProvider(connect))
    outs = _create(provider, _props())
    assert not {"kubeconfig", "context"} & set(outs)
    assert seen == [("apiVersion: v1\nkind: Config\n", None)]
    # A changed credential never counts as a change of the resource.
    assert not provider.diff("id", outs, {**outs}).changes


def test_kubeadm_config_unconfigured_provider_refuses_to_guess_a_cluster() -> None:
    provider = KubeadmConfigProvider(lambda kubeconfig, context: FakeConfigMapApi(V1BETA4))
    with pytest.raises(NodeApiError, match="did not configure the provider"):
        provider.create(_props())


# --------------------------------------------------------------------------- two stacks


def test_kubeadm_config_an_item_two_stacks_want_stays_until_neither_wants_it() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    first = _create(provider, _props(**_stack("a")))
    second = _create(provider, _props(**_stack("b")))
    assert second["added"]["apiServer"]["enable-admission-plugins"] == {
        "ExtendedResourceToleration": None
    }

    provider.delete("id", first)
    assert api.args("apiServer")["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )
    assert api.args("scheduler") == {"feature-gates": "CPUManagerPolicyBetaOptions=true"}

    provider.delete("id", second)
    assert api.document() == yaml.safe_load(V1BETA4)
    assert not api.cm["metadata"].get("annotations")


def test_kubeadm_config_a_section_the_first_stack_created_goes_with_the_last_stack() -> None:
    api = FakeConfigMapApi(V1BETA3)  # no controllerManager and scheduler sections before
    provider = _provider(api)
    first = _create(provider, _props(**_stack("a")))
    second = _create(provider, _props(**_stack("b")))
    provider.delete("id", first)
    assert api.args("scheduler") == {"feature-gates": "CPUManagerPolicyBetaOptions=true"}
    provider.delete("id", second)
    assert api.document() == yaml.safe_load(V1BETA3)


def test_kubeadm_config_shared_gate_gets_its_old_value_back_when_the_last_stack_leaves() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    gates = {"SomeOtherGate": True}
    props = _props(admission_plugins=[], feature_gates=gates, gates=gates)
    first = _create(provider, {**props, **_stack("a")})
    second = _create(provider, {**props, **_stack("b")})
    provider.delete("id", first)
    assert api.args("apiServer")["feature-gates"] == "SomeOtherGate=true"
    provider.delete("id", second)
    assert api.args("apiServer")["feature-gates"] == "SomeOtherGate=false"


def test_kubeadm_config_update_dropping_a_shared_item_leaves_it_to_the_other_stack() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    first = _create(provider, _props(**_stack("a")))
    _create(provider, _props(**_stack("b")))
    provider.update("id", first, _props(**_stack("a"), admission_plugins=[]))
    assert api.args("apiServer")["enable-admission-plugins"] == (
        "NodeRestriction,ExtendedResourceToleration"
    )


def test_kubeadm_config_refuses_a_gate_another_stack_set_to_the_other_value() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    _create(provider, _props(**_stack("a")))
    before = copy.deepcopy(api.cm)
    gates = {"CPUManagerPolicyBetaOptions": False}
    with pytest.raises(NodeApiError) as excinfo:
        _create(provider, _props(**_stack("b"), feature_gates=gates, gates=gates))
    assert str(excinfo.value) == (
        "ConfigMap kube-system/kubeadm-config: feature-gates item CPUManagerPolicyBetaOptions of "
        "apiServer is set to true by stack organization/gpu-cluster/a (stack id id-a); stack "
        "organization/gpu-cluster/b (stack id id-b) wants false (stacks sharing a cluster must "
        "agree on a gate's value)"
    )
    assert api.cm == before


def test_kubeadm_config_preview_refuses_a_gate_another_stack_set_to_the_other_value() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    _create(provider, _props(**_stack("a")))
    gates = {"CPUManagerPolicyBetaOptions": False}
    # At the preview of the first `up` the stack's id is not known yet.
    news = _props(**_stack("b"), feature_gates=gates, gates=None)
    result = provider.check({}, {**news, "stack": Unknown()})
    assert [(f.property, f.reason) for f in result.failures] == [
        (
            "feature_gates",
            "feature-gates item CPUManagerPolicyBetaOptions of apiServer is set to true by "
            "stack organization/gpu-cluster/a (stack id id-a); stack organization/gpu-cluster/b "
            "wants false (stacks sharing a cluster must agree on a gate's value)",
        )
    ]


# --------------------------------------------------------------------------- renames and upgrades

FLIPPED = {"CPUManagerPolicyBetaOptions": False}


def _checked(provider: KubeadmConfigProvider, olds: dict[str, Any], news: dict[str, Any]) -> Any:
    """The inputs check hands the engine (the gates checked, the former keys found)."""
    result = provider.check(olds, {**news, "gates": None, "notes": None})
    assert result.failures == []
    return result.inputs


def test_kubeadm_config_a_renamed_stack_updates_its_label_and_keeps_its_record() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _create(provider, _props())
    renamed = _checked(provider, olds, _props(label="organization/gpu-cluster/staging"))
    diff = provider.diff("id", olds, renamed)
    assert (diff.changes, diff.replaces) == (True, [])
    outs = provider.update("id", olds, renamed).outs
    assert outs is not None
    assert api.cm["metadata"]["annotations"] == {
        annotation_key(STACK_ID): json.dumps(olds["added"], sort_keys=True),
        label_key(STACK_ID): "organization/gpu-cluster/staging",
    }
    assert outs["former"] == []


def test_kubeadm_config_a_renamed_stack_flips_a_gate_without_a_conflict_with_itself() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _create(provider, _props())
    news = _props(label="organization/gpu-cluster/staging", feature_gates=FLIPPED)
    outs = provider.update("id", olds, _checked(provider, olds, news)).outs
    assert outs is not None
    assert api.args("scheduler") == {"feature-gates": "CPUManagerPolicyBetaOptions=false"}
    provider.delete("id", outs)
    assert api.document() == yaml.safe_load(V1BETA4)
    assert not api.cm["metadata"].get("annotations")


def _name_keyed(api: FakeConfigMapApi, name: str, **overrides: Any) -> dict[str, Any]:
    """The state an earlier version left: the record keyed by the stack's name, no label."""
    outs = _create(_provider(api), _props(stack=name, label="", **overrides))
    return {k: v for k, v in outs.items() if k not in ("label", "former")}


def test_kubeadm_config_adopts_the_record_an_earlier_version_keyed_by_the_stack_name() -> None:
    other = 'kubernetes_feature_enabled{name="SomeOtherGate",stage="BETA"} 0\n'
    api = FakeConfigMapApi(V1BETA4, METRICS + other)
    provider = _provider(api)
    gates = {"SomeOtherGate": True}  # false before the earlier version set it
    olds = _name_keyed(api, "dev", feature_gates=gates, gates=gates)
    assert set(api.cm["metadata"]["annotations"]) == {annotation_key("dev")}

    # The next `up` moves the record to the id.
    news = _checked(provider, olds, _props(feature_gates=gates))
    assert news["former"] == ["dev"]
    diff = provider.diff("id", olds, news)
    assert (diff.changes, diff.replaces) == (True, [])
    outs = provider.update("id", olds, news).outs
    assert outs is not None
    assert set(api.cm["metadata"]["annotations"]) == {
        annotation_key(STACK_ID),
        label_key(STACK_ID),
    }
    # The value from before the earlier version came along: destroy restores it.
    provider.delete("id", outs)
    assert api.document() == yaml.safe_load(V1BETA4)
    assert not api.cm["metadata"].get("annotations")


def test_kubeadm_config_adopting_drops_what_the_stack_no_longer_wants() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _name_keyed(api, "dev")
    provider.update("id", olds, _checked(provider, olds, _props(feature_gates={})))
    assert api.args("apiServer") == {
        "enable-admission-plugins": "NodeRestriction,ExtendedResourceToleration",
        "feature-gates": "SomeOtherGate=false",
    }
    assert api.args("scheduler") == {}


def test_kubeadm_config_preview_without_the_id_sees_the_former_record_as_its_own() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _name_keyed(api, "dev")
    # A state older than the stack's id: the first preview does not know the id yet.
    news = _props(stack=Unknown(), feature_gates=FLIPPED, gates=None, notes=None)
    result = provider.check(olds, news)
    assert result.failures == []
    assert result.inputs["former"] == ["dev"]


def test_kubeadm_config_keeps_its_former_keys_after_adopting() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    olds = _name_keyed(api, "dev")
    outs = provider.update("id", olds, _checked(provider, olds, _props())).outs
    assert outs is not None
    again = _checked(provider, outs, _props())
    assert again["former"] == ["dev"]
    assert provider.diff("id", outs, again).changes is False


def test_kubeadm_config_another_stacks_name_keyed_record_is_not_adopted() -> None:
    api = FakeConfigMapApi(V1BETA4)
    provider = _provider(api)
    _name_keyed(api, "prod")
    olds = _name_keyed(api, "dev")
    news = _props(feature_gates=FLIPPED, gates=None, notes=None)
    result = provider.check(olds, news)
    assert [f.reason for f in result.failures] == [
        "feature-gates item CPUManagerPolicyBetaOptions of apiServer is set to true by stack "
        f"prod; stack {LABEL} (stack id {STACK_ID}) wants false (stacks sharing a cluster must "
        "agree on a gate's value)"
    ]
    outs = provider.update("id", olds, _checked(provider, olds, _props())).outs
    assert outs is not None
    assert annotation_key("prod") in api.cm["metadata"]["annotations"]
    assert annotation_key("dev") not in api.cm["metadata"]["annotations"]


# --------------------------------------------------------------------------- runtime-config


def test_kubeadm_config_adds_api_versions_to_the_api_server_runtime_config_and_takes_them_out() -> (
    None
):
    api = FakeConfigMapApi(V1BETA4)
    before = api.document()
    provider = _provider(api)
    props = _create(provider, _props(runtime_config={"scheduling.k8s.io/v1beta1": True}))
    assert api.args("apiServer")["runtime-config"] == "scheduling.k8s.io/v1beta1=true"
    for component in ("controllerManager", "scheduler"):
        assert "runtime-config" not in api.args(component)
    provider.delete("id", props)
    assert api.document() == before


def test_kubeadm_config_keeps_the_runtime_config_entries_it_found() -> None:
    api = FakeConfigMapApi(V1BETA4)
    other = {**_stack("other"), "runtime_config": {"resource.k8s.io/v1beta2": True}}
    _create(_provider(api), _props(**other))
    provider = _provider(api)
    props = _create(provider, _props(runtime_config={"scheduling.k8s.io/v1beta1": True}))
    assert api.args("apiServer")["runtime-config"] == (
        "resource.k8s.io/v1beta2=true,scheduling.k8s.io/v1beta1=true"
    )
    provider.delete("id", props)
    assert api.args("apiServer")["runtime-config"] == "resource.k8s.io/v1beta2=true"


def test_kubeadm_config_a_stack_without_runtime_config_sees_no_change() -> None:
    provider = _provider(FakeConfigMapApi(V1BETA4))
    olds = _props()
    assert provider.diff("id", olds, _props()).changes is False
    assert provider.diff("id", olds, _props(runtime_config={})).changes is False
    assert provider.diff("id", olds, _props(runtime_config={"a.io/v1": True})).changes is True
