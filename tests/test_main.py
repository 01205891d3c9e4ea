"""The whole program under Pulumi mocks with each stack's config."""

from __future__ import annotations

import json
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
import yaml

import stack_config as stack_config_module
import stack_outputs
from components.cluster_access import CLAIM_KEY, CLAIM_LABEL_KEY, PATCH_FORCE
from components.opa_gate.manifests import gate_list, written_document
from stack_config import (
    LAYERS,
    ConfigError,
    StackConfig,
    decode_raw_config,
    parse_stack_config,
)
from tests.conftest import ROOT, Recording, register, run_program, stack_config
from tests.fake_cluster import claimed_cluster


@pytest.fixture(autouse=True)
def _kubeconfig(empty_kubeconfig_env: Path) -> None:
    """Every program run reads this throwaway kubeconfig, never the developer's."""


def test_main_docstring_names_the_layers_in_order() -> None:
    doc = (ROOT / "__main__.py").read_text().split('"""')[1]
    positions = [doc.index(f". {layer.component} ") for layer in LAYERS]
    assert positions == sorted(positions)


def test_main_declares_one_component_per_layer() -> None:
    # The dev stack, with every layer it leaves switched off switched on.
    dev = parse_stack_config(decode_raw_config(stack_config("dev")))
    switched_on = {
        layer.key: {"enabled": True}
        for layer in LAYERS
        if getattr(getattr(dev, layer.field), "enabled", True) is False
    }
    recording = run_program("dev", switched_on)
    components = [r.typ for r in recording.resources if r.typ.startswith("gpu-cluster:")]
    assert sorted(components) == sorted(f"gpu-cluster:index:{layer.component}" for layer in LAYERS)


def test_main_every_kubernetes_object_uses_the_explicit_provider() -> None:
    recording = run_program("dev")
    provider = recording.named("cluster")
    assert provider.typ == "pulumi:providers:kubernetes"
    assert provider.inputs["context"] == "kubernetes-admin@lab"
    assert "kubeconfig" in provider.secret_inputs
    claim = next(
        r for r in recording.of_type("kubernetes:core/v1:ConfigMap") if r.name == "cluster-claim"
    )
    objects = [r for r in recording.resources if r.typ.startswith("kubernetes:") and r is not claim]
    assert objects
    assert all(r.provider.startswith(provider.urn + "::") for r in objects)
    # The provider waits for the stack's claim on the cluster, which has a provider of its own.
    assert claim.urn in provider.dependencies
    assert not claim.provider.startswith(provider.urn + "::")


def test_main_applies_every_object_with_force_but_the_claim() -> None:
    """Hand edits are undone by the next `up` (patchForce); the claim alone is applied without
    force, so a second stack's `up` stops on it (components/cluster_access.py)."""
    recording = run_program("prod")
    objects = [r for r in recording.resources if r.typ.startswith("kubernetes:")]
    forced = {
        r.name: ((r.inputs.get("metadata") or {}).get("annotations") or {}).get(PATCH_FORCE)
        for r in objects
        if r.typ != "kubernetes:helm.sh/v3:Release" and not r.typ.startswith("pulumi:providers")
    }
    assert forced.pop("cluster-claim") is None
    assert forced and set(forced.values()) == {"true"}, forced
    claim = next(r for r in objects if r.name == "cluster-claim")
    identity = next(r for r in recording.resources if r.typ.endswith(":StackIdentity"))
    # The stack's id (what the mocks give the StackIdentity resource), and its readable name.
    assert claim.inputs["data"][CLAIM_KEY] == f"{identity.name}-id"
    assert claim.inputs["data"][CLAIM_LABEL_KEY].endswith("/gpu-cluster/prod")
    # What does not use the kubernetes provider waits for the claim too (the SSH commands
    # through the one-host-at-a-time chain).
    waiting = {claim.urn}
    for r in recording.resources:
        # The stack's id touches nothing on the cluster; the claim waits for it.
        if r.typ.endswith(":StackIdentity"):
            continue
        if r.typ.startswith(("pulumi-python:dynamic", "command:remote")):
            assert waiting & set(r.dependencies), f"{r.name} does not wait for the claim"
            waiting.add(r.urn)


