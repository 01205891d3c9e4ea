"""The preview's look for workloads the gate's pool rule would starve (components/cluster_access.py
check_pool_workloads): pod templates that tolerate the GPU pool's taint without asking for a
GPU, matched with components/tolerations.py. Against Kubernetes' own toleration cases, a fake
lister (what the cluster holds) and a loopback HTTP server (the lists on the wire);
tests/integration/test_pool_workloads_live.py asks a real kube-apiserver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from components.cluster_access import (
    SHOWN_WORKLOADS,
    ListRefused,
    PodTemplate,
    check_pool_workloads,
    list_templates,
)
from components.gpu_resources import is_gpu_resource
from components.settings import ConfigError
from components.tolerations import tolerates, tolerates_any
from tests.fake_cluster import reply_json

GPU = "nvidia.com/gpu"
TAINT = {"key": GPU, "value": "present", "effect": "NoSchedule"}
TOKEN = "s3cret-bearer-token-0123456789"
EVERY_TAINT = {"operator": "Exists"}
POOL_KEY = {"key": GPU, "operator": "Exists", "effect": "NoSchedule"}

# ------------------------------------------------------------------ tolerates

NO_SCHEDULE = "NoSchedule"
SLA = "node.kubernetes.io/sla"

# (why, toleration, taint, tolerated): Kubernetes' own TestTolerationToleratesTaint, then the
# rules its doc comment states that no case there covers.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/staging/src/k8s.io/api/core/v1/toleration_test.go
TOLERATION_CASES: list[tuple[str, dict[str, Any], dict[str, str], bool]] = [
    (
        "same key and effect, Exists, taint without value",
        {"key": "foo", "operator": "Exists", "effect": NO_SCHEDULE},
        {"key": "foo", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "same key and effect, Exists, taint with a value",
        {"key": "foo", "operator": "Exists", "effect": NO_SCHEDULE},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "empty key, Exists: every taint of the effect",
        {"key": "", "operator": "Exists", "effect": NO_SCHEDULE},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "same key, effect and value, Equal",
        {"key": "foo", "operator": "Equal", "value": "bar", "effect": NO_SCHEDULE},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "same key and effect, another value, Equal",
        {"key": "foo", "operator": "Equal", "value": "value1", "effect": NO_SCHEDULE},
        {"key": "foo", "value": "value2", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "same key and value, another effect",
        {"key": "foo", "operator": "Equal", "value": "bar", "effect": NO_SCHEDULE},
        {"key": "foo", "value": "bar", "effect": "NoExecute"},
        False,
    ),
    (
        "Gt, taint value below",
        {"key": SLA, "operator": "Gt", "value": "950", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "800", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Gt, taint value above",
        {"key": SLA, "operator": "Gt", "value": "750", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "950", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "Lt, taint value above",
        {"key": SLA, "operator": "Lt", "value": "800", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "950", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Lt, taint value below",
        {"key": SLA, "operator": "Lt", "value": "950", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "800", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "Gt, equal values",
        {"key": SLA, "operator": "Gt", "value": "950", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "950", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Gt, taint value not a number",
        {"key": SLA, "operator": "Gt", "value": "950", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "high", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Gt, negative values, taint below",
        {"key": "test-key", "operator": "Gt", "value": "-100", "effect": NO_SCHEDULE},
        {"key": "test-key", "value": "-200", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Gt, large int64, taint below",
        {
            "key": "test-key",
            "operator": "Gt",
            "value": "9223372036854775806",
            "effect": NO_SCHEDULE,
        },
        {"key": "test-key", "value": "100", "effect": NO_SCHEDULE},
        False,
    ),
    # The doc comment's rules.
    (
        "empty effect: every effect",
        {"key": "foo", "operator": "Exists"},
        {"key": "foo", "value": "bar", "effect": "NoExecute"},
        True,
    ),
    (
        "nothing but Exists: every taint",
        EVERY_TAINT,
        {"key": "foo", "value": "bar", "effect": "PreferNoSchedule"},
        True,
    ),
    (
        "empty key, Exists, another effect",
        {"operator": "Exists", "effect": "NoExecute"},
        {"key": "foo", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "another key, Exists",
        {"key": "bar", "operator": "Exists"},
        {"key": "foo", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "no operator is Equal",
        {"key": "foo", "value": "bar"},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "no operator, another value",
        {"key": "foo", "value": "baz"},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Equal without value matches a taint without value",
        {"key": "foo", "operator": "Equal"},
        {"key": "foo", "effect": NO_SCHEDULE},
        True,
    ),
    (
        "Equal without value, taint with one",
        {"key": "foo", "operator": "Equal"},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "an operator Kubernetes does not know",
        {"key": "foo", "operator": "In", "value": "bar"},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Gt, a leading zero is no decimal integer",
        {"key": SLA, "operator": "Gt", "value": "0750", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "950", "effect": NO_SCHEDULE},
        False,
    ),
    (
        "Lt, beyond int64",
        {"key": SLA, "operator": "Lt", "value": "9223372036854775808", "effect": NO_SCHEDULE},
        {"key": SLA, "value": "1", "effect": NO_SCHEDULE},
        False,
    ),
    # Stored only by a validation that lets an empty key with Equal through (none does); the
    # match is still Kubernetes': the key check passes, the values are compared.
    (
        "empty key, Equal, same value",
        {"operator": "Equal", "value": "bar"},
        {"key": "foo", "value": "bar", "effect": NO_SCHEDULE},
        True,
    ),
]


@pytest.mark.parametrize(
    ("toleration", "taint", "tolerated"),
    [pytest.param(t, taint, ok, id=why) for why, t, taint, ok in TOLERATION_CASES],
)
def test_tolerations_tolerates_as_kubernetes_does(
    toleration: dict[str, Any], taint: dict[str, str], tolerated: bool
) -> None:
    assert tolerates(toleration, taint) is tolerated


def test_tolerations_tolerates_any_of_a_pod_spec() -> None:
    other = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
    assert tolerates_any([other, POOL_KEY], TAINT)
    assert not tolerates_any([other], TAINT)
    assert not tolerates_any([], TAINT)
    assert not tolerates_any(None, TAINT)


# ------------------------------------------------------------------ check_pool_workloads


def _template(
    *tolerations: dict[str, Any], resources: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod template of one container with `tolerations` (and `resources`, `spec` fields)."""
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if resources is not None:
        container["resources"] = resources
    body: dict[str, Any] = {"containers": [container], **spec}
    if tolerations:
        body["tolerations"] = list(tolerations)
    return {"metadata": {"labels": {"app": "x"}}, "spec": body}


