"""The GPU pool's labels and taint stay out of the domains Kubernetes keeps for itself.

Checked where a user meets it: loading the stack config, before anything is declared.
"""

from __future__ import annotations

from typing import Any

import pytest

from stack_config import ConfigError, StackConfig, parse_stack_config

ADMIN_PREFIXES = (
    "node-role.kubernetes.io/<role> or [<prefix>.]node-restriction.kubernetes.io/<name>"
)


def _load_pool(**pool: Any) -> StackConfig:
    """A stack config of one GPU node and this gpuPool."""
    return parse_stack_config(
        {"nodes": [{"name": "gpu-1"}], "gpuPool": {"nodes": ["gpu-1"], **pool}}
    )


def _problems(**pool: Any) -> list[str]:
    with pytest.raises(ConfigError) as refused:
        _load_pool(**pool)
    return [str(p) for p in refused.value.problems]


@pytest.mark.parametrize(
    "key",
    [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/arch",
        "kubelet.kubernetes.io/anything",
        "k8s.io/pool",
        "node.k8s.io/pool",
    ],
)
def test_pool_label_domains_refuse_a_label_kubernetes_keeps_for_itself(key: str) -> None:
    domain = key.rpartition("/")[0]

    assert _problems(labels={key: "gpu"}) == [
        f"gpu-cluster:gpuPool.labels.{key}: got {key!r}; not a label the pool may set: {domain} "
        "is a domain Kubernetes keeps for its own labels; use your own domain (e.g. "
        f"gpu-cluster.io/pool), {ADMIN_PREFIXES}"
    ]


def test_pool_label_domains_report_every_refused_label_with_the_other_problems() -> None:
    problems = _problems(
        labels={
            "kubernetes.io/hostname": "gpu",
            "gpu-cluster.io/pool": "a b",
            "topology.kubernetes.io/zone": "rack-1",
        }
    )

    assert [p.split(": got", 1)[0] for p in problems] == [
        "gpu-cluster:gpuPool.labels.kubernetes.io/hostname",
        "gpu-cluster:gpuPool.labels.gpu-cluster.io/pool",
        "gpu-cluster:gpuPool.labels.topology.kubernetes.io/zone",
    ]


def test_pool_label_domains_refuse_the_control_plane_role() -> None:
    key = "node-role.kubernetes.io/control-plane"

    assert _problems(labels={key: ""}) == [
        f"gpu-cluster:gpuPool.labels.{key}: got {key!r}; not a label the pool may set: {key} "
        "marks control-plane nodes, the one node role Kubernetes defines; name the pool's role "
        "another way, e.g. node-role.kubernetes.io/gpu"
    ]


@pytest.mark.parametrize(
    "key",
    [
        "node-role.kubernetes.io/gpu",
        "node-restriction.kubernetes.io/gpu-pool",
        "example.com.node-restriction.kubernetes.io/fips",
        "gpu-cluster.io/pool",
        "pool",
        # Look-alikes outside the reserved domains.
        "mykubernetes.io/pool",
        "kubernetes.io.example.com/pool",
        "k8s.io.example.com/pool",
    ],
)
def test_pool_label_domains_accept_keys_left_to_administrators(key: str) -> None:
    assert _load_pool(labels={key: "gpu"}).gpu_pool.labels == {key: "gpu"}


@pytest.mark.parametrize(
    "key",
    [
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unschedulable",
        "node-role.kubernetes.io/control-plane",
        "kubernetes.io/gpu",
        "node.cloudprovider.kubernetes.io/uninitialized",
        "example.k8s.io/gpu",
    ],
)
def test_pool_label_domains_refuse_a_taint_in_kubernetes_own_domains(key: str) -> None:
    domain = key.rpartition("/")[0]

    assert _problems(taint={"key": key}) == [
        f"gpu-cluster:gpuPool.taint.key: got {key!r}; not a taint the pool may set: {domain} is a "
        "domain Kubernetes keeps for its own taints (node.kubernetes.io/not-ready, ...), which "
        "its controllers add and remove; use your own domain or a GPU resource's name (the "
        "default, nvidia.com/gpu)"
    ]


@pytest.mark.parametrize("key", ["nvidia.com/gpu", "example.com/accelerator", "gpu"])
def test_pool_label_domains_accept_a_taint_of_the_pool_s_own(key: str) -> None:
    assert _load_pool(taint={"key": key}).gpu_pool.taint.key == key


def test_pool_label_domains_keep_the_form_checks_of_labels_and_taints() -> None:
    assert _problems(labels={"a b/c": "gpu"}, taint={"key": "-gpu"}) == [
        "gpu-cluster:gpuPool.taint.key: got '-gpu'; expected a qualified name, e.g. nvidia.com/gpu",
        "gpu-cluster:gpuPool.labels.a b/c: got 'a b/c'; label key must be a qualified name",
    ]