def test_main_dev_values_reach_the_dynamic_providers() -> None:
    recording = run_program("dev")
    (pool,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:GpuPoolNodes")
    assert pool.inputs["nodes"] == ["lab-gpu-1", "lab-gpu-2"]
    (advertised,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:ExtendedResourceNodeSet")
    assert advertised.inputs["nodes"] == {"lab-worker-1": {"example.com/dongle": 4}}
    # Credentials are read by the providers from the stack config, never stored with them.
    assert not {"kubeconfig", "context"} & (set(advertised.inputs) | set(pool.inputs))


def test_main_prod_taints_every_gpu_node() -> None:
    recording = run_program("prod")
    (pool,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:GpuPoolNodes")
    assert len(pool.inputs["nodes"]) == 4
    assert pool.inputs["effect"] == "NoSchedule"


def test_main_exports_gpu_nodes_taint_and_advertised_resources() -> None:
    recording = run_program("dev")
    assert recording.outputs["gpuNodes"] == ["lab-gpu-1", "lab-gpu-2"]
    assert recording.outputs["gpuTaint"] == {
        "key": "nvidia.com/gpu",
        "value": "present",
        "effect": "NoSchedule",
    }
    assert recording.outputs["advertisedResources"] == {"lab-worker-1": {"example.com/dongle": 4}}
    assert recording.outputs["schedulerName"] == "gpu-binpack-scheduler"


def test_main_scheduler_replicas_and_image_follow_the_stack() -> None:
    for stack, replicas, image in (
        ("dev", 1, "registry.k8s.io/kube-scheduler:v1.36.3"),
        ("prod", 2, "registry.k8s.io/kube-scheduler:v1.35.4"),
    ):
        deployment = run_program(stack).named("binpack-scheduler-deployment")
        spec = deployment.inputs["spec"]
        assert spec["replicas"] == replicas
        assert spec["template"]["spec"]["containers"][0]["image"] == image


def test_main_bad_config_declares_nothing() -> None:
    recording = Recording()
    bad = {"gpuPool": {"nodes": ["lab-gpu-1"], "taint": {"effect": "Sometimes"}}}
    with pytest.raises(ConfigError, match=r"gpuPool\.taint\.effect: got 'Sometimes'"):
        run_program("dev", bad, recording)
    assert recording.resources == []


def test_main_refuses_kubeconfig_content_set_without_secret_before_declaring_anything() -> None:
    recording = Recording()
    content = "apiVersion: v1\nkind: Config\ncurrent-context: other-cluster\n"
    with pytest.raises(ConfigError, match=r"kubeconfig: got '\[plain text, not shown\]'"):
        run_program("dev", {"kubeconfig": content}, recording)
    assert recording.resources == []


def test_main_gate_takes_scheduler_name_and_advertised_resources_from_their_layers() -> None:
    recording = run_program("dev")
    policy = recording.gate_policy()
    data = recording.gate_document()
    assert data["scheduler_name"] == "gpu-binpack-scheduler"
    names = ["amd.com/gpu", "example.com/dongle", "gpu.intel.com/i915", "gpu.intel.com/xe"]
    names += ["nvidia.com/gpu", "nvidia.com/gpu.shared"]
    assert gate_list(data, "gpu_resources") == names
    assert gate_list(data, "gpu_resource_prefixes") == ["nvidia.com/mig-"]
    scheduler = recording.named("binpack-scheduler-deployment")
    dongle = recording.named("extended-resources-nodes")
    assert {scheduler.urn, dongle.urn} <= set(policy.dependencies)
    # Written into the policy: no parameter object a tenant could edit or delete.
    assert "paramKind" not in policy.inputs["spec"]
    (binding,) = [
        b
        for b in recording.of_type(
            "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"
        )
        if b.inputs["metadata"]["name"] == "gpu-scheduler-gate"
    ]
    assert "paramRef" not in binding.inputs["spec"]
    assert not [
        c
        for c in recording.of_type("kubernetes:core/v1:ConfigMap")
        if c.inputs["metadata"]["name"] == "gpu-gate-params"
    ]


def test_main_engines_and_failure_policy_differ_per_stack() -> None:
    dev = run_program("dev")
    assert (
        dev.of_type("kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration")
        == []
    )
    (policy,) = dev.of_type("kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy")
    assert policy.inputs["spec"]["failurePolicy"] == "Ignore"
    prod = run_program("prod")
    (webhook,) = prod.of_type(
        "kubernetes:admissionregistration.k8s.io/v1:ValidatingWebhookConfiguration"
    )
    assert webhook.inputs["webhooks"][0]["failurePolicy"] == "Fail"


def test_main_routing_gives_gpu_pods_the_pools_toleration() -> None:
    recording = run_program("dev", {"admission": {"engine": "mutating-admission-policy"}})
    data = recording.gate_document()
    # The taint comes from the pool's output: written once, in gpuPool.
    taint = {k: data[f"pool_pods.taint.{k}"] for k in ("key", "value", "effect")}
    assert taint == {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    (pool_nodes,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:GpuPoolNodes")
    assert pool_nodes.urn in recording.gate_policy().dependencies
    (routing,) = recording.of_type(
        "kubernetes:admissionregistration.k8s.io/v1:MutatingAdmissionPolicy"
    )
    # The routing policy is rendered with the same document.
    assert written_document(routing.inputs["spec"]) == data
    assert pool_nodes.urn in routing.dependencies


def test_main_gate_keeps_the_stacks_priority_classes_to_gpu_pods() -> None:
    # Layer 8's classes and allowed namespaces reach the gate's parameter document...
    on = {"priorityClasses": {"enabled": True, "allowedNamespaces": ["web", "ml-serving"]}}
    data = run_program("dev", on).gate_document()
    assert gate_list(data, "priority_classes") == ["gpu-batch", "gpu-inference", "gpu-training"]
    assert gate_list(data, "priority_class_namespaces") == ["ml-serving", "web"]
    # ...only while the layer creates them: otherwise the document is as it was.
    off = {"priorityClasses": {"enabled": False, "allowedNamespaces": ["web"]}}
    data = run_program("dev", off).gate_document()
    assert not {"priority_classes", "priority_class_namespaces"} & set(data)


def test_main_gate_keeps_pods_without_a_gpu_off_the_pools_nodes() -> None:
    # The pool's nodes, the stack's pool namespaces (StackConfig.pool_namespaces) and
    # admission.poolDaemonSets reach the gate's parameter document.
    admission = {
        "engine": "validating-admission-policy",
        "poolNamespaces": ["logging", "calico-system"],
        "poolDaemonSets": ["team-a/node-agent"],
    }
    data = run_program("dev", {"admission": admission}).gate_document()
    pool = decode_raw_config(stack_config("dev"))["gpuPool"]["nodes"]
    assert gate_list(data, "pool_nodes") == sorted(pool)
    # dev runs the monitoring layer: its namespace is the pool's too.
    assert gate_list(data, "pool_namespaces") == ["calico-system", "logging", "monitoring"]
    assert gate_list(data, "pool_daemonsets") == ["team-a/node-agent"]


def test_main_pool_namespaces_add_the_monitoring_namespace_while_the_layer_is_on() -> None:
    raw = decode_raw_config(stack_config("dev"))
    admission = {**raw.get("admission", {}), "poolNamespaces": ["logging"]}
    monitoring = {"namespace": "metrics", "grafanaAdminSecret": "g", "createNamespace": False}
    on = parse_stack_config(
        {**raw, "admission": admission, "monitoring": {**monitoring, "enabled": True}}
    )
    assert on.pool_namespaces == ("logging", "metrics")
    off = parse_stack_config(
        {**raw, "admission": admission, "monitoring": {**monitoring, "enabled": False}}
    )
    assert off.pool_namespaces == ("logging",)


def test_main_gpu_operator_settings_name_what_is_gated_weighted_and_routed() -> None:
    # One source: time-slicing renamed (nvidia.com/gpu.shared) reaches the gate, the routing
    # policy and the scheduler's weights without being typed anywhere else.
    sharing = {"timeSlicing": {"replicas": 4, "renameByDefault": True}}
    operator = {"enabled": True, "devicePlugin": sharing, "mig": {"strategy": "none"}}
    recording = run_program(
        "dev", {"gpuOperator": operator, "admission": {"engine": "mutating-admission-policy"}}
    )
    # The validating and the routing policy read the one parameter document.
    assert "nvidia.com/gpu.shared" in gate_list(recording.gate_document(), "gpu_resources")
    config = yaml.safe_load(
        recording.named("binpack-scheduler-config").inputs["data"]["config.yaml"]
    )
    resources = config["profiles"][0]["pluginConfig"][0]["args"]["scoringStrategy"]["resources"]
    assert {"name": "nvidia.com/gpu.shared", "weight": 100} in resources


def test_main_opa_certificate_expiry_reaches_the_monitoring_alerts() -> None:
    prod = run_program("prod")
    (published, _) = prod.named("monitoring-gate-alerts").inputs["spec"]["groups"]
    # The mocks' certificate ends 2028-11-23T11:00:00Z; the rule is written from the output.
    assert published["rules"][0]["expr"] == "vector(1858590000)"
    dev = run_program("dev")
    assert [r for r in dev.resources if r.name == "monitoring-gate-alerts"] == []


def test_main_pool_waits_for_the_extended_resources_layer() -> None:
    """Both layers write the same Node objects: one after the other, their writes never conflict."""
    recording = run_program("dev")
    (advertised,) = recording.of_type("pulumi-python:dynamic/gpu-cluster:ExtendedResourceNodeSet")
    pool = recording.named("gpu-pool")
    assert advertised.urn in pool.dependencies


def test_main_refuses_a_key_in_a_misspelt_namespace_before_declaring_anything() -> None:
    """`gpu-clustr:gpuPool` is not this project's key: ignored, the next `up` would untaint
    every GPU node (the real gpuPool falls back to its default). Refused, naming the key."""
    config = {"gpu-clustr:gpuPool": json.dumps({"nodes": ["lab-gpu-1"]})}
    recording = Recording()
    with pytest.raises(ConfigError) as refused:
        register(
            lambda: runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__"),
            {**stack_config("dev"), **config},
            "dev",
            recording,
        )
    assert "gpu-clustr:gpuPool: unknown config namespace 'gpu-clustr'" in str(refused.value)
    assert "gpu-cluster (this project)" in str(refused.value)
    assert recording.resources == []


def test_main_accepts_the_providers_config_namespaces() -> None:
    """Provider and engine namespaces stay the user's to set."""
    config = {"kubernetes:suppressHelmHookWarnings": "true", "pulumi:tags": "{}"}
    recording = Recording()
    register(
        lambda: runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__"),
        {**stack_config("dev"), **config},
        "dev",
        recording,
    )
    assert recording.resources


# ------------------------------------------------------------------ outputs

# Where the stack's outputs are read by name: the demo, the benchmarks and the end-to-end tests.
OUTPUT_READERS = ("tools/demo.py", "bench/*.py", "tests/e2e/*.py")
_OUTPUT_READ = re.compile(r"outputs(?:\[\s*|\.get\(\s*)\"(\w+)\"")


def _exported(
    monkeypatch: pytest.MonkeyPatch, stack: str, config: dict[str, Any]
) -> tuple[set[str], set[str]]:
    """(the names __main__.py exports, the layers that are on) for `stack` with `config`."""
    exported: list[str] = []
    loaded: list[StackConfig] = []
    load = stack_config_module.load_stack_config

    def recorded() -> StackConfig:
        loaded.append(load())
        return loaded[-1]

    # Grafana's password, when given, is a secret (as `pulumi config set --secret` stores it).
    monkeypatch.setenv("PULUMI_CONFIG_SECRET_KEYS", '["gpu-cluster:grafanaAdminPassword"]')
    monkeypatch.setattr(stack_outputs, "export_outputs", lambda values: exported.extend(values))
    monkeypatch.setattr(stack_config_module, "load_stack_config", recorded)
    # The local stack creates its monitoring namespace: a cluster without one.
    run_program(stack, config, cluster=claimed_cluster() if stack == "local" else None)
    (parsed,) = loaded
    on = {row.component for row in LAYERS if getattr(getattr(parsed, row.field), "enabled", True)}
    return set(exported), on


# The local stack's monitoring needs Grafana's password, a secret its file does not hold.
LOCAL = {"grafanaAdminPassword": "pw"}
DRA = {
    **LOCAL,
    "gpuOperator": {"enabled": True, "allocation": "dra", "version": "v26.7.0"},
    "admission": {"engine": "mutating-admission-policy"},
}


@pytest.mark.parametrize(
    ("stack", "config"), [("local", LOCAL), ("dev", {}), ("prod", {}), ("local", DRA)]
)
def test_main_exports_the_outputs_of_the_table_whose_layers_are_on(
    monkeypatch: pytest.MonkeyPatch, stack: str, config: dict[str, Any]
) -> None:
    exported, on = _exported(monkeypatch, stack, config)
    dra = config.get("gpuOperator", {}).get("allocation") == "dra"
    wanted = {
        o.name
        for o in stack_outputs.OUTPUTS
        if o.layer in on and (o.name != "gpuDeviceClasses" or dra)
    }
    assert exported == wanted


def test_main_every_output_read_by_name_is_in_the_table() -> None:
    read = {
        (str(path.relative_to(ROOT)), name)
        for pattern in OUTPUT_READERS
        for path in sorted(ROOT.glob(pattern))
        for name in _OUTPUT_READ.findall(path.read_text())
    }
    assert read, "no output read by name: the pattern no longer finds them"
    assert sorted((p, n) for p, n in read if n not in stack_outputs.OUTPUT_NAMES) == []


def test_main_export_outputs_refuses_a_name_the_table_does_not_hold() -> None:
    with pytest.raises(ValueError, match=r"\['gpuNodez'\] are not in stack_outputs.OUTPUTS"):
        stack_outputs.export_outputs({"gpuNodez": 1})
