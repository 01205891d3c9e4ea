"""The sample table is well formed; tests/integration/test_opa_gate_live.py runs it live."""

from __future__ import annotations

from components.gpu_resources import DRA_DEVICE_CLASSES
from components.tainted_gpu_pool.settings import Taint
from tests.opa_gate.gate_samples import (
    DEBUG_CONTAINER,
    DRA_ENGINES,
    NAMESPACES,
    ROUTING_ENGINE,
    VERDICTS,
    Sample,
    load_samples,
)


def test_gate_samples_each_has_a_verdict_per_engine_kind() -> None:
    table = load_samples()
    assert table.samples
    for sample in table.samples:
        assert sample.refuse in VERDICTS and sample.route in VERDICTS, sample.name
        # Only the routing engine routes.
        assert sample.refuse != "routed", sample.name


def test_gate_samples_names_are_unique() -> None:
    names = [s.name for s in load_samples().samples]
    assert len(names) == len(set(names))


def test_gate_samples_cover_each_verdict_of_each_engine_kind() -> None:
    table = load_samples()
    assert {s.verdict("opa") for s in table.samples} == {"allowed", "refused"}
    assert {s.verdict(ROUTING_ENGINE) for s in table.samples} == set(VERDICTS)


def test_gate_samples_name_a_known_namespace_and_complete_identities() -> None:
    for sample in load_samples().samples:
        assert sample.namespace in NAMESPACES, sample.name
        assert sample.identity is None or sample.identity.user, sample.name


def test_gate_samples_keep_container_env_and_security_context() -> None:
    (sample,) = [s for s in load_samples().samples if s.name == "operator-cuda-validator-workload"]
    (init,) = sample.pod("p")["spec"]["initContainers"]
    assert init["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert init["securityContext"] == {"privileged": True}


def test_gate_samples_put_the_operators_namespace_into_their_creators() -> None:
    (sample,) = [s for s in load_samples().samples if s.name == "operator-cuda-validator-workload"]
    creator = sample.creator("gpu-op-1", "team-a")
    assert creator is not None
    assert creator.user == "system:serviceaccount:gpu-op-1:nvidia-operator-validator"
    assert "system:serviceaccounts:gpu-op-1" in creator.groups


def test_gate_samples_put_the_pods_namespace_into_their_creators() -> None:
    (sample,) = [
        s for s in load_samples().samples if s.name == "tenant-account-named-like-the-validator"
    ]
    creator = sample.creator("gpu-op-1", "team-a")
    assert creator is not None
    assert creator.user == "system:serviceaccount:team-a:nvidia-operator-validator"
    assert "system:serviceaccounts:team-a" in creator.groups


def test_gate_samples_pool_taint_is_a_pool_taint_setting() -> None:
    taint = Taint.model_validate(load_samples().pool_taint)
    assert taint.toleration()["key"] == "nvidia.com/gpu"


def test_gate_samples_debug_rows_add_one_named_ephemeral_container() -> None:
    debugging = [s for s in load_samples().samples if s.debug is not None]
    assert {s.verdict("opa") for s in debugging} == {"allowed", "refused"}
    for sample in debugging:
        # An update of a running pod is never routed; what is judged is the added container.
        assert "routed" not in (sample.refuse, sample.route), sample.name
        container = sample.debug_container()
        assert container["name"] == DEBUG_CONTAINER
        assert "resources" not in container
    bound = [s for s in debugging if s.bind is not None]
    assert bound and all(s.spec.get("schedulerName") == load_samples().scheduler for s in bound)


def test_gate_samples_dra_rows_are_judged_by_the_native_engines_only() -> None:
    table = load_samples()
    assert table.dra.samples
    for sample in table.dra.samples:
        assert sample.refuse in VERDICTS and sample.route in VERDICTS, sample.name
        assert sample.refuse != "routed", sample.name
    assert "opa" not in DRA_ENGINES and ROUTING_ENGINE in DRA_ENGINES


def test_gate_samples_names_are_unique_across_both_tables() -> None:
    table = load_samples()
    names = [s.name for s in [*table.samples, *table.dra.samples]]
    assert len(names) == len(set(names))


def test_gate_samples_dra_objects_ask_for_known_classes_only() -> None:
    dra = load_samples().dra
    known = {*dra.device_classes, *dra.other_classes}
    assert dra.device_classes == DRA_DEVICE_CLASSES
    assert not set(dra.other_classes) & set(DRA_DEVICE_CLASSES)
    for obj in dra.objects:
        assert obj.classes() <= known, obj.name


def _sets_visible_devices(sample: Sample) -> bool:
    return any(
        e.get("name") == "NVIDIA_VISIBLE_DEVICES"
        for c in sample.spec.get("containers", [])
        for e in c.get("env", [])
    )


def test_gate_samples_dra_rows_cover_gpu_and_other_claims_of_both_kinds() -> None:
    dra = load_samples().dra
    gpu = {o.name for o in dra.objects if o.classes() & set(dra.device_classes)}
    kinds_of_gpu = {o.kind for o in dra.objects if o.name in gpu}
    kinds_of_others = {o.kind for o in dra.objects if o.name not in gpu}
    assert kinds_of_gpu == kinds_of_others == {"ResourceClaimTemplate", "ResourceClaim"}
    assert any(isinstance(r, tuple) for o in dra.objects if o.name in gpu for r in o.requests)
    classes = set(load_samples().priority_classes)
    verdicts = {
        s.name: (dra.asks_for_gpu(s), s.route)
        for s in dra.samples
        if s.spec.get("priorityClassName") not in classes
        and not _sets_visible_devices(s)
        and not s.spec.get("tolerations")
    }
    # Every GPU claim pod is routed or refused; every other claim pod left alone (unless it
    # names one of the stack's PriorityClasses, sets NVIDIA_VISIBLE_DEVICES or tolerates
    # taints: the pool's rule judges it).
    for name, (asks, route) in verdicts.items():
        assert (route != "allowed") == asks or name.endswith("on-the-gates-scheduler"), name


def test_gate_samples_dra_objects_are_resource_api_objects() -> None:
    dra = load_samples().dra
    (template,) = [o for o in dra.objects if o.name == "nic-or-gpu"]
    manifest = template.manifest()
    assert manifest["apiVersion"] == "resource.k8s.io/v1"
    (request,) = manifest["spec"]["spec"]["devices"]["requests"]
    assert [a["deviceClassName"] for a in request["firstAvailable"]] == [
        "nic.example.com",
        "gpu.nvidia.com",
    ]
    (claim,) = [o for o in dra.objects if o.name == "team-gpus"]
    (exactly,) = claim.manifest()["spec"]["devices"]["requests"]
    assert exactly["exactly"]["deviceClassName"] == "gpu.nvidia.com"
