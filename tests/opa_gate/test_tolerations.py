"""Every GPU pod the gate keeps on the binpack scheduler tolerates the GPU pool's taint, or the
config is refused at load (components/opa_gate/settings.py, pool_toleration_problem()), or,
where only the cluster's API server can tell (ExtendedResourceToleration on it, not enabled by
the stack), the question is left to the preview (server_toleration_resource()) and its answer
judged by server_toleration_problem().

The matrix: engine x Kubernetes minor x the admission plugins controlPlane enables x the taint
(key, effect) x the kinds of GPU resource the pool advertises (whole GPUs, MIG profiles under
mig.strategy mixed, time-sliced GPUs renamed nvidia.com/gpu.shared, extended resources the stack
advertises on pool nodes). tests/integration/test_gate_tolerations_live.py checks the same
cells against what a real kube-apiserver gives each pod.
"""

from __future__ import annotations

from itertools import product
from typing import Any

import pytest

from components.gpu_operator.settings import GpuOperatorSettings
from components.gpu_resources import GpuResources
from components.opa_gate.settings import (
    ADMISSION_ENGINES,
    ROUTING_ENGINE,
    added_toleration,
    pool_resources,
    pool_toleration_problem,
    server_toleration_problem,
    server_toleration_resource,
    untolerated_pool_resources,
)
from components.settings import Problem
from stack_config import decode_raw_config, parse_stack_config, server_toleration_of
from tests.conftest import stack_config
from tests.opa_gate.gate_config import load_sections, pool_toleration_of

ERT = "ExtendedResourceToleration"
REFUSING = tuple(e for e in ADMISSION_ENGINES if e != ROUTING_ENGINE)
GPU, SHARED, MIG, DONGLE = (
    "nvidia.com/gpu",
    "nvidia.com/gpu.shared",
    "nvidia.com/mig-",
    "example.com/dongle",
)
# The kinds of GPU resource a pool can advertise: (names, prefixes).
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "whole": ((GPU,), ()),
    "mig-mixed": ((GPU,), (MIG,)),
    "renamed-time-sliced": ((GPU, SHARED), ()),
    "extended-on-the-pool": ((DONGLE, GPU), ()),
}
POOL_KEY = "gpu-cluster.io/pool"
# A refusing engine with a NoSchedule pool: the pods of each kind left without a toleration,
# by (ExtendedResourceToleration on, taint key). Nothing else adds one.
STRANDED: dict[tuple[bool, str], dict[str, tuple[str, ...]]] = {
    (False, GPU): {
        "whole": (GPU,),
        "mig-mixed": (GPU, f"{MIG}*"),
        "renamed-time-sliced": (GPU, SHARED),
        "extended-on-the-pool": (DONGLE, GPU),
    },
    # ExtendedResourceToleration tolerates the taint for the resource named like its key only.
    (True, GPU): {
        "whole": (),
        "mig-mixed": (f"{MIG}*",),
        "renamed-time-sliced": (SHARED,),
        "extended-on-the-pool": (DONGLE,),
    },
    (False, POOL_KEY): {
        "whole": (GPU,),
        "mig-mixed": (GPU, f"{MIG}*"),
        "renamed-time-sliced": (GPU, SHARED),
        "extended-on-the-pool": (DONGLE, GPU),
    },
    (True, POOL_KEY): {
        "whole": (GPU,),
        "mig-mixed": (GPU, f"{MIG}*"),
        "renamed-time-sliced": (GPU, SHARED),
        "extended-on-the-pool": (DONGLE, GPU),
    },
}


def _stranded(engine: str, ert: bool, key: str, effect: str, kind: str) -> tuple[str, ...]:
    names, prefixes = KINDS[kind]
    return untolerated_pool_resources(
        engine=engine,
        admission_plugins=[ERT] if ert else [],
        taint_key=key,
        taint_effect=effect,
        names=names,
        prefixes=prefixes,
    )


@pytest.mark.parametrize(
    ("engine", "ert", "key", "kind"),
    list(product(REFUSING, (False, True), (GPU, POOL_KEY), KINDS)),
)
def test_gate_tolerations_refusing_engines_strand_what_no_toleration_reaches(
    engine: str, ert: bool, key: str, kind: str
) -> None:
    assert _stranded(engine, ert, key, "NoSchedule", kind) == STRANDED[(ert, key)][kind]


@pytest.mark.parametrize(
    ("ert", "key", "kind"), list(product((False, True), (GPU, POOL_KEY), KINDS))
)
def test_gate_tolerations_routing_engine_tolerates_every_kind(
    ert: bool, key: str, kind: str
) -> None:
    assert _stranded(ROUTING_ENGINE, ert, key, "NoSchedule", kind) == ()