CALICO = PodTemplate("DaemonSet", "calico-system", "calico-node", _template(EVERY_TAINT))
TIGERA = PodTemplate("Deployment", "tigera-operator", "tigera-operator", _template(EVERY_TAINT))
POOL_TOOL = PodTemplate("StatefulSet", "ml", "feature-store", _template(POOL_KEY))
NIGHTLY = PodTemplate(
    "CronJob", "ml", "nightly-report", _template({"key": GPU, "value": "present"})
)
PLAIN = PodTemplate("Deployment", "web", "frontend", _template())


def _lister(*templates: PodTemplate) -> Callable[[str, str | None], list[PodTemplate]]:
    return lambda kubeconfig, context: list(templates)


def _check(*templates: PodTemplate, **overrides: Any) -> str | None:
    arguments: dict[str, Any] = {
        "taint": TAINT,
        "allowed_namespaces": (),
        "allowed_daemonsets": (),
        "skipped_namespaces": ("kube-system", "gpu-admission", "gpu-operator"),
        "gpu_resource": is_gpu_resource,
        "lister": _lister(*templates),
        **overrides,
    }
    return check_pool_workloads("", None, **arguments)


def _refusal(*templates: PodTemplate, **overrides: Any) -> tuple[Any, str]:
    """(the problem's value, its text) of the refusal check_pool_workloads raises."""
    with pytest.raises(ConfigError) as refused:
        _check(*templates, **overrides)
    (problem,) = refused.value.problems
    assert problem.key == "admission.poolNamespaces"
    return problem.value, problem.allowed


def test_pool_workloads_check_names_each_refused_workload_sorted_with_its_keys() -> None:
    value, text = _refusal(PLAIN, NIGHTLY, TIGERA, POOL_TOOL, CALICO)
    assert value == ["calico-system", "ml", "tigera-operator"]
    assert (
        "of CronJob ml/nightly-report (toleration key nvidia.com/gpu), "
        "DaemonSet calico-system/calico-node (toleration no key, operator Exists: every taint), "
        "Deployment tigera-operator/tigera-operator (toleration no key, operator Exists: every "
        "taint), StatefulSet ml/feature-store (toleration key nvidia.com/gpu): their pod "
        "template tolerates the GPU pool's taint nvidia.com/gpu=present:NoSchedule without "
        "asking for a GPU."
    ) in text
    assert "web" not in text
    assert text.endswith(
        "Add the namespace to admission.poolNamespaces, or the DaemonSet as "
        '"namespace/name" to admission.poolDaemonSets, or drop the toleration from the workload'
    )


