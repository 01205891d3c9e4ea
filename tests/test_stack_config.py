"""The config module: defaults, the dev/prod stacks, and one test per rejected input."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.control_plane_features.component import ControlPlaneFeaturesArgs
from stack_config import ConfigError, StackConfig, decode_raw_config, parse_stack_config
from tests.conftest import component_access, stack_config


def _parse(**values: Any) -> StackConfig:
    """Parse a config of a minimal inventory plus `values`."""
    base: dict[str, Any] = {"nodes": [{"name": "gpu-1"}, {"name": "gpu-2"}, {"name": "cpu-1"}]}
    return parse_stack_config({**base, **values})


def _problems(**values: Any) -> list[str]:
    with pytest.raises(ConfigError) as excinfo:
        _parse(**values)
    return [str(p) for p in excinfo.value.problems]


def test_config_defaults_apply_when_keys_are_absent() -> None:
    config = parse_stack_config({})
    assert config.kubernetes_version == "v1.37.2"
    assert config.gpu_pool.taint.as_dict() == {
        "key": "nvidia.com/gpu",
        "value": "present",
        "effect": "NoSchedule",
    }
    assert config.gpu_pool.labels == {"gpu-cluster.io/pool": "gpu"}
    assert config.scheduler.name == "gpu-binpack-scheduler"
    assert config.kubernetes.context is None


# What each stack keeps in its encrypted secrets (`pulumi config set --secret`).
STACK_SECRETS: dict[str, dict[str, str]] = {"local": {"grafanaAdminPassword": "local-only"}}


@pytest.mark.parametrize("stack", ["dev", "prod", "local"])
def test_config_stack_files_are_valid(stack: str) -> None:
    values = {**decode_raw_config(stack_config(stack)), **STACK_SECRETS.get(stack, {})}
    config = parse_stack_config(values)
    assert config.gpu_pool.nodes
    assert set(config.gpu_pool.nodes) <= {n.name for n in config.nodes}


def test_config_dev_and_prod_differ_in_nodes_version_and_taint_effect() -> None:
    dev = parse_stack_config(decode_raw_config(stack_config("dev")))
    prod = parse_stack_config(decode_raw_config(stack_config("prod")))
    assert set(dev.gpu_pool.nodes).isdisjoint(prod.gpu_pool.nodes)
    assert dev.kubernetes_version != prod.kubernetes_version
    assert (dev.control_plane.enabled, prod.control_plane.enabled) == (True, True)
    assert (dev.admission.engine, prod.admission.engine) == ("validating-admission-policy", "opa")


def test_config_rejects_extended_resource_without_domain() -> None:
    problems = _problems(extendedResources={"cpu-1": {"dongle": 4}})
    assert problems == [
        "gpu-cluster:extendedResources.cpu-1.dongle: got 'dongle'; not an extended resource "
        "name: must be 'domain/name', e.g. example.com/dongle"
    ]


def test_config_rejects_extended_resource_in_kubernetes_io_domain() -> None:
    problems = _problems(extendedResources={"cpu-1": {"kubernetes.io/dongle": 1}})
    assert "the kubernetes.io domain is reserved" in problems[0]
    assert problems[0].startswith("gpu-cluster:extendedResources.cpu-1.kubernetes.io/dongle:")


def test_config_rejects_extended_resource_in_kubernetes_io_subdomain() -> None:
    problems = _problems(extendedResources={"cpu-1": {"node.kubernetes.io/x": 1}})
    assert "the kubernetes.io domain is reserved" in problems[0]


def test_config_rejects_requests_prefixed_extended_resource() -> None:
    problems = _problems(extendedResources={"cpu-1": {"requests.example.com/dongle": 1}})
    assert problems == [
        "gpu-cluster:extendedResources.cpu-1.requests.example.com/dongle: got "
        "'requests.example.com/dongle'; not an extended resource name: must not start with "
        "'requests.'"
    ]


@pytest.mark.parametrize("quantity", [1.5, -1, "four", True, None])
def test_config_rejects_non_integer_or_negative_quantity(quantity: Any) -> None:
    problems = _problems(extendedResources={"cpu-1": {"example.com/dongle": quantity}})
    assert problems == [
        f"gpu-cluster:extendedResources.cpu-1.example.com/dongle: got {quantity!r}; "
        "expected a non-negative integer"
    ]


def test_config_rejects_unknown_taint_effect() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1"], "taint": {"effect": "NoScheduled"}})
    assert problems == ["gpu-cluster:gpuPool.taint.effect: got 'NoScheduled'; " + NO_EXECUTE_RULE]


NO_EXECUTE_RULE = (
    "allowed: NoSchedule, PreferNoSchedule (not NoExecute: ExtendedResourceToleration gives "
    "GPU pods only NoSchedule tolerations, so they would stay Pending, and the taint would "
    "evict the node's agents)"
)


def test_config_refuses_a_no_execute_pool_before_anything_is_declared() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1"], "taint": {"effect": "NoExecute"}})
    assert problems == ["gpu-cluster:gpuPool.taint.effect: got 'NoExecute'; " + NO_EXECUTE_RULE]


def test_config_rejects_node_listed_twice_in_inventory() -> None:
    problems = _problems(nodes=[{"name": "gpu-1"}, {"name": "gpu-1"}])
    assert problems == [
        "gpu-cluster:nodes[1].name: got 'gpu-1'; each node may be listed once; it is listed twice"
    ]


def test_config_rejects_node_listed_twice_in_pool() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1", "gpu-1"]})
    assert problems == [
        "gpu-cluster:gpuPool.nodes[1]: got 'gpu-1'; each node may be listed once; it is listed twice"
    ]


def test_config_rejects_extended_resource_on_node_outside_inventory() -> None:
    problems = _problems(extendedResources={"ghost": {"example.com/dongle": 1}})
    assert problems == [
        "gpu-cluster:extendedResources.ghost: got 'ghost'; node is not in gpu-cluster:nodes"
    ]


def test_config_rejects_pool_node_outside_inventory() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-9"]})
    assert problems == [
        "gpu-cluster:gpuPool.nodes[0]: got 'gpu-9'; node is not in gpu-cluster:nodes"
    ]


@pytest.mark.parametrize("name", ["GPU-Binpack", "gpu_binpack", "-gpu", "a" * 64, "gpu.binpack"])
def test_config_rejects_scheduler_name_that_is_not_a_dns1123_label(name: str) -> None:
    problems = _problems(scheduler={"name": name})
    assert problems == [
        f"gpu-cluster:scheduler.name: got {name!r}; expected a DNS-1123 label "
        "(lowercase alphanumerics and '-', <= 63) other than default-scheduler, which the "
        "cluster's own kube-scheduler uses"
    ]


def test_config_rejects_unknown_top_level_key_without_showing_its_value() -> None:
    problems = _problems(gpuPools={"nodes": ["secret-looking"]})
    assert len(problems) == 1
    assert problems[0].startswith("gpu-cluster:gpuPools: unknown key; allowed: kubeconfig, ")
    assert "gpuPool," in problems[0]
    assert "secret-looking" not in problems[0]


def test_config_rejects_unknown_nested_key() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1"], "taints": {}})
    assert problems == ["gpu-cluster:gpuPool.taints: unknown key; allowed: nodes, taint, labels"]


def test_config_rejects_invalid_node_name() -> None:
    problems = _problems(nodes=[{"name": "GPU_1"}])
    assert problems == [
        "gpu-cluster:nodes[0].name: got 'GPU_1'; expected a Kubernetes node name (DNS-1123 subdomain)"
    ]


def test_config_rejects_invalid_label_value() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1"], "labels": {"gpu-cluster.io/pool": "a b"}})
    assert problems == [
        "gpu-cluster:gpuPool.labels.gpu-cluster.io/pool: got 'a b'; "
        "label value must be <= 63 alphanumerics, '-', '_' or '.'"
    ]


def test_config_rejects_malformed_kubernetes_version() -> None:
    problems = _problems(kubernetesVersion="1.34")
    assert problems == [
        "gpu-cluster:kubernetesVersion: got '1.34'; expected vMAJOR.MINOR.PATCH with major "
        "version 1, e.g. v1.37.2"
    ]


def test_config_warns_on_untested_kubernetes_version() -> None:
    config = _parse(
        kubernetesVersion="v1.30.2",
        admission={"engine": "opa"},
        gpuPool={"nodes": ["gpu-1"], "taint": {"effect": "PreferNoSchedule"}},
    )
    assert config.warnings == (
        "gpu-cluster:kubernetesVersion v1.30.2 is outside the tested range v1.35-v1.37",
    )


def test_config_warns_on_an_extended_resource_advertised_as_zero() -> None:
    config = _parse(extendedResources={"cpu-1": {"example.com/dongle": 0}})
    assert config.warnings == (
        "gpu-cluster:extendedResources.cpu-1.example.com/dongle advertises 0; no pod can be "
        "scheduled with it there",
    )


def test_config_time_slicing_renamed_is_no_longer_a_warning() -> None:
    # The gate and the scheduler take nvidia.com/gpu.shared from the operator's settings.
    sharing = {"replicas": 4, "renameByDefault": True}
    config = _parse(gpuOperator={"enabled": True, "devicePlugin": {"timeSlicing": sharing}})
    assert config.warnings == ()


def test_config_stack_files_load_without_warnings() -> None:
    for stack in ("dev", "prod", "local"):
        values = {**decode_raw_config(stack_config(stack)), **STACK_SECRETS.get(stack, {})}
        assert parse_stack_config(values).warnings == ()


def test_config_reports_every_problem_together() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(
            gpuPool={"nodes": ["gpu-9"], "taint": {"effect": "Never"}},
            extendedResources={"cpu-1": {"dongle": -2}},
            scheduler={"name": "Bad_Name"},
        )
    keys = [p.key for p in excinfo.value.problems]
    assert keys == [  # in the order of the layers
        "extendedResources.cpu-1.dongle",  # not domain/name
        "extendedResources.cpu-1.dongle",  # and a negative count
        "gpuPool.nodes[0]",
        "gpuPool.taint.effect",
        "scheduler.name",
    ]
    assert "5 problem(s)" in str(excinfo.value)


def test_config_decodes_structured_values_from_pulumi_json_text() -> None:
    decoded = decode_raw_config(
        {
            "gpu-cluster:nodes": '[{"name": "a"}]',
            "gpu-cluster:kubeconfig": "~/kc",
            "aws:region": "x",
        }
    )
    assert decoded == {"nodes": [{"name": "a"}], "kubeconfig": "~/kc"}


def test_config_scheduler_defaults_match_the_binpack_profile() -> None:
    profile = _parse().scheduler.profile
    assert [(p.utilization, p.score) for p in profile.shape] == [(0, 0), (100, 10)]
    assert [(w.name, w.weight) for w in profile.resources] == [
        ("nvidia.com/gpu", 100),
        ("cpu", 1),
        ("memory", 1),
    ]
    assert profile.balanced_weight == 3
    assert list(profile.balanced_resources) == ["cpu", "memory", "nvidia.com/gpu"]


def test_config_sets_balanced_allocation_weight_and_resources() -> None:
    balanced = {"weight": 0, "resources": ["cpu", "nvidia.com/gpu"]}
    profile = _parse(scheduler={"balancedAllocation": balanced}).scheduler.profile
    assert (profile.balanced_weight, list(profile.balanced_resources)) == (
        0,
        ["cpu", "nvidia.com/gpu"],
    )


@pytest.mark.parametrize("weight", [-1, 101, 2.5, "3", True])
def test_config_rejects_balanced_allocation_weight_out_of_range(weight: Any) -> None:
    problems = _problems(scheduler={"balancedAllocation": {"weight": weight}})
    assert problems == [
        f"gpu-cluster:scheduler.balancedAllocation.weight: got {weight!r}; "
        "expected a plugin weight from 0 (plugin off) to 100"
    ]


def test_config_rejects_balanced_allocation_over_one_resource() -> None:
    problems = _problems(scheduler={"balancedAllocation": {"resources": ["nvidia.com/gpu"]}})
    assert problems == [
        "gpu-cluster:scheduler.balancedAllocation.resources: got ['nvidia.com/gpu']; expected "
        "at least two resources (the plugin balances their shares), e.g. [cpu, memory, "
        "nvidia.com/gpu]"
    ]


def test_config_rejects_balanced_allocation_resource_twice_or_unrequestable() -> None:
    problems = _problems(scheduler={"balancedAllocation": {"resources": ["cpu", "gpu", "cpu"]}})
    assert problems == [
        "gpu-cluster:scheduler.balancedAllocation.resources[1]: got 'gpu'; expected a resource "
        "a pod can request: cpu, memory, ephemeral-storage, hugepages-<size> or domain/name "
        "(e.g. nvidia.com/gpu)",
    ]
    (twice,) = _problems(scheduler={"balancedAllocation": {"resources": ["cpu", "cpu"]}})
    assert twice == (
        "gpu-cluster:scheduler.balancedAllocation.resources[1]: got 'cpu'; "
        "each resource at most once"
    )


@pytest.mark.parametrize("weight", [0, -3, 1.5, "100"])
def test_config_rejects_scheduler_weight_below_one(weight: Any) -> None:
    problems = _problems(scheduler={"resourceWeights": {"nvidia.com/gpu": weight}})
    assert problems == [
        f"gpu-cluster:scheduler.resourceWeights.nvidia.com/gpu: got {weight!r}; "
        "expected an integer weight from 1 to 100"
    ]


def test_config_rejects_shape_utilization_not_strictly_increasing() -> None:
    shape = [
        {"utilization": 0, "score": 0},
        {"utilization": 50, "score": 5},
        {"utilization": 50, "score": 10},
    ]
    problems = _problems(scheduler={"shape": shape})
    assert problems == [
        "gpu-cluster:scheduler.shape[2].utilization: got 50; utilizations must strictly increase; previous is 50"
    ]


def test_config_rejects_shape_utilization_above_100() -> None:
    problems = _problems(
        scheduler={"shape": [{"utilization": 0, "score": 0}, {"utilization": 120, "score": 10}]}
    )
    assert problems == [
        "gpu-cluster:scheduler.shape[1].utilization: got 120; expected an integer from 0 to 100"
    ]


def test_config_rejects_shape_score_above_10() -> None:
    problems = _problems(
        scheduler={"shape": [{"utilization": 0, "score": 0}, {"utilization": 100, "score": 11}]}
    )
    assert problems == [
        "gpu-cluster:scheduler.shape[1].score: got 11; expected an integer from 0 to 10"
    ]


def test_config_rejects_shape_with_one_point() -> None:
    problems = _problems(scheduler={"shape": [{"utilization": 0, "score": 0}]})
    assert problems == [
        "gpu-cluster:scheduler.shape: got [{'utilization': 0, 'score': 0}]; "
        "expected at least two {utilization, score} points"
    ]


def test_config_refuses_routing_below_its_ga_version() -> None:
    # MutatingAdmissionPolicy is beta behind a feature gate on v1.35: the default engine is
    # refused there, with the engines that work on that version.
    assert _problems(kubernetesVersion="v1.35.4") == [
        "gpu-cluster:admission.engine: got 'mutating-admission-policy'; needs kubernetesVersion "
        "v1.36 or newer (MutatingAdmissionPolicy is GA there; kubernetesVersion is v1.35.4); "
        "allowed on this version: validating-admission-policy, opa"
    ]


def test_config_routes_from_v1_36() -> None:
    assert _parse(kubernetesVersion="v1.36.0").admission.engine == "mutating-admission-policy"


def test_config_rejects_unknown_admission_engine() -> None:
    problems = _problems(admission={"engine": "gatekeeper"})
    assert problems == [
        "gpu-cluster:admission.engine: got 'gatekeeper'; allowed: mutating-admission-policy, "
        "validating-admission-policy, opa"
    ]


def test_config_rejects_unknown_failure_policy() -> None:
    problems = _problems(admission={"failurePolicy": "Retry"})
    assert problems == ["gpu-cluster:admission.failurePolicy: got 'Retry'; allowed: Fail, Ignore"]


def test_config_rejects_webhook_timeout_above_30() -> None:
    problems = _problems(admission={"timeoutSeconds": 45})
    assert problems == [
        "gpu-cluster:admission.timeoutSeconds: got 45; expected an integer from 1 to 30"
    ]


# --------------------------------------------------------------------------- controlPlane

_CP_NODES = [
    {"name": "cp-1", "address": "10.0.0.11"},
    {"name": "gpu-1", "address": "10.0.0.21"},
    {"name": "cpu-1"},
]
_CP_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA-test-only\n-----END OPENSSH PRIVATE KEY-----\n"
_HOST_KEYS = {
    "cp-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIC1jcDE root@cp-1",
    "gpu-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGdwdTE root@gpu-1",
}


def _control_plane_problems(
    sshPrivateKey: str = _CP_KEY, kubernetesVersion: str = "v1.37.2", **fields: Any
) -> list[str]:
    section = {"enabled": True, "user": "ops", "hosts": ["cp-1"], "hostKeys": _HOST_KEYS, **fields}
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {
                "kubernetesVersion": kubernetesVersion,
                "nodes": _CP_NODES,
                "controlPlane": section,
                "sshPrivateKey": sshPrivateKey,
            }
        )
    return [str(p) for p in excinfo.value.problems]


def test_config_control_plane_key_is_a_pulumi_secret_output() -> None:
    config = parse_stack_config(
        {
            "nodes": _CP_NODES,
            "sshPrivateKey": _CP_KEY,
            "controlPlane": {
                "enabled": True,
                "user": "ops",
                "hosts": ["cp-1"],
                "kubeletHosts": ["gpu-1"],
                "hostKeys": _HOST_KEYS,
                "featureGates": {"InPlacePodVerticalScaling": True},
            },
        }
    )
    access = component_access()
    cp = ControlPlaneFeaturesArgs.from_settings(
        config.control_plane,
        access=access,
        ssh_private_key=config.ssh_private_key,
        inventory=config.nodes,
    )
    assert [(h.name, h.address) for h in cp.control_plane_hosts] == [("cp-1", "10.0.0.11")]
    assert isinstance(cp.ssh.private_key, pulumi.Output)
    assert _CP_KEY not in repr(config)
    loop = asyncio.get_event_loop()  # the loop the Output was created on
    assert loop.run_until_complete(cp.ssh.private_key.is_secret())


def test_config_control_plane_is_off_by_default() -> None:
    assert parse_stack_config({}).control_plane.enabled is False


def test_config_rejects_admission_plugin_that_is_not_an_identifier() -> None:
    problems = _control_plane_problems(admissionPlugins=["Extended-Resource-Toleration"])
    assert problems == [
        "gpu-cluster:controlPlane.admissionPlugins[0]: got 'Extended-Resource-Toleration'; "
        "expected a plugin name (letters and digits, CamelCase)"
    ]


def test_config_rejects_unknown_admission_plugin() -> None:
    (problem,) = _control_plane_problems(admissionPlugins=["ExtendedResourceTolerations"])
    assert problem.startswith(
        "gpu-cluster:controlPlane.admissionPlugins[0]: got 'ExtendedResourceTolerations'; "
        "unknown admission plugin in kube-apiserver v1.37.2; allowed: AlwaysAdmit, "
    )
    assert "ExtendedResourceToleration, " in problem


def test_config_rejects_admission_plugin_listed_twice() -> None:
    problems = _control_plane_problems(admissionPlugins=["NodeRestriction", "NodeRestriction"])
    assert problems == [
        "gpu-cluster:controlPlane.admissionPlugins[1]: got 'NodeRestriction'; "
        "each plugin may be listed once; it is listed twice"
    ]


def test_config_rejects_feature_gate_not_in_camel_case() -> None:
    problems = _control_plane_problems(featureGates={"in-place-pod-vertical-scaling": True})
    assert problems == [
        "gpu-cluster:controlPlane.featureGates.in-place-pod-vertical-scaling: got "
        "'in-place-pod-vertical-scaling'; expected a feature gate name in CamelCase, "
        "e.g. InPlacePodVerticalScaling"
    ]


def test_config_rejects_feature_gate_value_that_is_not_a_boolean() -> None:
    problems = _control_plane_problems(featureGates={"InPlacePodVerticalScaling": "yes"})
    assert problems == [
        "gpu-cluster:controlPlane.featureGates.InPlacePodVerticalScaling: got 'yes'; "
        "expected true or false"
    ]


def test_config_rejects_control_plane_host_outside_inventory() -> None:
    problems = _control_plane_problems(hosts=["cp-9"])
    assert problems == [
        "gpu-cluster:controlPlane.hosts[0]: got 'cp-9'; node is not in gpu-cluster:nodes"
    ]


def test_config_rejects_kubelet_host_listed_twice() -> None:
    problems = _control_plane_problems(kubeletHosts=["gpu-1", "gpu-1"])
    assert problems == [
        "gpu-cluster:controlPlane.kubeletHosts[1]: got 'gpu-1'; "
        "each node may be listed once; it is listed twice"
    ]


def test_config_rejects_control_plane_host_without_address() -> None:
    problems = _control_plane_problems(hosts=["cpu-1"])
    assert problems == [
        "gpu-cluster:controlPlane.hosts[0]: got 'cpu-1'; "
        "node has no address in gpu-cluster:nodes; SSH needs one"
    ]


def test_config_rejects_enabled_control_plane_without_ssh_key() -> None:
    problems = _control_plane_problems(sshPrivateKey="")
    assert problems == [
        "gpu-cluster:sshPrivateKey: got ''; required when controlPlane.enabled is true "
        "(pulumi config set --secret gpu-cluster:sshPrivateKey < key), "
        "unless controlPlane.sshAgent is true"
    ]


def test_config_rejects_enabled_control_plane_without_user_or_hosts() -> None:
    problems = _control_plane_problems(user=None, hosts=None)
    assert problems == [
        "gpu-cluster:controlPlane.user: got ''; required when controlPlane.enabled is true",
        "gpu-cluster:controlPlane.hosts: got []; required when controlPlane.enabled is true",
    ]


def test_config_rejects_ssh_key_that_is_not_a_private_key_without_showing_it() -> None:
    problems = _control_plane_problems(sshPrivateKey="hunter2")
    assert problems == [
        "gpu-cluster:sshPrivateKey: got '[secret, not shown]'; "
        "expected a private key (-----BEGIN ... PRIVATE KEY-----)"
    ]
    assert "hunter2" not in " ".join(problems)


def test_config_rejects_ready_timeout_below_30_seconds() -> None:
    problems = _control_plane_problems(readyTimeoutSeconds=5)
    assert problems == [
        "gpu-cluster:controlPlane.readyTimeoutSeconds: got 5; expected an integer from 30 to 1800"
    ]


# --------------------------------------------------------------------------- gpuOperator, monitoring


def test_config_helm_layers_are_off_by_default() -> None:
    config = parse_stack_config({})
    assert config.gpu_operator.enabled is False
    assert config.monitoring.enabled is False
    assert config.gpu_operator.version == "v26.3.3"
    assert config.monitoring.version == "88.2.0"


def test_config_dev_runs_preinstalled_drivers_with_time_slicing() -> None:
    dev = parse_stack_config(decode_raw_config(stack_config("dev")))
    assert dev.gpu_operator.enabled
    assert (dev.gpu_operator.driver.enabled, dev.gpu_operator.toolkit.enabled) == (False, False)
    time_slicing = dev.gpu_operator.device_plugin.time_slicing
    assert time_slicing is not None
    assert time_slicing.replicas == 4
    assert dev.monitoring.enabled


def test_config_prod_installs_drivers_and_uses_single_mig() -> None:
    prod = parse_stack_config(decode_raw_config(stack_config("prod")))
    assert prod.gpu_operator.driver.enabled
    assert prod.gpu_operator.mig.strategy == "single"
    assert prod.gpu_operator.toolkit.env["CONTAINERD_SET_AS_DEFAULT"] == "true"


def test_config_toolkit_env_numbers_and_booleans_become_strings() -> None:
    config = _parse(gpuOperator={"toolkit": {"env": {"A": True, "B": 3, "C": "x"}}})
    assert config.gpu_operator.toolkit.env == {"A": "true", "B": "3", "C": "x"}


def test_config_grafana_password_becomes_a_pulumi_secret() -> None:
    config = _parse(monitoring={"enabled": True}, grafanaAdminPassword="pw-1")
    password = config.grafana_admin_password
    assert isinstance(password, pulumi.Output)
    assert "pw-1" not in repr(config)
    loop = asyncio.get_event_loop()  # the loop the Output was created on
    assert loop.run_until_complete(password.is_secret())
    assert loop.run_until_complete(password.future()) == "pw-1"


def test_config_rejects_unknown_mig_strategy() -> None:
    problems = _problems(gpuOperator={"mig": {"strategy": "auto"}})
    assert problems == [
        "gpu-cluster:gpuOperator.mig.strategy: got 'auto'; allowed: none, single, mixed"
    ]


@pytest.mark.parametrize("replicas", [1, 65, "4"])
def test_config_rejects_time_slicing_replicas_out_of_range(replicas: Any) -> None:
    problems = _problems(gpuOperator={"devicePlugin": {"timeSlicing": {"replicas": replicas}}})
    assert problems == [
        f"gpu-cluster:gpuOperator.devicePlugin.timeSlicing.replicas: got {replicas!r}; "
        "expected an integer from 2 to 64"
    ]


def test_config_rejects_time_slicing_with_mixed_mig() -> None:
    problems = _problems(
        gpuOperator={"devicePlugin": {"timeSlicing": {"replicas": 2}}, "mig": {"strategy": "mixed"}}
    )
    assert problems == [
        "gpu-cluster:gpuOperator.mig.strategy: got 'mixed'; time-slicing shares nvidia.com/gpu, "
        "which needs mig.strategy none or single"
    ]


def test_config_rejects_toolkit_env_name_that_is_not_a_variable() -> None:
    problems = _problems(gpuOperator={"toolkit": {"env": {"CONTAINERD-CONFIG": "x"}}})
    assert problems == [
        "gpu-cluster:gpuOperator.toolkit.env.CONTAINERD-CONFIG: got 'CONTAINERD-CONFIG'; "
        "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)"
    ]


def test_config_rejects_toolkit_env_value_that_is_an_object() -> None:
    problems = _problems(gpuOperator={"toolkit": {"env": {"A": {"b": 1}}}})
    assert problems == [
        "gpu-cluster:gpuOperator.toolkit.env.A: got {'b': 1}; "
        "expected a string (numbers and booleans become strings)"
    ]


@pytest.mark.parametrize(
    "version", ["latest", "26.3", ">=v26.0.0", "", "v26.03.3", "26.3.3-", "v26.3.\u0663"]
)
def test_config_rejects_unpinned_gpu_operator_version(version: str) -> None:
    problems = _problems(gpuOperator={"version": version})
    assert problems == [
        f"gpu-cluster:gpuOperator.version: got {version!r}; "
        "expected a pinned chart version, e.g. v26.3.3"
    ]


def test_config_rejects_monitoring_repository_that_is_not_a_chart_source() -> None:
    problems = _problems(monitoring={"repository": "prometheus-community"})
    assert problems == [
        "gpu-cluster:monitoring.repository: got 'prometheus-community'; "
        "expected a chart repository URL (https://... or http://...), an OCI registry "
        "(oci://host/path), or an existing local chart archive (.tgz) or chart directory "
        "(with Chart.yaml)"
    ]


def test_config_rejects_gpu_operator_namespace_that_is_not_a_label() -> None:
    problems = _problems(gpuOperator={"namespace": "GPU_Operator"})
    assert problems == [
        "gpu-cluster:gpuOperator.namespace: got 'GPU_Operator'; "
        "expected a namespace name (DNS-1123 label) for the layer to create, not one every "
        "cluster already has (default, kube-system, kube-public, kube-node-lease)"
    ]


@pytest.mark.parametrize("namespace", ["kube-system", "default"])
def test_config_rejects_a_built_in_namespace_for_a_layer_that_creates_its_own(
    namespace: str,
) -> None:
    (problem,) = _problems(monitoring={"namespace": namespace})
    assert problem.startswith(f"gpu-cluster:monitoring.namespace: got {namespace!r}; ")


def test_config_rejects_two_layers_in_one_namespace() -> None:
    problems = _problems(
        gpuOperator={"enabled": True, "namespace": "gpu"},
        monitoring={"enabled": True, "namespace": "gpu"},
        grafanaAdminPassword="pw-1",
    )
    assert problems == [
        "gpu-cluster:monitoring.namespace: got 'gpu'; already the namespace of gpuOperator; "
        "each layer creates its own namespace"
    ]


def test_config_rejects_the_admission_gates_namespace_for_another_layer() -> None:
    problems = _problems(gpuOperator={"enabled": True, "namespace": "gpu-admission"})
    assert problems == [
        "gpu-cluster:gpuOperator.namespace: got 'gpu-admission'; already the OpaGate layer's own "
        "namespace; each layer creates its own namespace"
    ]


def test_config_rejects_non_boolean_driver_switch() -> None:
    problems = _problems(gpuOperator={"driver": {"enabled": "no"}})
    assert problems == ["gpu-cluster:gpuOperator.driver.enabled: got 'no'; expected true or false"]


def test_config_rejects_unknown_gpu_operator_key() -> None:
    problems = _problems(gpuOperator={"drivers": {"enabled": False}})
    assert len(problems) == 1
    assert problems[0].startswith("gpu-cluster:gpuOperator.drivers: unknown key; allowed: enabled,")


def test_config_rejects_gpu_operator_values_that_are_not_an_object() -> None:
    problems = _problems(gpuOperator={"values": ["driver.enabled=false"]})
    assert problems == [
        "gpu-cluster:gpuOperator.values: got ['driver.enabled=false']; "
        "expected an object of chart values"
    ]


def test_config_rejects_monitoring_without_a_grafana_password() -> None:
    problems = _problems(monitoring={"enabled": True})
    assert problems == [
        "gpu-cluster:grafanaAdminPassword: got ''; required when monitoring.enabled is true "
        "(pulumi config set --secret gpu-cluster:grafanaAdminPassword), unless "
        "monitoring.grafanaAdminSecret names an existing Secret"
    ]


def test_config_rejects_both_grafana_password_sources() -> None:
    problems = _problems(
        monitoring={
            "enabled": True,
            "grafanaAdminSecret": "grafana-admin",
            "createNamespace": False,
        },
        grafanaAdminPassword="pw-2",
    )
    assert problems == [
        "gpu-cluster:monitoring.grafanaAdminSecret: got 'grafana-admin'; set either "
        "grafanaAdminPassword or monitoring.grafanaAdminSecret, not both"
    ]
    assert "pw-2" not in problems[0]


def test_config_rejects_non_string_grafana_password_without_showing_it() -> None:
    problems = _problems(grafanaAdminPassword=12345678)
    assert problems == [
        "gpu-cluster:grafanaAdminPassword: got '[secret, not shown]'; expected a string"
    ]


def test_config_rejects_bad_dcgm_scrape_interval() -> None:
    problems = _problems(monitoring={"dcgmScrapeInterval": "15 seconds"})
    assert problems == [
        "gpu-cluster:monitoring.dcgmScrapeInterval: got '15 seconds'; "
        "expected a Prometheus duration, e.g. 15s or 1m"
    ]


def test_config_rejects_a_second_dcgm_service_monitor() -> None:
    problems = _problems(
        gpuOperator={"values": {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}},
        monitoring={"enabled": True},
        grafanaAdminPassword="pw-3",
    )
    assert problems == [
        "gpu-cluster:gpuOperator.values.dcgmExporter.serviceMonitor.enabled: got True; "
        "MonitoringStack already creates the one ServiceMonitor for dcgm-exporter; leave this unset"
    ]


def test_config_rejects_ssh_key_stored_in_plain_text() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {
                "nodes": _CP_NODES,
                "sshPrivateKey": _CP_KEY,
                "controlPlane": {
                    "enabled": True,
                    "user": "ops",
                    "hosts": ["cp-1"],
                    "hostKeys": _HOST_KEYS,
                },
            },
            secret_keys=set(),
        )
    problems = [str(p) for p in excinfo.value.problems]
    assert problems == [
        "gpu-cluster:sshPrivateKey: got '[plain text, not shown]'; must be stored encrypted: "
        "pulumi config set --secret gpu-cluster:sshPrivateKey < key"
    ]
    assert "PRIVATE KEY" not in str(excinfo.value)


def test_config_rejects_grafana_password_stored_in_plain_text() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {"monitoring": {"enabled": True}, "grafanaAdminPassword": "pw-4"}, secret_keys=set()
        )
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:grafanaAdminPassword: got '[plain text, not shown]'; must be stored "
        "encrypted: pulumi config set --secret gpu-cluster:grafanaAdminPassword"
    ]


def test_config_accepts_grafana_password_stored_encrypted() -> None:
    config = parse_stack_config(
        {"monitoring": {"enabled": True}, "grafanaAdminPassword": "pw-5"},
        secret_keys={"grafanaAdminPassword"},
    )
    assert config.grafana_admin_password is not None


# --------------------------------------------------------------------------- values that load
# today in other tools and break the cluster later: each class has its rejection


def test_config_rejects_kubeconfig_path_that_does_not_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "admin.conf")
    problems = _problems(kubeconfig=missing)
    assert problems == [
        f"gpu-cluster:kubeconfig: got {missing!r}; no such file; expected the path of a "
        "kubeconfig file, or empty for $KUBECONFIG or ~/.kube/config"
    ]


def test_config_accepts_kubeconfig_path_that_exists(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    path.write_text("apiVersion: v1\nkind: Config\n")
    assert _parse(kubeconfig=str(path)).kubeconfig == str(path)


def test_config_rejects_kubeconfig_file_that_is_not_a_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    path.write_text("clusters: [unclosed\n")
    problems = _problems(kubeconfig=str(path))
    assert problems == [
        f"gpu-cluster:kubeconfig: got {str(path)!r}; expected a kubeconfig (a YAML object with "
        "clusters, contexts, users)"
    ]


def test_config_rejects_kube_context_missing_from_the_given_kubeconfig(tmp_path: Path) -> None:
    path = tmp_path / "admin.conf"
    path.write_text("apiVersion: v1\nkind: Config\ncontexts:\n- name: lab\n  context: {}\n")
    assert _parse(kubeconfig=str(path), kubeContext="lab").kubernetes.context == "lab"
    problems = _problems(kubeconfig=str(path), kubeContext="prod")
    assert problems == [
        "gpu-cluster:kubeContext: got 'prod'; no context of that name in the kubeconfig that "
        "gpu-cluster:kubeconfig gives"
    ]


def test_config_rejects_kubeconfig_content_in_plain_text_without_showing_it() -> None:
    content = "apiVersion: v1\nkind: Config\nusers:\n- name: admin\n  user: {token: t0ps3cret}\n"
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config({"kubeconfig": content}, secret_keys=set())
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:kubeconfig: got '[plain text, not shown]'; kubeconfig content must be "
        "stored encrypted: pulumi config set --secret gpu-cluster:kubeconfig < kubeconfig"
    ]
    assert "t0ps3cret" not in str(excinfo.value)


def test_config_accepts_kubeconfig_content_stored_encrypted() -> None:
    content = "apiVersion: v1\nkind: Config\n"
    config = parse_stack_config({"kubeconfig": content}, secret_keys={"kubeconfig"})
    assert config.kubernetes.kubeconfig == content


def test_config_never_shows_a_value_stored_as_a_secret() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {"kubeconfig": "/nonexistent/t0ps3cret", "kubeContext": 7},
            secret_keys={"kubeconfig", "kubeContext"},
        )
    assert [str(p) for p in excinfo.value.problems] == [
        "gpu-cluster:kubeconfig: got '[secret, not shown]'; no such file; expected the path of "
        "a kubeconfig file, or empty for $KUBECONFIG or ~/.kube/config",
        "gpu-cluster:kubeContext: got '[secret, not shown]'; expected a string",
    ]


def test_config_never_shows_the_value_of_a_mistyped_nested_key() -> None:
    problems = _control_plane_problems(sshPrivatekey=_CP_KEY)
    assert problems == [
        "gpu-cluster:controlPlane.sshPrivatekey: unknown key; allowed: enabled, user, port, "
        "sshAgent, hostKeys, hosts, kubeletHosts, admissionPlugins, featureGates, "
        "runtimeConfig, readyTimeoutSeconds, stateDir"
    ]


@pytest.mark.parametrize("weight", [101, 1000])
def test_config_rejects_scheduler_weight_above_kube_scheduler_maximum(weight: int) -> None:
    problems = _problems(scheduler={"resourceWeights": {"nvidia.com/gpu": weight}})
    assert problems == [
        f"gpu-cluster:scheduler.resourceWeights.nvidia.com/gpu: got {weight}; "
        "expected an integer weight from 1 to 100"
    ]


def test_config_rejects_default_scheduler_as_the_binpack_scheduler_name() -> None:
    (problem,) = _problems(scheduler={"name": "default-scheduler"})
    assert problem.startswith("gpu-cluster:scheduler.name: got 'default-scheduler'; ")
    assert "other than default-scheduler" in problem


@pytest.mark.parametrize("name", ["gpu", "nvidia_gpu", "GPU", "requests.cpu", "nvidia.com/"])
def test_config_rejects_weight_for_a_resource_no_pod_can_request(name: str) -> None:
    problems = _problems(scheduler={"resourceWeights": {"nvidia.com/gpu": 100, name: 1}})
    assert problems == [
        f"gpu-cluster:scheduler.resourceWeights.{name}: got {name!r}; expected a resource a "
        "pod can request: cpu, memory, ephemeral-storage, hugepages-<size> or domain/name "
        "(e.g. nvidia.com/gpu)"
    ]


@pytest.mark.parametrize(
    "weights", [{"cpu": 1, "memory": 1}, {"example.com/dongle": 100, "cpu": 1}]
)
def test_config_rejects_weights_without_any_gpu_resource(weights: dict[str, int]) -> None:
    problems = _problems(scheduler={"resourceWeights": weights})
    assert problems == [
        f"gpu-cluster:scheduler.resourceWeights: got {weights!r}; expected at least one GPU "
        "resource (nvidia.com/gpu, nvidia.com/gpu.shared, amd.com/gpu, gpu.intel.com/i915, "
        "gpu.intel.com/xe, nvidia.com/mig-<profile>, or one of scheduler.gpuResources); "
        "without one the profile does not bin-pack GPU pods"
    ]


def test_config_accepts_weights_for_native_and_extended_resources() -> None:
    weights = {"nvidia.com/mig-1g.10gb": 100, "hugepages-2Mi": 1, "ephemeral-storage": 1}
    profile = _parse(scheduler={"resourceWeights": weights}).scheduler.profile
    assert [(w.name, w.weight) for w in profile.resources] == list(weights.items())


@pytest.mark.parametrize(
    "name", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "amd.com/gpu"]
)
def test_config_rejects_extended_resource_that_a_device_plugin_owns(name: str) -> None:
    (problem,) = _problems(extendedResources={"gpu-1": {name: 8}})
    assert problem.startswith(f"gpu-cluster:extendedResources.gpu-1.{name}: got {name!r}; ")
    assert "belong to a device plugin" in problem


def test_config_rejects_feature_gate_unknown_to_kubernetes() -> None:
    problems = _control_plane_problems(featureGates={"InPlacePodVerticalScalling": True})
    assert problems == [
        "gpu-cluster:controlPlane.featureGates.InPlacePodVerticalScalling: got "
        "'InPlacePodVerticalScalling'; not a feature gate known to Kubernetes v1.37.2; "
        "kube-apiserver and the kubelet refuse to start on an unknown gate"
    ]


def test_config_rejects_feature_gate_newer_than_the_kubernetes_version() -> None:
    problems = _control_plane_problems(
        kubernetesVersion="v1.35.4", featureGates={"NativeHistograms": True}
    )
    assert problems == [
        "gpu-cluster:controlPlane.featureGates.NativeHistograms: got 'NativeHistograms'; this "
        "gate first appears in v1.36, so kubernetesVersion v1.35 does not know it; "
        "kube-apiserver would refuse to start"
    ]


@pytest.mark.parametrize("address", ["10.0.0.11:22", "ssh://10.0.0.11", "cp-1/x", "cp 1", "-cp"])
def test_config_rejects_node_address_that_is_not_a_host_or_ip(address: str) -> None:
    problems = _problems(nodes=[{"name": "cp-1", "address": address}])
    assert problems == [
        f"gpu-cluster:nodes[0].address: got {address!r}; expected a host name or an IP address "
        "(no port, scheme or path), e.g. 10.0.0.11"
    ]


@pytest.mark.parametrize("address", ["10.0.0.11", "fd00::11", "cp-1.lab.example", "CP-1"])
def test_config_accepts_node_address_that_is_a_host_or_ip(address: str) -> None:
    assert _parse(nodes=[{"name": "cp-1", "address": address}]).nodes[0].address == address


@pytest.mark.parametrize("name", ["gpu-\u0661", "gpu-1\n", "g\u00e9pu-1"])
def test_config_rejects_node_name_that_is_not_ascii_or_ends_in_a_newline(name: str) -> None:
    problems = _problems(nodes=[{"name": name}])
    assert problems == [
        f"gpu-cluster:nodes[0].name: got {name!r}; expected a Kubernetes node name "
        "(DNS-1123 subdomain)"
    ]


@pytest.mark.parametrize("version", ["v2.0.0", "v0.37.2", "v1.\u0663\u0667.2", "v1.37.2\n"])
def test_config_rejects_kubernetes_version_other_than_major_1_in_ascii(version: str) -> None:
    problems = _problems(kubernetesVersion=version)
    assert problems == [
        f"gpu-cluster:kubernetesVersion: got {version!r}; expected vMAJOR.MINOR.PATCH with "
        "major version 1, e.g. v1.37.2"
    ]


def test_config_key_written_without_a_value_takes_its_default() -> None:
    config = _parse(scheduler={"replicas": None}, admission=None)
    assert (config.scheduler.replicas, config.admission.engine) == (2, "mutating-admission-policy")


def test_config_refuses_fragmentation_scoring_without_an_image() -> None:
    assert _problems(scheduler={"scoring": "fragmentation"}) == [
        "gpu-cluster:scheduler.image: got 'unset'; scoring fragmentation needs the "
        "GpuFragmentation plugin, which registry.k8s.io/kube-scheduler does not have: set "
        "scheduler.image to an image built from scheduler/ (README), or use scoring binpack"
    ]


@pytest.mark.parametrize(
    "image", ["registry.example.com/gpu-binpack-scheduler", "Gpu Scheduler:1", "a//b:1", "a:"]
)
def test_config_refuses_a_scheduler_image_without_tag_or_digest(image: str) -> None:
    (problem,) = _problems(scheduler={"image": image})
    assert problem.startswith(f"gpu-cluster:scheduler.image: got {image!r}; expected an image ")


def test_config_refuses_binpack_keys_with_fragmentation_scoring() -> None:
    problems = _problems(
        scheduler={
            "scoring": "fragmentation",
            "image": "registry.example.com/gpu-binpack-scheduler:v1.37.2",
            "balancedAllocation": {"weight": 10},
        }
    )
    assert len(problems) == 1
    assert problems[0].startswith("gpu-cluster:scheduler.balancedAllocation: got ")
    assert "applies to scoring binpack only" in problems[0]


def test_config_refuses_an_unknown_scoring() -> None:
    assert _problems(scheduler={"scoring": "fgd"}) == [
        "gpu-cluster:scheduler.scoring: got 'fgd'; allowed: binpack, fragmentation"
    ]