@pytest.mark.parametrize(
    ("engine", "ert", "kind"), list(product(ADMISSION_ENGINES, (False, True), KINDS))
)
def test_gate_tolerations_prefer_no_schedule_strands_no_pod(
    engine: str, ert: bool, kind: str
) -> None:
    # PreferNoSchedule steers the scheduler away; it never keeps a pod Pending.
    assert _stranded(engine, ert, GPU, "PreferNoSchedule", kind) == ()


def _problem(
    engine: str,
    version: str,
    plugins: list[str],
    kind: str,
    *,
    key: str = GPU,
    effect: str = "NoSchedule",
) -> Problem | None:
    names, prefixes = KINDS[kind]
    return pool_toleration_problem(
        engine=engine,
        kubernetes_version=version,
        admission_plugins=plugins,
        taint={"key": key, "value": "present", "effect": effect},
        names=names,
        prefixes=prefixes,
    )


def _asked(
    engine: str, plugins: list[str], kind: str, *, key: str = GPU, effect: str = "NoSchedule"
) -> str | None:
    names, prefixes = KINDS[kind]
    return server_toleration_resource(
        engine=engine,
        admission_plugins=plugins,
        taint={"key": key, "value": "present", "effect": effect},
        names=names,
        prefixes=prefixes,
    )


@pytest.mark.parametrize(
    ("engine", "version", "ert", "key", "effect", "kind"),
    list(
        product(
            ADMISSION_ENGINES,
            ("v1.35.4", "v1.36.3", "v1.37.2"),
            (False, True),
            (GPU, POOL_KEY),
            ("NoSchedule", "PreferNoSchedule"),
            KINDS,
        )
    ),
)
def test_gate_tolerations_every_cell_is_tolerated_refused_or_asked_of_the_cluster(
    engine: str, version: str, ert: bool, key: str, effect: str, kind: str
) -> None:
    plugins = [ERT] if ert else []
    found = _problem(engine, version, plugins, kind, key=key, effect=effect)
    asked = _asked(engine, plugins, kind, key=key, effect=effect)
    stranded = _stranded(engine, ert, key, effect, kind)
    # What no API server mends (stranded even with the plugin on) is refused at load...
    always = _stranded(engine, True, key, effect, kind)
    assert (found is None) == (always == ())
    if found is not None:
        assert (found.key, found.value) == ("admission.engine", engine)
        assert f"GPU pods asking only for {', '.join(always)} would never tolerate" in (
            found.allowed
        )
    # ...what the cluster's own plugin would mend is asked of it at preview: one cell per
    # refusing engine, whole GPUs under a taint keyed nvidia.com/gpu without the stack's plugin.
    assert (asked is not None) == (stranded != () and always == ())
    assert (asked is not None) == (
        engine != ROUTING_ENGINE and not ert and (key, effect, kind) == (GPU, "NoSchedule", "whole")
    )
    if asked is not None:
        assert asked == GPU


def test_gate_tolerations_whole_gpus_without_the_stacks_plugin_are_asked_not_refused() -> None:
    # The API server may run ExtendedResourceToleration without the stack enabling it: the
    # config alone cannot refuse, the preview asks the cluster about nvidia.com/gpu.
    for engine in REFUSING:
        for version in ("v1.35.4", "v1.36.3", "v1.37.2"):
            assert _problem(engine, version, [], "whole") is None
        assert _asked(engine, [], "whole") == GPU
        assert _asked(engine, [ERT], "whole") is None


def test_gate_tolerations_message_without_the_admission_plugin() -> None:
    # Refused whatever the cluster runs: the plugin's toleration is keyed nvidia.com/gpu.
    found = _problem("validating-admission-policy", "v1.37.2", [], "whole", key=POOL_KEY)
    assert str(found) == (
        "gpu-cluster:admission.engine: got 'validating-admission-policy'; GPU pods asking only "
        "for nvidia.com/gpu would never tolerate the GPU pool's taint "
        "gpu-cluster.io/pool=present:NoSchedule and stay Pending: this engine adds no "
        "toleration, nor would the API server: ExtendedResourceToleration (which the cluster "
        "may run without this stack enabling it) tolerates a taint only when its key is the "
        "requested resource (gpuPool.taint.key is gpu-cluster.io/pool); allowed: "
        "mutating-admission-policy (it adds the pool's toleration to every GPU pod); or "
        "ExtendedResourceToleration on the API servers (controlPlane.admissionPlugins, or the "
        "cluster's own) and gpuPool.taint.key nvidia.com/gpu; or gpuPool.taint.effect "
        "PreferNoSchedule"
    )