def test_pool_workloads_check_names_every_key_that_lets_a_workload_through() -> None:
    both = PodTemplate("DaemonSet", "logging", "fluent-bit", _template(POOL_KEY, EVERY_TAINT))
    _, text = _refusal(both)
    assert (
        "DaemonSet logging/fluent-bit (toleration no key, operator Exists: every taint, key "
        "nvidia.com/gpu)"
    ) in text


def test_pool_workloads_check_cuts_a_long_list() -> None:
    many = [
        PodTemplate("DaemonSet", f"agents-{i:02}", "agent", _template(EVERY_TAINT))
        for i in range(SHOWN_WORKLOADS + 3)
    ]
    value, text = _refusal(*reversed(many))
    assert value == [f"agents-{i:02}" for i in range(SHOWN_WORKLOADS + 3)]
    assert f"DaemonSet agents-{SHOWN_WORKLOADS - 1:02}/agent" in text
    assert f"agents-{SHOWN_WORKLOADS:02}" not in text
    assert "every taint), and 3 more: their pod template" in text


@pytest.mark.parametrize(
    ("toleration", "why"),
    [
        ({"key": GPU, "operator": "Exists", "effect": "NoExecute"}, "another effect"),
        ({"key": GPU, "value": "absent"}, "another value"),
        ({"key": "example.com/other", "operator": "Exists"}, "another key"),
    ],
)
def test_pool_workloads_check_passes_a_toleration_of_another_taint(
    toleration: dict[str, Any], why: str
) -> None:
    assert _check(PodTemplate("Deployment", "ml", "x", _template(toleration))) is None, why


def test_pool_workloads_check_passes_an_allowed_namespace() -> None:
    assert _check(CALICO, POOL_TOOL, allowed_namespaces=("calico-system", "ml")) is None
    value, text = _refusal(CALICO, POOL_TOOL, allowed_namespaces=("ml",))
    assert value == ["calico-system"]
    assert "feature-store" not in text


def test_pool_workloads_check_passes_an_allowed_daemonset_only() -> None:
    # "namespace/name" lets the DaemonSet through, not a Deployment of the same name.
    same_name = PodTemplate("Deployment", "calico-system", "calico-node", _template(EVERY_TAINT))
    value, text = _refusal(
        CALICO, same_name, allowed_daemonsets=("calico-system/calico-node", "ml/feature-store")
    )
    assert value == ["calico-system"]
    assert "Deployment calico-system/calico-node" in text
    assert "DaemonSet calico-system/calico-node" not in text
    assert _check(CALICO, allowed_daemonsets=("calico-system/calico-node",)) is None
    # A StatefulSet is not let through by the DaemonSet list.
    with pytest.raises(ConfigError):
        _check(POOL_TOOL, allowed_daemonsets=("ml/feature-store",))


def test_pool_workloads_check_passes_the_namespaces_the_gate_never_judges() -> None:
    proxy = PodTemplate("DaemonSet", "kube-system", "kube-proxy", _template(EVERY_TAINT))
    operand = PodTemplate("DaemonSet", "gpu-operator", "nvidia-device-plugin", _template(POOL_KEY))
    own = PodTemplate("Deployment", "gpu-admission", "opa", _template(EVERY_TAINT))
    assert _check(proxy, operand, own) is None


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"resources": {"limits": {GPU: "1"}}}, id="limit"),
        pytest.param({"resources": {"requests": {GPU: "1"}}}, id="request"),
        pytest.param({"resources": {"limits": {"nvidia.com/mig-1g.5gb": "1"}}}, id="mig"),
        pytest.param(
            {"initContainers": [{"name": "i", "resources": {"limits": {GPU: "1"}}}]}, id="init"
        ),
        pytest.param({"resourceClaims": [{"name": "gpu"}]}, id="resource-claim"),
        pytest.param({"extra_resource": "example.com/accel"}, id="the-caller's-resource"),
    ],
)
def test_pool_workloads_check_passes_a_template_that_asks_for_a_gpu(spec: dict[str, Any]) -> None:
    extra = spec.pop("extra_resource", None)
    resources = spec.pop("resources", None)
    if extra is not None:
        resources = {"limits": {extra: "1"}}
    template = _template(POOL_KEY, resources=resources, **spec)

    def gpu_resource(name: str) -> bool:
        return name == extra or is_gpu_resource(name)

    assert (
        _check(PodTemplate("Deployment", "ml", "trainer", template), gpu_resource=gpu_resource)
        is None
    )


