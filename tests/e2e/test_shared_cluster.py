"""A cluster other teams use: the stack never takes over, nor deletes, what it did not create
(not even an object its claim lists from an `up` that failed before creating it), and it
notices when its claim on the cluster is gone (the real engine and provider on a local cluster,
as a user meets them)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client

from components.cluster_access import CLAIM_KEY, CLAIM_NAMESPACE, CLAIM_OBJECTS_KEY
from components.settings import PROJECT
from tools.harness.pulumi_engine import project_config as stack_config
from tools.harness.stack import AppliedStack, StackError

from .conftest import require_e2e_tools

STACK = "local"
TEAM_DATA = "team-data"


def _core(applied: AppliedStack) -> Any:
    return client.CoreV1Api(applied.api_client())


def _claim(applied: AppliedStack) -> Any:
    try:
        return _core(applied).read_namespaced_config_map(PROJECT, CLAIM_NAMESPACE)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def _resources_only(changes: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`changes` without provider instances (a config change updates the dynamic providers'
    default provider, which changes nothing on the cluster)."""
    return [(op, urn) for op, urn in changes if "::pulumi:providers:" not in urn]


def _another_teams_namespace(applied: AppliedStack, name: str) -> None:
    """Namespace `name` with a ConfigMap of another team's in it."""
    core = _core(applied)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(
        name,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=TEAM_DATA), data={"owner": "another team"}
        ),
    )


def _team_data(applied: AppliedStack, namespace: str) -> dict[str, str] | None:
    try:
        found = _core(applied).read_namespaced_config_map(TEAM_DATA, namespace)
    except client.exceptions.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return dict(found.data or {})


