"""The config module: defaults, the dev/prod stacks, and one test per rejected input."""

from __future__ import annotations

import asyncio
from typing import Any

import pulumi
import pytest

from stack_config import ConfigError, StackConfig, decode_raw_config, parse_stack_config
from tests.conftest import stack_config


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


@pytest.mark.parametrize("stack", ["dev", "prod", "local"])
def test_config_stack_files_are_valid(stack: str) -> None:
    config = parse_stack_config(decode_raw_config(stack_config(stack)))
    assert config.gpu_pool.nodes
    assert set(config.gpu_pool.nodes) <= {n.name for n in config.nodes}


def test_config_dev_and_prod_differ_in_nodes_version_and_taint_effect() -> None:
    dev = parse_stack_config(decode_raw_config(stack_config("dev")))
    prod = parse_stack_config(decode_raw_config(stack_config("prod")))
    assert set(dev.gpu_pool.nodes).isdisjoint(prod.gpu_pool.nodes)
    assert dev.kubernetes_version != prod.kubernetes_version
    assert (dev.gpu_pool.taint.effect, prod.gpu_pool.taint.effect) == ("NoSchedule", "NoExecute")


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
    assert problems == [
        "gpu-cluster:gpuPool.taint.effect: got 'NoScheduled'; "
        "allowed: NoSchedule, PreferNoSchedule, NoExecute"
    ]


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
        "(lowercase alphanumerics and '-', <= 63)"
    ]


def test_config_rejects_unknown_top_level_key() -> None:
    problems = _problems(gpuPools={"nodes": []})
    assert len(problems) == 1
    assert problems[0].startswith(
        "gpu-cluster:gpuPools: got {'nodes': []}; unknown key; declared keys: "
    )
    assert "gpuPool," in problems[0]


def test_config_rejects_unknown_nested_key() -> None:
    problems = _problems(gpuPool={"nodes": ["gpu-1"], "taints": {}})
    assert problems == [
        "gpu-cluster:gpuPool.taints: got {}; unknown key; allowed: nodes, taint, labels"
    ]


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
        "gpu-cluster:kubernetesVersion: got '1.34'; expected vMAJOR.MINOR.PATCH, e.g. v1.37.2"
    ]


def test_config_warns_on_untested_kubernetes_version() -> None:
    config = _parse(kubernetesVersion="v1.30.2")
    assert config.warnings == (
        "gpu-cluster:kubernetesVersion v1.30.2 is outside the tested range v1.35-v1.37",
    )


def test_config_reports_every_problem_together() -> None:
    with pytest.raises(ConfigError) as excinfo:
        _parse(
            gpuPool={"nodes": ["gpu-9"], "taint": {"effect": "Never"}},
            extendedResources={"cpu-1": {"dongle": -2}},
            scheduler={"name": "Bad_Name"},
        )
    keys = [p.key for p in excinfo.value.problems]
    assert keys == [
        "gpuPool.nodes[0]",
        "gpuPool.taint.effect",
        "extendedResources.cpu-1.dongle",
        "scheduler.name",
    ]
    assert "4 problem(s)" in str(excinfo.value)


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


@pytest.mark.parametrize("weight", [0, -3, 1.5, "100"])
def test_config_rejects_scheduler_weight_below_one(weight: Any) -> None:
    problems = _problems(scheduler={"resourceWeights": {"nvidia.com/gpu": weight}})
    assert problems == [
        f"gpu-cluster:scheduler.resourceWeights.nvidia.com/gpu: got {weight!r}; "
        "expected an integer weight >= 1"
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


def test_config_rejects_unknown_admission_engine() -> None:
    problems = _problems(admission={"engine": "gatekeeper"})
    assert problems == [
        "gpu-cluster:admission.engine: got 'gatekeeper'; allowed: opa, validating-admission-policy"
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
_HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEq4MWWZYkl1AwbDTXxi4kpYJ5bbhKzzvLyFun5BnLK0"
_CP_HOST_KEYS = {"cp-1": f"{_HOST_KEY} root@cp-1", "gpu-1": _HOST_KEY}


def _control_plane_problems(sshPrivateKey: str = _CP_KEY, **fields: Any) -> list[str]:
    section = {"enabled": True, "user": "ops", "hosts": ["cp-1"], "hostKeys": _CP_HOST_KEYS}
    section.update(fields)
    with pytest.raises(ConfigError) as excinfo:
        parse_stack_config(
            {"nodes": _CP_NODES, "controlPlane": section, "sshPrivateKey": sshPrivateKey}
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
                "hostKeys": _CP_HOST_KEYS,
                "featureGates": {"InPlacePodVerticalScaling": True},
            },
        }
    )
    cp = config.control_plane
    # The key's comment is dropped: the SSH client compares type and key only.
    assert [(h.name, h.address, h.host_key) for h in cp.hosts] == [("cp-1", "10.0.0.11", _HOST_KEY)]
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


def test_config_rejects_enabled_control_plane_host_without_a_pinned_host_key() -> None:
    problems = _control_plane_problems(kubeletHosts=["gpu-1"], hostKeys={"cp-1": _HOST_KEY})
    assert problems == [
        "gpu-cluster:controlPlane.kubeletHosts[0]: got 'gpu-1'; no SSH host key in "
        "controlPlane.hostKeys; every host key is pinned (ssh-keyscan the host from a trusted "
        "network, or read /etc/ssh/*.pub on it)"
    ]