@pytest.mark.parametrize(
    "resources",
    [
        pytest.param({"limits": {"nvidia.com/hostdev": "1"}}, id="a-nic-not-a-gpu"),
        pytest.param({"limits": {GPU: "0"}}, id="zero-gpus"),
        pytest.param({"requests": {"cpu": "100m"}}, id="cpu-only"),
    ],
)
def test_pool_workloads_check_refuses_a_template_asking_for_no_gpu(
    resources: dict[str, Any],
) -> None:
    value, _ = _refusal(
        PodTemplate("Deployment", "ml", "x", _template(POOL_KEY, resources=resources))
    )
    assert value == ["ml"]


def test_pool_workloads_check_passes_an_empty_cluster() -> None:
    assert _check() is None
    assert _check(PLAIN) is None


def test_pool_workloads_check_that_cannot_list_is_a_warning_without_the_credential() -> None:
    def refusing(kubeconfig: str, context: str | None) -> list[PodTemplate]:
        raise ListRefused(
            f"GET /apis/apps/v1/daemonsets: HTTP 403: forbidden for token {TOKEN}\nsecond line"
        )

    warning = check_pool_workloads(
        _kubeconfig("https://127.0.0.1:1"),
        None,
        taint=TAINT,
        allowed_namespaces=(),
        allowed_daemonsets=(),
        skipped_namespaces=(),
        gpu_resource=is_gpu_resource,
        lister=refusing,
    )
    assert warning == (
        "gpu-cluster:admission.poolNamespaces was not checked against the cluster: listing "
        "DaemonSets, Deployments, StatefulSets and CronJobs in every namespace (which needs list "
        "on them cluster-wide) failed: GET /apis/apps/v1/daemonsets: HTTP 403: forbidden for "
        "token <redacted>. The gate refuses a new pod that asks for no GPU yet tolerates the "
        "GPU pool's taint nvidia.com/gpu=present:NoSchedule outside admission.poolNamespaces "
        "and admission.poolDaemonSets. Check by hand that no pod template there has a "
        "toleration of that key, or one with no key and operator Exists: `kubectl get "
        "daemonsets,deployments,statefulsets,cronjobs -A -o json` "
        "(spec.template.spec.tolerations; a CronJob's under spec.jobTemplate)"
    )


def test_pool_workloads_check_warning_blanks_an_auth_providers_tokens() -> None:
    provider = {"name": "oidc", "config": {"id-token": TOKEN, "client-id": "kubectl"}}

    def refusing(kubeconfig: str, context: str | None) -> list[PodTemplate]:
        raise ListRefused(f"HTTP 401: token {TOKEN} expired")

    warning = check_pool_workloads(
        _kubeconfig("https://127.0.0.1:1", {"auth-provider": provider}),
        None,
        taint=TAINT,
        allowed_namespaces=(),
        allowed_daemonsets=(),
        skipped_namespaces=(),
        gpu_resource=is_gpu_resource,
        lister=refusing,
    )
    assert warning is not None
    assert "failed: HTTP 401: token <redacted> expired. " in warning
    assert TOKEN not in warning


def test_pool_workloads_check_of_an_unreachable_cluster_is_a_warning() -> None:
    warning = check_pool_workloads(
        _kubeconfig("http://127.0.0.1:1"),
        None,
        taint=TAINT,
        allowed_namespaces=(),
        allowed_daemonsets=(),
        skipped_namespaces=(),
        gpu_resource=is_gpu_resource,
    )
    assert warning is not None
    assert warning.startswith(
        "gpu-cluster:admission.poolNamespaces was not checked against the cluster: listing "
    )
    assert "/apis/apps/v1/daemonsets" in warning
    assert "\n" not in warning
    assert TOKEN not in warning


# ------------------------------------------------------------------ the lists on the wire


def _kubeconfig(server: str, user: dict[str, Any] | None = None) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "users": [{"name": "u", "user": user or {"token": TOKEN}}],
            "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "ctx",
        }
    )