def test_an_existing_namespace_is_refused_and_can_be_used_without_being_owned(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Another team's `monitoring` namespace exists before the first `up`: preview and up stop
    naming it and the ways out, and nothing is applied (no claim, nodes untouched). With
    monitoring.createNamespace false the stack uses it once it has the Pod Security level the
    node exporter needs (refused until then, naming the label), and destroy leaves it and the
    team's data as they were."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-shared-ns")) as applied:
        monitoring = dict(stack_config(STACK, applied.overrides)["monitoring"])
        namespace = monitoring.get("namespace", "monitoring")
        _another_teams_namespace(applied, namespace)
        expected = (
            f"{PROJECT}:monitoring.namespace: got '{namespace}'; Namespace {namespace} already "
            "exists and this stack did not create it"
        )
        with pytest.raises(StackError) as previewed:
            applied.preview()
        assert expected in str(previewed.value)
        assert "monitoring.createNamespace: false" in str(previewed.value)
        with pytest.raises(StackError) as refused:
            applied.up()
        assert expected in str(refused.value)
        assert _claim(applied) is None
        assert applied.node_state() == applied.nodes_before
        assert applied.kubernetes_objects() == []

        applied.set_config({"monitoring": {**monitoring, "createNamespace": False}})
        # The team's namespace lacks what the layer's pods need: refused, naming the label.
        with pytest.raises(StackError) as unlabelled:
            applied.up()
        assert "pod-security.kubernetes.io/enforce" in str(unlabelled.value)
        assert applied.kubernetes_objects() == []
        _core(applied).patch_namespace(
            namespace,
            {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
        )
        applied.up()
        assert _resources_only(applied.up()) == []
        claim = _claim(applied)
        assert claim is not None
        assert f'"name": "{namespace}"' not in claim.data[CLAIM_OBJECTS_KEY]
        assert _team_data(applied, namespace) == {"owner": "another team"}

        applied.destroy()
        assert _team_data(applied, namespace) == {"owner": "another team"}
        assert _core(applied).read_namespace(namespace).status.phase == "Active"
        assert applied.node_state() == applied.nodes_before
        assert _claim(applied) is None


def test_a_deleted_claim_stops_both_stacks_until_its_owner_takes_it_back(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """An admin deletes the claim: the owning stack's plain `up` refuses (naming the claim and
    how to take it back), a second stack's `up` refuses to take over the first's objects and
    applies nothing, and the owner takes the claim back with retakeClaim and `up --refresh`;
    after that a plain `up` changes nothing and destroy leaves the cluster as before."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-claim-first")) as first:
        first.up()
        owner = _claim(first).data[CLAIM_KEY]
        # What the stack made, but the claim this test deletes.
        objects = [
            o
            for o in first.kubernetes_objects()
            if (o["kind"], o["namespace"], o["name"]) != ("ConfigMap", CLAIM_NAMESPACE, PROJECT)
        ]
        nodes = first.node_state()
        _core(first).delete_namespaced_config_map(PROJECT, CLAIM_NAMESPACE)

        with pytest.raises(StackError) as refused:
            first.up()
        assert f"{CLAIM_NAMESPACE}/{PROJECT} is gone" in str(refused.value)
        assert f"{PROJECT}:retakeClaim=true" in str(refused.value)
        assert _claim(first) is None

        second = AppliedStack(
            STACK, tmp_path_factory.mktemp("e2e-claim-second"), cluster=first.cluster, name="second"
        )
        with second:
            with pytest.raises(StackError) as taken:
                second.up()
            assert "already exists and this stack did not create it" in str(taken.value)
            assert _claim(first) is None
            assert second.kubernetes_objects() == []
            second.destroy()
        assert all(first.exists(o) for o in objects)
        assert first.node_state() == nodes

        first.set_config({"retakeClaim": True})
        first.up(refresh=True)
        assert _claim(first).data[CLAIM_KEY] == owner
        first.set_config()
        assert _resources_only(first.up()) == []
        assert all(first.exists(o) for o in objects)
        first.destroy()
        assert first.node_state() == first.nodes_before
        assert _claim(first) is None


@contextmanager
def _namespace_refused(applied: AppliedStack, name: str) -> Iterator[None]:
    """While inside: the API server refuses to create namespace `name` (a
    ValidatingAdmissionPolicy), so an `up` fails there, with the claim written and some of
    the stack's objects created."""
    api: Any = client.AdmissionregistrationV1Api(applied.api_client())
    policy = "e2e-no-namespace-yet"
    api.create_validating_admission_policy(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["namespaces"],
                        }
                    ]
                },
                "validations": [
                    {"expression": f"object.metadata.name != '{name}'", "message": "not yet"}
                ],
            },
        }
    )
    api.create_validating_admission_policy_binding(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]},
        }
    )
    _wait_until_creatable(applied, name, False)
    try:
        yield
    finally:
        api.delete_validating_admission_policy_binding(policy)
        api.delete_validating_admission_policy(policy)
        _wait_until_creatable(applied, name, True)


def _wait_until_creatable(applied: AppliedStack, name: str, creatable: bool) -> None:
    """Until a dry-run create of namespace `name` is admitted (or refused)."""
    core = _core(applied)
    deadline = time.monotonic() + 30
    while True:
        try:
            core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=name)), dry_run="All"
            )
            admitted = True
        except client.exceptions.ApiException:
            admitted = False
        if admitted == creatable:
            return
        assert time.monotonic() < deadline, f"namespace {name}: creatable is not {creatable}"
        time.sleep(0.2)