def test_gate_tolerations_message_for_mig_profiles_on_v1_35() -> None:
    found = _problem("opa", "v1.35.4", [ERT], "mig-mixed")
    assert str(found) == (
        "gpu-cluster:admission.engine: got 'opa'; GPU pods asking only for nvidia.com/mig-* "
        "would never tolerate the GPU pool's taint nvidia.com/gpu=present:NoSchedule and stay "
        "Pending: this engine adds no toleration, ExtendedResourceToleration tolerates a taint "
        "only when its key is the requested resource (gpuPool.taint.key is nvidia.com/gpu); "
        "allowed: mutating-admission-policy (it adds the pool's toleration to every GPU pod) "
        "once kubernetesVersion is v1.36 or newer (it is v1.35.4); or "
        "controlPlane.admissionPlugins with ExtendedResourceToleration and a pool whose one GPU "
        "resource is gpuPool.taint.key (no gpuOperator.mig.strategy mixed, no "
        "gpuOperator.devicePlugin.timeSlicing.renameByDefault, no extendedResources on pool "
        "nodes unless admission.gateExtendedResources is false); or gpuPool.taint.effect "
        "PreferNoSchedule"
    )


def test_gate_tolerations_message_names_the_taint_key_to_use() -> None:
    found = _problem("validating-admission-policy", "v1.36.3", [ERT], "whole", key=POOL_KEY)
    assert found is not None
    assert "(gpuPool.taint.key is gpu-cluster.io/pool)" in found.allowed
    assert "ExtendedResourceToleration and gpuPool.taint.key nvidia.com/gpu;" in found.allowed


# ------------------------------------------------------------------ what the pool advertises

ADVERTISED = GpuResources(names=(GPU, SHARED), prefixes=(MIG,))


@pytest.mark.parametrize(
    ("extended", "gated", "names"),
    [
        # On a pool node and gated: its pods are drawn to the pool.
        ({"gpu-1": {DONGLE: 2}}, True, (DONGLE, GPU, SHARED)),
        # Off the pool: its pods never go there, whatever their tolerations.
        ({"cpu-1": {DONGLE: 2}}, True, (GPU, SHARED)),
        # Not gated: the gate keeps no such pod on the binpack scheduler.
        ({"gpu-1": {DONGLE: 2}}, False, (GPU, SHARED)),
        # Advertised as 0: no pod fits there.
        ({"gpu-1": {DONGLE: 0}}, True, (GPU, SHARED)),
    ],
)
def test_gate_tolerations_pool_resources(
    extended: dict[str, dict[str, int]], gated: bool, names: tuple[str, ...]
) -> None:
    assert pool_resources(
        ADVERTISED, extended, ("gpu-1", "gpu-2"), gate_extended_resources=gated
    ) == (names, (MIG,))


# ------------------------------------------------------------------ at config load
#
# stack_config.py applies pool_toleration_problem() to the loaded config
# (tests/opa_gate/gate_config.py, pool_toleration_of()).

NODES = [{"name": "gpu-1"}, {"name": "gpu-2"}, {"name": "cpu-1", "address": "10.0.0.1"}]
CONTROL_PLANE = {
    "enabled": True,
    "user": "ops",
    "sshAgent": True,
    "hosts": ["cpu-1"],
    "hostKeys": {
        "cpu-1": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEq4MWWZYkl1AwbDTXxi4kpYJ5bbhKzzvLyFun5BnLK0"
    },
    "admissionPlugins": [ERT],
}


def _load(**values: Any) -> Problem | None:
    base: dict[str, Any] = {"nodes": NODES, "gpuPool": {"nodes": ["gpu-1", "gpu-2"]}}
    return pool_toleration_of(load_sections({**base, **values}))


# What each stack keeps in its encrypted secrets (`pulumi config set --secret`).
STACK_SECRETS: dict[str, dict[str, str]] = {"local": {"grafanaAdminPassword": "local-only"}}


@pytest.mark.parametrize("stack", ["dev", "local"])
def test_gate_tolerations_stack_files_pass(stack: str) -> None:
    values = {**decode_raw_config(stack_config(stack)), **STACK_SECRETS.get(stack, {})}
    assert pool_toleration_of(parse_stack_config(values)) is None