def _item(
    name: str,
    namespace: str,
    template: dict[str, Any],
    cron: bool = False,
    status: dict[str, Any] | None = None,
) -> Any:
    spec = {"jobTemplate": {"spec": {"template": template}}} if cron else {"template": template}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": spec, "status": status}


class _Lists(BaseHTTPRequestHandler):
    """Answers the four lists as an API server would: DaemonSets over two pages (limit and
    continue), one CronJob, nothing else; 403 for every list when `forbidden`."""

    seen: ClassVar[list[tuple[str, dict[str, list[str]], str | None]]] = []
    forbidden: ClassVar[bool] = False

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        type(self).seen.append((url.path, query, self.headers.get("Authorization")))
        status, answer = 200, {"kind": "List", "metadata": {}, "items": []}
        if type(self).forbidden:
            status = 403
            answer = {"kind": "Status", "message": 'daemonsets.apps is forbidden: User "ci"'}
        elif url.path == "/apis/apps/v1/daemonsets" and "continue" not in query:
            answer["items"] = [
                _item(
                    "calico-node",
                    "calico-system",
                    _template(EVERY_TAINT),
                    status={"currentNumberScheduled": 3, "numberMisscheduled": 0},
                )
            ]
            answer["metadata"] = {"continue": "page-2"}
        elif url.path == "/apis/apps/v1/daemonsets":
            answer["items"] = [_item("fluent-bit", "logging", _template(POOL_KEY))]
        elif url.path == "/apis/batch/v1/cronjobs":
            answer["items"] = [
                _item("nightly", "ml", _template(POOL_KEY), cron=True),
                _item(
                    "weekly",
                    "ml",
                    _template(POOL_KEY),
                    cron=True,
                    status={"lastScheduleTime": "2026-11-22T03:00:00Z"},
                ),
            ]
        reply_json(self, status, answer)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def lists_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Lists)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Lists.seen = []
    _Lists.forbidden = False
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_pool_workloads_lister_reads_every_page_of_the_four_lists(lists_server: str) -> None:
    found = list_templates(_kubeconfig(lists_server), None)
    # Whether each runs pods now: a DaemonSet with scheduled pods, a CronJob that has run.
    assert found == [
        PodTemplate("DaemonSet", "calico-system", "calico-node", _template(EVERY_TAINT), True),
        PodTemplate("DaemonSet", "logging", "fluent-bit", _template(POOL_KEY), False),
        PodTemplate("CronJob", "ml", "nightly", _template(POOL_KEY), False),
        PodTemplate("CronJob", "ml", "weekly", _template(POOL_KEY), True),
    ]
    assert [(path, query) for path, query, _ in _Lists.seen] == [
        ("/apis/apps/v1/daemonsets", {"limit": ["500"]}),
        ("/apis/apps/v1/daemonsets", {"limit": ["500"], "continue": ["page-2"]}),
        ("/apis/apps/v1/deployments", {"limit": ["500"]}),
        ("/apis/apps/v1/statefulsets", {"limit": ["500"]}),
        ("/apis/batch/v1/cronjobs", {"limit": ["500"]}),
    ]
    assert {authorization for _, _, authorization in _Lists.seen} == {f"Bearer {TOKEN}"}


def test_pool_workloads_lister_raises_the_api_servers_refusal(lists_server: str) -> None:
    _Lists.forbidden = True
    with pytest.raises(
        ListRefused,
        match=r'^GET /apis/apps/v1/daemonsets: HTTP 403: daemonsets.apps is forbidden: User "ci"$',
    ):
        list_templates(_kubeconfig(lists_server), None)


def test_pool_workloads_without_pods_now_are_named_in_a_warning_not_refused() -> None:
    """A tenant's DaemonSet created after the gate refused its pods runs none: it cannot hold
    back the platform's `up`; it is named in a warning."""
    tenant = PodTemplate("DaemonSet", "team-a", "agent", _template(EVERY_TAINT), False)
    warning = _check(tenant)
    assert warning is not None
    assert warning.startswith("gpu-cluster:admission.poolNamespaces: the gate refuses the pods")
    assert "DaemonSet team-a/agent" in warning and "they run none now" in warning
    # Beside one that runs pods, only that one is refused.
    value, text = _refusal(tenant, CALICO)
    assert value == ["calico-system"] and "team-a" not in text