def test_an_object_made_after_a_failed_up_is_refused_not_taken_over(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The first `up` fails on the `monitoring` namespace, after writing the claim (which
    lists it) and creating other objects; another team then makes that namespace. The next
    `up` refuses it (the claim lists it, but the stack never created it) and applies nothing
    over it; with monitoring.createNamespace false the stack goes on, finishing the failed
    `up` (what it did create is its own), and destroy leaves the team's namespace and data."""
    require_e2e_tools()
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-failed-up")) as applied:
        monitoring = dict(stack_config(STACK, applied.overrides)["monitoring"])
        namespace = monitoring.get("namespace", "monitoring")
        with _namespace_refused(applied, namespace), pytest.raises(StackError) as failed:
            applied.up()
        assert "not yet" in str(failed.value)
        claim = _claim(applied)
        assert claim is not None
        assert f'"name": "{namespace}"' in claim.data[CLAIM_OBJECTS_KEY]
        created = applied.kubernetes_objects()
        assert created, "the failed up created nothing of the stack's"

        _another_teams_namespace(applied, namespace)
        with pytest.raises(StackError) as refused:
            applied.up()
        message = str(refused.value)
        assert (
            f"{PROJECT}:monitoring.namespace: got '{namespace}'; Namespace {namespace} already "
            "exists and this stack did not create it (the claim lists it because an earlier "
            "`up` declared it, but that `up` did not create it"
        ) in message
        assert "(1 problem(s))" in message, message  # not what the failed up made
        assert _team_data(applied, namespace) == {"owner": "another team"}
        assert _core(applied).read_namespace(namespace).metadata.annotations is None

        applied.set_config({"monitoring": {**monitoring, "createNamespace": False}})
        # The team's namespace lacks what the layer's pods need: refused, naming the label.
        with pytest.raises(StackError) as unlabelled:
            applied.up()
        assert "pod-security.kubernetes.io/enforce" in str(unlabelled.value)
        # Nothing applied: the stack holds what the failed `up` made, and no more.
        assert sorted(map(str, applied.kubernetes_objects())) == sorted(map(str, created))
        _core(applied).patch_namespace(
            namespace,
            {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}},
        )
        applied.up()
        assert _resources_only(applied.up()) == []
        assert all(applied.exists(o) for o in created)
        assert f'"name": "{namespace}"' not in _claim(applied).data[CLAIM_OBJECTS_KEY]
        assert _team_data(applied, namespace) == {"owner": "another team"}

        applied.destroy()
        assert _team_data(applied, namespace) == {"owner": "another team"}
        assert applied.node_state() == applied.nodes_before
        assert _claim(applied) is None


def test_a_release_helm_keeps_in_configmaps_is_found_and_never_taken_over(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider keeps the Helm releases as ConfigMaps (PULUMI_K8S_HELM_DRIVER=configmap,
    as HELM_DRIVER=configmap does for the helm CLI): the stack's second `up` finds them as its
    own (its mark in their values) and changes nothing. With the claim deleted, a second
    stack's `up` is refused naming each release and the ConfigMap Helm keeps it in, and
    applies nothing; the first takes its claim back and destroys as before."""
    require_e2e_tools()
    monkeypatch.setenv("PULUMI_K8S_HELM_DRIVER", "configmap")
    with AppliedStack(STACK, tmp_path_factory.mktemp("e2e-helm-configmaps")) as first:
        first.up()
        core = _core(first)
        operator = first.outputs["gpuOperatorNamespace"]
        stored = core.list_namespaced_config_map(
            operator, label_selector="owner=helm,name=gpu-operator"
        ).items
        assert [s.metadata.name for s in stored] == ["sh.helm.release.v1.gpu-operator.v1"]
        assert core.list_namespaced_secret(operator, label_selector="owner=helm").items == []
        assert _resources_only(first.up()) == []
        objects = [
            o
            for o in first.kubernetes_objects()
            if (o["kind"], o["namespace"], o["name"]) != ("ConfigMap", CLAIM_NAMESPACE, PROJECT)
        ]
        core.delete_namespaced_config_map(PROJECT, CLAIM_NAMESPACE)

        second = AppliedStack(
            STACK, tmp_path_factory.mktemp("e2e-helm-second"), cluster=first.cluster, name="second"
        )
        with second:
            with pytest.raises(StackError) as refused:
                second.up()
            message = str(refused.value)
            assert (
                f"a Helm release gpu-operator already exists in namespace {operator}, stored as "
                f"ConfigMap {operator}/sh.helm.release.v1.gpu-operator.v1, and this stack did not "
                "install it"
            ) in message
            assert "HELM_DRIVER=configmap helm uninstall gpu-operator" in message
            assert "a Helm release kube-prometheus-stack already exists" in message
            assert "is gone" not in message  # the second stack never claimed the cluster
            assert second.kubernetes_objects() == []
            second.destroy()
        assert all(first.exists(o) for o in objects)

        first.set_config({"retakeClaim": True})
        first.up(refresh=True)
        first.set_config()
        assert _resources_only(first.up()) == []
        first.destroy()
        assert core.list_namespaced_config_map(operator, label_selector="owner=helm").items == []
        assert first.node_state() == first.nodes_before