def test_config_rejects_a_host_key_that_is_not_a_public_key_line() -> None:
    problems = _control_plane_problems(hostKeys={"cp-1": "SHA256:abcdef"})
    assert problems[0] == (
        "gpu-cluster:controlPlane.hostKeys.cp-1: got 'SHA256:abcdef'; expected an OpenSSH public "
        "key line (ssh-ed25519 AAAA..., ecdsa-sha2-nistp256 AAAA... or ssh-rsa AAAA...)"
    )


def test_config_rejects_a_host_key_for_a_node_outside_the_inventory() -> None:
    problems = _control_plane_problems(hostKeys={**_CP_HOST_KEYS, "cp-9": _HOST_KEY})
    assert problems == [
        "gpu-cluster:controlPlane.hostKeys.cp-9: got 'cp-9'; node is not in gpu-cluster:nodes"
    ]


def test_config_rejects_a_relative_state_dir() -> None:
    problems = _control_plane_problems(stateDir="etc/gpu-cluster")
    assert problems == [
        "gpu-cluster:controlPlane.stateDir: got 'etc/gpu-cluster'; expected an absolute path "
        "of letters, digits, '.', '_' and '-'"
    ]


def test_config_rejects_the_removed_persist_kubeadm_config_key() -> None:
    (problem,) = _control_plane_problems(persistKubeadmConfig=False)
    assert problem.startswith(
        "gpu-cluster:controlPlane.persistKubeadmConfig: got False; unknown key; allowed: "
    )


def test_config_warns_when_admission_plugins_come_from_another_minor() -> None:
    config = parse_stack_config(
        {
            "kubernetesVersion": "v1.35.4",
            "nodes": _CP_NODES,
            "sshPrivateKey": _CP_KEY,
            "controlPlane": {
                "enabled": True,
                "user": "ops",
                "hosts": ["cp-1"],
                "hostKeys": _CP_HOST_KEYS,
                "admissionPlugins": ["ExtendedResourceToleration"],
            },
        }
    )
    assert config.warnings == (
        "controlPlane.admissionPlugins checked against the plugins of kube-apiserver v1.37.2: "
        "none generated for v1.35.4 (python -m tools.admission_plugins --apiserver <its "
        "kube-apiserver>)",
    )


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
    assert (dev.gpu_operator.driver_enabled, dev.gpu_operator.toolkit_enabled) == (False, False)
    assert dev.gpu_operator.time_slicing is not None
    assert dev.gpu_operator.time_slicing.replicas == 4
    assert dev.monitoring.enabled


def test_config_prod_installs_drivers_and_uses_single_mig() -> None:
    prod = parse_stack_config(decode_raw_config(stack_config("prod")))
    assert prod.gpu_operator.driver_enabled
    assert prod.gpu_operator.mig_strategy == "single"
    assert prod.gpu_operator.toolkit_env["CONTAINERD_SET_AS_DEFAULT"] == "true"


def test_config_toolkit_env_numbers_and_booleans_become_strings() -> None:
    config = _parse(gpuOperator={"toolkit": {"env": {"A": True, "B": 3, "C": "x"}}})
    assert config.gpu_operator.toolkit_env == {"A": "true", "B": "3", "C": "x"}


def test_config_grafana_password_becomes_a_pulumi_secret() -> None:
    config = _parse(monitoring={"enabled": True}, grafanaAdminPassword="pw-1")
    password = config.monitoring.grafana_admin_password
    assert isinstance(password, pulumi.Output)
    assert "pw-1" not in repr(config.monitoring)
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


@pytest.mark.parametrize("version", ["latest", "26.3", ">=v26.0.0", ""])
def test_config_rejects_unpinned_gpu_operator_version(version: str) -> None:
    problems = _problems(gpuOperator={"version": version})
    assert problems == [
        f"gpu-cluster:gpuOperator.version: got {version!r}; "
        "expected a pinned chart version, e.g. v26.3.3"
    ]


def test_config_rejects_monitoring_repository_that_is_not_a_url() -> None:
    problems = _problems(monitoring={"repository": "prometheus-community"})
    assert problems == [
        "gpu-cluster:monitoring.repository: got 'prometheus-community'; "
        "expected a Helm repository URL (https://..., http://... or oci://...)"
    ]


def test_config_rejects_gpu_operator_namespace_that_is_not_a_label() -> None:
    problems = _problems(gpuOperator={"namespace": "GPU_Operator"})
    assert problems == [
        "gpu-cluster:gpuOperator.namespace: got 'GPU_Operator'; "
        "expected a namespace name (DNS-1123 label)"
    ]


def test_config_rejects_non_boolean_driver_switch() -> None:
    problems = _problems(gpuOperator={"driver": {"enabled": "no"}})
    assert problems == ["gpu-cluster:gpuOperator.driver.enabled: got 'no'; expected true or false"]


def test_config_rejects_unknown_gpu_operator_key() -> None:
    problems = _problems(gpuOperator={"drivers": {"enabled": False}})
    assert len(problems) == 1
    assert problems[0].startswith(
        "gpu-cluster:gpuOperator.drivers: got {'enabled': False}; unknown key; allowed: enabled,"
    )


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
        monitoring={"enabled": True, "grafanaAdminSecret": "grafana-admin"},
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
                    "hostKeys": _CP_HOST_KEYS,
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
    assert config.monitoring.grafana_admin_password is not None