@pytest.mark.parametrize("gated", [True, False])
def test_gate_tolerations_prod_pool_with_infiniband_ports(gated: bool) -> None:
    # The H100 nodes advertise InfiniBand ports: pods asking only for those never tolerate
    # the nvidia.com/gpu taint under opa on v1.35, unless the gate leaves the ports alone.
    values = decode_raw_config(stack_config("prod"))
    admission = {**values.get("admission", {}), "gateExtendedResources": gated}
    found = pool_toleration_of(load_sections({**values, "admission": admission}))
    if gated:
        assert found is not None
        assert "asking only for example.com/infiniband-port would" in found.allowed
    else:
        assert found is None


def test_gate_tolerations_default_config_passes() -> None:
    assert pool_toleration_of(parse_stack_config({})) is None


def test_gate_tolerations_refusing_engine_without_the_admission_plugin_asks_the_cluster() -> None:
    config = load_sections(
        {"nodes": NODES, "gpuPool": {"nodes": ["gpu-1"]}, "admission": {"engine": "opa"}}
    )
    assert pool_toleration_of(config) is None
    assert server_toleration_of(config) == GPU


def test_gate_tolerations_a_disabled_control_planes_plugin_does_not_count() -> None:
    base = {"nodes": NODES, "gpuPool": {"nodes": ["gpu-1"]}, "admission": {"engine": "opa"}}
    off = load_sections({**base, "controlPlane": {**CONTROL_PLANE, "enabled": False}})
    assert server_toleration_of(off) == GPU
    on = load_sections({**base, "controlPlane": CONTROL_PLANE})
    assert server_toleration_of(on) is None


# The refusing engines load on every tested version with the default pool (taint
# nvidia.com/gpu, whole GPUs) and no controlPlane: the toleration is left to the preview (the
# version rule is the routing engine's alone: MutatingAdmissionPolicy is GA from v1.36).
@pytest.mark.parametrize(
    ("version", "engine"),
    [
        ("v1.35.4", "validating-admission-policy"),
        ("v1.35.4", "opa"),
        ("v1.36.3", "opa"),
        ("v1.36.3", "validating-admission-policy"),
        ("v1.37.2", "opa"),
        ("v1.37.2", "validating-admission-policy"),
    ],
)
def test_gate_tolerations_every_engine_its_version_allows_loads(version: str, engine: str) -> None:
    config = parse_stack_config(
        {
            "kubernetesVersion": version,
            "nodes": NODES,
            "gpuPool": {"nodes": ["gpu-1", "gpu-2"]},
            "admission": {"engine": engine},
        }
    )
    assert config.admission.engine == engine
    assert server_toleration_of(config) == GPU


# ------------------------------------------------------------------ the cluster's answer
#
# The tolerations a pod asking for nvidia.com/gpu alone, created without any, came back with
# from a dry-run (components/opa_gate/preview.py, check_pool_toleration).

TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
# What DefaultTolerationSeconds gives every pod.
DEFAULT_TOLERATIONS = [
    {
        "key": f"node.kubernetes.io/{condition}",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    for condition in ("not-ready", "unreachable")
]


def _answer(engine: str, tolerations: list[dict[str, Any]]) -> Problem | None:
    return server_toleration_problem(
        engine=engine,
        kubernetes_version="v1.35.4",
        taint=TAINT,
        resource=GPU,
        tolerations=tolerations,
    )


def test_gate_tolerations_the_plugins_toleration_is_what_it_adds() -> None:
    assert added_toleration(GPU) == {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize("engine", REFUSING)
def test_gate_tolerations_the_clusters_plugin_passes(engine: str) -> None:
    assert _answer(engine, [*DEFAULT_TOLERATIONS, added_toleration(GPU)]) is None


@pytest.mark.parametrize(
    "tolerations",
    [
        pytest.param([], id="none"),
        pytest.param(DEFAULT_TOLERATIONS, id="default-toleration-seconds"),
        # Another resource's, or another mutation's toleration of the taint (a routing gate of
        # an earlier config): not the plugin's, so it says nothing of other namespaces' pods.
        pytest.param([added_toleration(DONGLE)], id="another-resource"),
        pytest.param(
            [{"key": GPU, "operator": "Equal", "value": "present", "effect": "NoSchedule"}],
            id="routing-gate",
        ),
        pytest.param([{"operator": "Exists"}], id="every-taint"),
    ],
)
def test_gate_tolerations_no_plugin_toleration_is_refused(
    tolerations: list[dict[str, Any]],
) -> None:
    found = _answer("opa", tolerations)
    assert found is not None
    assert (found.key, found.value) == ("admission.engine", "opa")


def test_gate_tolerations_message_when_the_cluster_adds_none() -> None:
    found = _answer("validating-admission-policy", DEFAULT_TOLERATIONS)
    assert str(found) == (
        "gpu-cluster:admission.engine: got 'validating-admission-policy'; GPU pods asking only "
        "for nvidia.com/gpu would never tolerate the GPU pool's taint "
        "nvidia.com/gpu=present:NoSchedule and stay Pending: this engine adds no toleration, "
        "nor does the cluster's API server: a pod asking for it, created with dryRun=All, came "
        "back without the toleration nvidia.com/gpu Exists NoSchedule that "
        "ExtendedResourceToleration adds (the plugin is off); allowed: "
        "mutating-admission-policy (it adds the pool's toleration to every GPU pod) once "
        "kubernetesVersion is v1.36 or newer (it is v1.35.4); or ExtendedResourceToleration on "
        "the API servers (their --enable-admission-plugins, or controlPlane.enabled with "
        "controlPlane.admissionPlugins ExtendedResourceToleration) and gpuPool.taint.key "
        "nvidia.com/gpu; or gpuPool.taint.effect PreferNoSchedule"
    )


def test_gate_tolerations_refusing_engine_with_the_admission_plugin_passes_whole_gpus() -> None:
    assert _load(admission={"engine": "opa"}, controlPlane=CONTROL_PLANE) is None


@pytest.mark.parametrize(
    ("gpu_operator", "stranded"),
    [
        ({"enabled": True, "mig": {"strategy": "mixed"}}, "nvidia.com/mig-*"),
        (
            {
                "enabled": True,
                "mig": {"strategy": "none"},
                "devicePlugin": {"timeSlicing": {"replicas": 4, "renameByDefault": True}},
            },
            "nvidia.com/gpu.shared",
        ),
    ],
)
def test_gate_tolerations_operator_resources_other_than_the_taint_key_are_refused(
    gpu_operator: dict[str, Any], stranded: str
) -> None:
    found = _load(
        kubernetesVersion="v1.35.4",
        admission={"engine": "opa"},
        controlPlane=CONTROL_PLANE,
        gpuOperator=gpu_operator,
    )
    assert found is not None
    assert f"GPU pods asking only for {stranded} would" in found.allowed


def test_gate_tolerations_extended_resource_on_a_pool_node_is_refused() -> None:
    found = _load(
        admission={"engine": "validating-admission-policy"},
        controlPlane=CONTROL_PLANE,
        extendedResources={"gpu-1": {DONGLE: 4}},
    )
    assert found is not None and f"asking only for {DONGLE} would" in found.allowed


def test_gate_tolerations_extended_resource_off_the_pool_passes() -> None:
    found = _load(
        admission={"engine": "validating-admission-policy"},
        controlPlane=CONTROL_PLANE,
        extendedResources={"cpu-1": {DONGLE: 4}},
    )
    assert found is None


def test_gate_tolerations_a_gpu_resource_the_config_adds_is_refused() -> None:
    found = _load(
        admission={"engine": "opa"},
        controlPlane=CONTROL_PLANE,
        scheduler={"gpuResources": ["amd.com/cpx_nps4"]},
    )
    assert found is not None and "asking only for amd.com/cpx_nps4 would" in found.allowed


def test_gate_tolerations_routing_engine_passes_every_kind() -> None:
    everything = {
        "enabled": True,
        "mig": {"strategy": "mixed"},
    }
    assert (
        _load(
            kubernetesVersion="v1.36.3",
            gpuOperator=everything,
            extendedResources={"gpu-1": {DONGLE: 4}},
            gpuPool={"nodes": ["gpu-1"], "taint": {"key": POOL_KEY}},
        )
        is None
    )


def test_gate_tolerations_prefer_no_schedule_pool_passes() -> None:
    found = _load(
        admission={"engine": "opa"},
        gpuPool={"nodes": ["gpu-1"], "taint": {"effect": "PreferNoSchedule"}},
        gpuOperator={"enabled": True, "mig": {"strategy": "mixed"}},
    )
    assert found is None


def test_gate_tolerations_gpu_operator_settings_name_the_kinds() -> None:
    # The kinds above are what the operator's settings say its device plugin advertises.
    mixed = GpuOperatorSettings.model_validate({"enabled": True, "mig": {"strategy": "mixed"}})
    assert (mixed.gpu_resources().names, mixed.gpu_resources().prefixes) == KINDS["mig-mixed"]
    renamed = GpuOperatorSettings.model_validate(
        {
            "enabled": True,
            "mig": {"strategy": "none"},
            "devicePlugin": {"timeSlicing": {"replicas": 2, "renameByDefault": True}},
        }
    )
    assert renamed.gpu_resources().names == KINDS["renamed-time-sliced"][0]
