"""How every layer reaches the cluster: one explicit kubernetes Provider behind the stack's
claim. Nothing in the stack uses the ambient default provider; the dynamic providers take their
credentials from the run's config (components/providers/credentials.py).

One stack manages a cluster, and the cluster says which: the claim, ConfigMap
kube-system/<project>, records the stack's id (minted on its first `up`, kept across a
`pulumi stack rename`), its organization/project/stack and the objects the stack manages, and is
written before anything else (the provider every object uses depends on it; the node and
control-plane layers wait for it too). The kubernetes provider applies objects server-side and,
on create, takes over an object that already exists; so every `preview` and `up` first reads
the claim and every object the program declares from the cluster (components/ownership.py),
and the claim is written only when the claim is this stack's (or there is none yet) and no
declared object exists that the stack did not create. The claim alone is applied without force,
so a second stack's `up` that got past the check still stops on the claim's field conflict.
Every other object of the stack is applied with force (`pulumi.com/patchForce`): the stack is
the one source of its objects, and the next `pulumi up` puts back what a hand edit (`kubectl
edit`) changed.

Also the one look at the live cluster before anything is declared: the configured
kubernetesVersion (the binpack scheduler's image tag) against the API server's /version, the
APIs a setting needs (check_served_api), a dry-run pod create (pod_dry_run: the gate asks
whether the API server gives GPU pods the pool's toleration itself, in
components/opa_gate/preview.py), and which workloads on the cluster the gate would keep off the
pool's nodes (check_pool_workloads).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, NamedTuple

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components.kubernetes_version import major_minor
from components.object_meta import NamespaceLabel
from components.ownership import (
    HELM_RELEASE_API,
    HELM_RELEASE_KIND,
    PATCH_FORCE,
    STACK_MARK,
    ClaimKeys,
    ObjectRef,
    Ownership,
    api_get,
    marked_values,
)
from components.providers.node_api import (
    api_client_from_kubeconfig,
    stack_identity,
    stack_label,
)
from components.settings import PROJECT, ConfigError, Problem
from components.tolerations import tolerates

CLAIM_NAMESPACE = "kube-system"
CLAIM_KEY = "managed-by-stack"
"""The claim's data key for the stack's id: a second stack's `up` fails naming it
(`.data.managed-by-stack`)."""
CLAIM_LABEL_KEY = "stack"
"""The claim's data key for the stack's readable organization/project/stack."""
CLAIM_OBJECTS_KEY = "objects"
"""The claim's data key for the objects the stack manages (JSON, one a line)."""
HELM_RELEASE = "kubernetes:helm.sh/v3:Release"

# kube-scheduler must not be newer than the kube-apiserver it talks to, and may be at most one
# minor version older (for live upgrades).
# Ref: https://kubernetes.io/releases/version-skew-policy/#kube-controller-manager-kube-scheduler-and-cloud-controller-manager
SCHEDULER_MINORS_BEHIND = 1
# How long a preview waits for /version before going on without the check.
VERSION_TIMEOUT_S = 5.0


def server_version(kubeconfig: str, context: str | None) -> str:
    """The API server's gitVersion (GET /version), reached with kubeconfig content. Raises
    when it cannot be reached."""
    from kubernetes import client

    api = client.VersionApi(api_client_from_kubeconfig(kubeconfig, context))
    info = api.get_code(_request_timeout=VERSION_TIMEOUT_S)
    return str(info.git_version)


def _allowed(server: tuple[int, int]) -> str:
    major, minor = server
    return " or ".join(f"v{major}.{m}.x" for m in range(minor - SCHEDULER_MINORS_BEHIND, minor + 1))


def scheduler_skew_problem(scheduler: str, server: str) -> Problem | None:
    """Why kube-scheduler `scheduler` must not run against kube-apiserver `server` (it is
    newer), or None."""
    have, want = major_minor(server), major_minor(scheduler)
    if have is None or want is None or want <= have:
        return None
    return Problem(
        key="kubernetesVersion",
        value=scheduler,
        allowed=f"the cluster's API server is {server}, and the binpack kube-scheduler (this "
        "version) may not be newer than the kube-apiserver (Kubernetes version skew policy); "
        f"allowed: {_allowed(have)}",
    )


def scheduler_skew_warning(scheduler: str, server: str) -> str | None:
    """A warning when kube-scheduler `scheduler` is more than one minor older than `server`:
    outside the skew policy, yet still served by the API server, so not refused (an API
    server upgraded before the stack's kubernetesVersion is the usual cause)."""
    have, want = major_minor(server), major_minor(scheduler)
    if have is None or want is None or want >= (have[0], have[1] - SCHEDULER_MINORS_BEHIND):
        return None
    return (
        f"{PROJECT}:kubernetesVersion {scheduler} is more than {SCHEDULER_MINORS_BEHIND} minor "
        f"version older than the cluster's API server ({server}), outside the Kubernetes "
        f"version skew policy; set it to {_allowed(have)}"
    )


def check_version_skew(kubeconfig: str, context: str | None, scheduler: str) -> str | None:
    """Refuse (ConfigError) a kubernetesVersion newer than the live cluster's API server
    (reached with `kubeconfig`, the content stack_config read).

    Returns a warning for one more than a minor older, or instead of checking when the
    cluster cannot be reached (a preview on a machine without access); None when the
    versions fit.
    """
    try:
        server = server_version(kubeconfig, context)
    except Exception as exc:  # any failure to reach or read /version: skip, say so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"{PROJECT}:kubernetesVersion {scheduler} was not compared with the cluster's "
            f"version: GET /version failed: {reason}"
        )
    problem = scheduler_skew_problem(scheduler, server)
    if problem is not None:
        raise ConfigError([problem])
    return scheduler_skew_warning(scheduler, server)


def served_resources(kubeconfig: str, context: str | None, group_version: str) -> set[str]:
    """The resources the API server serves in `group_version` (GET /apis/<group/version>);
    none when it does not serve the version. Raises when it cannot be reached."""
    get = api_get(api_client_from_kubeconfig(kubeconfig, context))
    listing = get(f"/apis/{group_version}", ())
    return {str(r.get("name")) for r in (listing or {}).get("resources") or []}


def check_served_api(
    kubeconfig: str, context: str | None, key: str, group_version: str, resource: str, how: str
) -> str | None:
    """Refuse (ConfigError, naming `key`) when the live API server does not serve `resource`
    in `group_version`, which `key` needs (`how`: how to turn it on); a warning instead of
    checking when the cluster cannot be reached; None when it is served."""
    try:
        served = served_resources(kubeconfig, context, group_version)
    except Exception as exc:  # any failure to reach or read: skip, say so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"{PROJECT}:{key} was not checked against the cluster: GET /apis/{group_version} "
            f"failed: {reason}"
        )
    if resource in served:
        return None
    raise ConfigError(
        [
            Problem(
                key=key,
                value=True,
                allowed=f"the cluster does not serve {resource} in {group_version}; {how}",
            )
        ]
    )


# How long a preview waits for the dry-run before going on without the check.
PROBE_TIMEOUT_S = 10.0
PodDryRun = Callable[[str, Mapping[str, Any]], Mapping[str, Any]]
"""(namespace, pod) -> the pod as the API server would store it, created with dryRun=All."""


class DryRunRefused(Exception):
    """The API server answered a dry-run create with an error (RBAC, an admission refusal, a
    webhook that does not support dry runs)."""


def pod_dry_run(kubeconfig: str, context: str | None) -> PodDryRun:
    """Creates pods with dryRun=All on the cluster `kubeconfig` (content) reaches: admission
    runs in full (mutating plugins, webhooks and policies, then validation) and nothing is
    stored. The callable raises when the cluster cannot be reached or refuses."""
    api = api_client_from_kubeconfig(kubeconfig, context)

    def create(namespace: str, pod: Mapping[str, Any]) -> Mapping[str, Any]:
        status, reason, answer = _call(
            api,
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            [("dryRun", "All")],
            PROBE_TIMEOUT_S,
            body=dict(pod),
        )
        if not 200 <= status < 300:
            raise DryRunRefused(f"HTTP {status}: {answer.get('message') or reason}")
        return answer

    return create


def _call(
    api: Any,
    method: str,
    path: str,
    query: list[tuple[str, str]],
    timeout: float,
    body: Mapping[str, Any] | None = None,
) -> tuple[int, str, Mapping[str, Any]]:
    """One JSON request to the API server: (HTTP status, reason, the decoded answer, {} when it
    is none)."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    request = api.param_serialize(
        method=method,
        resource_path=path,
        query_params=query,
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
    )
    response = api.call_api(*request, _request_timeout=timeout)
    raw = response.read()
    try:
        answer = json.loads(raw) if raw else {}
    except ValueError:
        answer = {}
    return response.status, str(response.reason), answer if isinstance(answer, Mapping) else {}


# The workloads whose controllers create pods from a template, each listed across namespaces:
# (kind, list path, where the pod template is in the object).
POOL_WORKLOAD_LISTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("DaemonSet", "/apis/apps/v1/daemonsets", ("spec", "template")),
    ("Deployment", "/apis/apps/v1/deployments", ("spec", "template")),
    ("StatefulSet", "/apis/apps/v1/statefulsets", ("spec", "template")),
    ("CronJob", "/apis/batch/v1/cronjobs", ("spec", "jobTemplate", "spec", "template")),
)
# Objects per list request; the rest follow with the list's continue token.
LIST_PAGE_SIZE = 500
# How long a preview waits for each page of a list before going on without the check.
LIST_TIMEOUT_S = 10.0
# Workloads a refusal names before "and N more".
SHOWN_WORKLOADS = 10


class PodTemplate(NamedTuple):
    """A workload's pod template, and whether the workload runs pods now."""

    kind: str
    namespace: str
    name: str
    template: Mapping[str, Any]
    """A PodTemplateSpec: metadata and spec."""
    running: bool = True
    """Whether it has pods now (a CronJob: has run): what a refusal of its next pods would
    take away. A workload whose pods the gate refuses already has none."""


TemplateLister = Callable[[str, str | None], Iterable[PodTemplate]]
"""(kubeconfig content, context) -> every workload's pod template on the cluster."""


class ListRefused(Exception):
    """The API server answered a list with an error (RBAC, an API it does not serve)."""


def _list_page(api: Any, path: str, query: list[tuple[str, str]]) -> Mapping[str, Any]:
    status, reason, answer = _call(api, "GET", path, query, LIST_TIMEOUT_S)
    if not 200 <= status < 300:
        raise ListRefused(f"GET {path}: HTTP {status}: {answer.get('message') or reason}")
    return answer


def _at(obj: Mapping[str, Any], path: Iterable[str]) -> Mapping[str, Any]:
    """The mapping at `path` in `obj`; empty when a step is missing."""
    found: Any = obj
    for step in path:
        found = found.get(step) if isinstance(found, Mapping) else None
    return found if isinstance(found, Mapping) else {}


def _running(kind: str, status: Mapping[str, Any]) -> bool:
    """Whether a workload of `kind` with `status` runs pods now (a CronJob: has run)."""
    if kind == "DaemonSet":
        counts = ("currentNumberScheduled", "numberMisscheduled")
        return sum(int(status.get(k) or 0) for k in counts) > 0
    if kind == "CronJob":
        return bool(status.get("active")) or bool(status.get("lastScheduleTime"))
    return int(status.get("replicas") or 0) > 0


def list_templates(kubeconfig: str, context: str | None) -> list[PodTemplate]:
    """The pod template of every DaemonSet, Deployment, StatefulSet and CronJob on the cluster
    `kubeconfig` (content) reaches, in every namespace (POOL_WORKLOAD_LISTS). Raises when the
    cluster cannot be reached or refuses a list."""
    api = api_client_from_kubeconfig(kubeconfig, context)
    found: list[PodTemplate] = []
    try:
        for kind, path, where in POOL_WORKLOAD_LISTS:
            token = ""
            while True:
                query = [("limit", str(LIST_PAGE_SIZE)), *([("continue", token)] if token else [])]
                page = _list_page(api, path, query)
                for item in page.get("items") or []:
                    metadata = item.get("metadata") or {}
                    namespace, name = metadata.get("namespace", ""), metadata.get("name", "")
                    running = _running(kind, item.get("status") or {})
                    found.append(
                        PodTemplate(kind, str(namespace), str(name), _at(item, where), running)
                    )
                token = str((page.get("metadata") or {}).get("continue") or "")
                if not token:
                    break
    finally:
        api.close()
    return found


def _zero(quantity: Any) -> bool:
    """A quantity that is provably zero (no device is allocated for it)."""
    from kubernetes.utils import parse_quantity

    try:
        return bool(parse_quantity(quantity) == 0)
    except (ValueError, TypeError, ArithmeticError):
        return False


def asks_for_gpu(spec: Mapping[str, Any], gpu_resource: Callable[[str], bool]) -> bool:
    """Whether a pod of `spec` asks for a GPU as the gate sees it: a non-zero request or limit
    of a resource `gpu_resource` names, in a container, an init or ephemeral container or the
    pod-level resources, or any DRA claim (spec.resourceClaims)."""
    if spec.get("resourceClaims"):
        return True
    blocks = [
        container.get("resources") or {}
        for field_name in ("containers", "initContainers", "ephemeralContainers")
        for container in spec.get(field_name) or []
        if isinstance(container, Mapping)
    ]
    blocks.append(spec.get("resources") or {})
    return any(
        gpu_resource(str(name)) and not _zero(quantity)
        for block in blocks
        if isinstance(block, Mapping)
        for section in ("requests", "limits")
        for name, quantity in (block.get(section) or {}).items()
    )


@dataclass(frozen=True, order=True)
class PoolWorkload:
    """A workload whose new pods the gate would refuse: they ask for no GPU yet tolerate the
    pool's taint."""

    kind: str
    namespace: str
    name: str
    keys: tuple[str, ...] = ()
    """The keys of the tolerations that tolerate the taint ("" for one of every key)."""
    running: bool = True
    """Whether it runs pods now (PodTemplate.running)."""

    def __str__(self) -> str:
        through = ", ".join(
            f"key {key}" if key else "no key, operator Exists: every taint" for key in self.keys
        )
        return f"{self.kind} {self.namespace}/{self.name} (toleration {through})"


def refused_pool_workloads(
    templates: Iterable[PodTemplate],
    *,
    taint: Mapping[str, str],
    allowed_namespaces: Collection[str],
    allowed_daemonsets: Collection[str],
    skipped_namespaces: Collection[str],
    gpu_resource: Callable[[str], bool],
) -> list[PoolWorkload]:
    """The workloads of `templates` whose new pods the gate's pool rule would refuse, sorted:
    their template tolerates `taint` (components/tolerations.py) and asks for no GPU
    (asks_for_gpu), outside `skipped_namespaces` (the gate judges nothing there) and
    `allowed_namespaces`, and, for a DaemonSet, not named "namespace/name" in
    `allowed_daemonsets`."""
    refused: list[PoolWorkload] = []
    for kind, namespace, name, template, running in (PodTemplate(*t) for t in templates):
        if namespace in skipped_namespaces or namespace in allowed_namespaces:
            continue
        if kind == "DaemonSet" and f"{namespace}/{name}" in allowed_daemonsets:
            continue
        spec = template.get("spec") or {}
        tolerations = [t for t in spec.get("tolerations") or [] if isinstance(t, Mapping)]
        through = [t for t in tolerations if tolerates(t, taint)]
        if not through or asks_for_gpu(spec, gpu_resource):
            continue
        keys = tuple(sorted({str(t.get("key") or "") for t in through}))
        refused.append(PoolWorkload(kind, namespace, name, keys, running))
    return sorted(refused)


def pool_workloads_problem(refused: Collection[PoolWorkload], taint: Mapping[str, str]) -> Problem:
    """The refusal of a config under which the gate would refuse the new pods of `refused`
    (not empty): it names them, the keys that let them through, and the way out."""
    ordered = sorted(refused)
    shown = ", ".join(str(w) for w in ordered[:SHOWN_WORKLOADS])
    more = len(ordered) - SHOWN_WORKLOADS
    if more > 0:
        shown += f", and {more} more"
    return Problem(
        key="admission.poolNamespaces",
        value=sorted({w.namespace for w in ordered}),
        allowed=f"the admission gate would refuse the new pods (a rolling update, a new node) "
        f"of {shown}: their pod template tolerates the GPU pool's taint {taint['key']}="
        f"{taint.get('value', '')}:{taint['effect']} without asking for a GPU. Add the "
        'namespace to admission.poolNamespaces, or the DaemonSet as "namespace/name" to '
        "admission.poolDaemonSets, or drop the toleration from the workload",
    )


def _strings(value: Any) -> Iterator[str]:
    """Every string in `value`, however deep in mappings and lists."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _without_credentials(text: str, kubeconfig: str) -> str:
    """`text` with every credential of `kubeconfig`'s users (tokens, passwords, keys, an auth
    provider's tokens) blanked."""
    try:
        document = yaml.safe_load(kubeconfig) if kubeconfig.strip() else None
    except yaml.YAMLError:
        return text
    users = document.get("users") if isinstance(document, Mapping) else None
    for entry in users if isinstance(users, list) else []:
        user = entry.get("user") if isinstance(entry, Mapping) else None
        for value in _strings(user):
            if len(value) >= 8:
                text = text.replace(value, "<redacted>")
    return text


def check_pool_workloads(
    kubeconfig: str,
    context: str | None,
    *,
    taint: Mapping[str, str],
    allowed_namespaces: Collection[str],
    allowed_daemonsets: Collection[str],
    skipped_namespaces: Collection[str],
    gpu_resource: Callable[[str], bool],
    lister: TemplateLister | None = None,
) -> str | None:
    """Refuse (ConfigError, naming admission.poolNamespaces) a config under which the gate
    would refuse the new pods of a workload already on the cluster: one whose pod template
    tolerates the GPU pool's `taint` without asking for a GPU (`gpu_resource`: the gate's
    test of a resource name), outside `allowed_namespaces` and `allowed_daemonsets`
    ("namespace/name"); `skipped_namespaces` are those the gate never judges.
    Infrastructure that tolerates every taint (a CNI's node agent, CSI node plugins, log
    shippers) is what this finds before a rolling update or a new node finds it.

    Only a workload that runs pods now is refused: one without (a tenant's created after the
    gate refused its pods, one scaled to zero) is named in a warning, so no tenant can hold back
    the platform's `up` by creating one.

    `lister` reads the cluster (list_templates when None). A warning instead of checking when
    the cluster cannot be reached or refuses a list; None when no workload would be refused.
    """
    try:
        templates = list((lister or list_templates)(kubeconfig, context))
    except Exception as exc:  # any failure to reach or list: skip, say so
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"{PROJECT}:admission.poolNamespaces was not checked against the cluster: listing "
            "DaemonSets, Deployments, StatefulSets and CronJobs in every namespace (which needs "
            f"list on them cluster-wide) failed: {_without_credentials(reason, kubeconfig)}. "
            "The gate refuses a new pod that asks for no GPU yet tolerates the GPU pool's taint "
            f"{taint['key']}={taint.get('value', '')}:{taint['effect']} outside "
            "admission.poolNamespaces and admission.poolDaemonSets. Check by hand that no pod "
            "template there has a toleration of that key, or one with no key and operator "
            "Exists: `kubectl get daemonsets,deployments,statefulsets,cronjobs -A -o json` "
            "(spec.template.spec.tolerations; a CronJob's under spec.jobTemplate)"
        )
    refused = refused_pool_workloads(
        templates,
        taint=taint,
        allowed_namespaces=allowed_namespaces,
        allowed_daemonsets=allowed_daemonsets,
        skipped_namespaces=skipped_namespaces,
        gpu_resource=gpu_resource,
    )
    # Only a workload that runs pods now loses something: one without (a tenant's, created
    # after the gate refused its pods; one scaled to zero) cannot hold back an `up`.
    running = [w for w in refused if w.running]
    if running:
        raise ConfigError([pool_workloads_problem(running, taint)])
    idle = [w for w in refused if not w.running]
    if idle:
        shown = ", ".join(str(w) for w in idle[:SHOWN_WORKLOADS])
        more = f", and {len(idle) - SHOWN_WORKLOADS} more" if len(idle) > SHOWN_WORKLOADS else ""
        return (
            f"{PROJECT}:admission.poolNamespaces: the gate refuses the pods of {shown}{more}: "
            f"their pod template tolerates the GPU pool's taint {taint['key']} without asking "
            "for a GPU, and they run none now. Left as they are; list a namespace in "
            "admission.poolNamespaces (or a DaemonSet in admission.poolDaemonSets) to let them "
            "run on the pool"
        )
    return None


def _forced(metadata: Any, marks: Mapping[str, Any] | None = None) -> Any:
    """`metadata` (a dict or ObjectMetaArgs) with the patchForce annotation added, and the
    annotations of `marks` (the stack's mark)."""
    added = {**(marks or {}), PATCH_FORCE: "true"}
    if isinstance(metadata, pulumi.Output):
        return metadata.apply(lambda m: _forced(m, marks))
    if metadata is None:
        return {"annotations": added}
    if isinstance(metadata, dict):
        annotations = metadata.get("annotations") or {}
        return {**metadata, "annotations": {**annotations, **added}}
    forced = copy.copy(metadata)
    forced.annotations = {**(metadata.annotations or {}), **added}
    return forced


def _plain(value: Any, what: str, kind: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(
            f"{kind}'s {what} must be a plain string, so the stack can check the object on "
            f"the cluster before applying anything; got {type(value).__name__}"
        )
    return value


def _object_ref(type_: str, props: Mapping[str, Any]) -> ObjectRef | None:
    """What a Kubernetes resource of `type_` with `props` names; None for one the API server
    names (no metadata.name)."""
    if type_ == HELM_RELEASE:
        name = _plain(props.get("name"), "name", type_)
        namespace = _plain(props.get("namespace"), "namespace", type_) or "default"
        return ObjectRef(HELM_RELEASE_API, HELM_RELEASE_KIND, namespace, name) if name else None
    metadata = props.get("metadata")
    if isinstance(metadata, pulumi.Output):
        raise TypeError(f"{type_}'s metadata must be plain, so the stack can check the object")
    if metadata is None:
        return None
    get = metadata.get if isinstance(metadata, dict) else lambda k: getattr(metadata, k, None)
    name = _plain(get("name"), "metadata.name", type_)
    if not name:
        return None
    api_version = _plain(props.get("api_version") or props.get("apiVersion"), "apiVersion", type_)
    kind = _plain(props.get("kind"), "kind", type_)
    return ObjectRef(api_version, kind, _plain(get("namespace"), "metadata.namespace", type_), name)


@dataclass(frozen=True)
class LayerSection:
    """What a refusal of a layer's object names: the layer's section of the stack config, and
    the key of the namespace it creates when that is a setting (stack_config.LAYERS)."""

    key: str
    namespace_key: str | None = None


def _section(parent: pulumi.Resource | None, sections: Mapping[str, LayerSection]) -> LayerSection:
    """The section of the layer whose child a resource is; `objects` for one of no layer."""
    return sections.get(type(parent).__name__, LayerSection("objects"))


def stack_transformation(
    claim: pulumi.Resource, ownership: Ownership, sections: Mapping[str, LayerSection]
) -> Callable[[pulumi.ResourceTransformationArgs], pulumi.ResourceTransformationResult | None]:
    """A stack transformation for every Kubernetes object but `claim`: each is declared to
    `ownership` (checked on the cluster before anything is applied), marked as the stack's
    (STACK_MARK: its id, an annotation, or a Helm release's value) and applied with force
    (Helm releases own no metadata)."""

    def transform(
        args: pulumi.ResourceTransformationArgs,
    ) -> pulumi.ResourceTransformationResult | None:
        kind = args.type_
        if not kind.startswith("kubernetes:") or args.resource is claim:
            return None
        ref = _object_ref(kind, args.props)
        if ref is not None:
            section = _section(args.opts.parent if args.opts else None, sections)
            namespace_key = section.namespace_key if ref.is_namespace else None
            ownership.declare(ref, namespace_key or section.key)
        if kind == HELM_RELEASE:
            values = marked_values(args.props.get("values"), ownership.stack_id)
            return pulumi.ResourceTransformationResult({**args.props, "values": values}, args.opts)
        marks = {STACK_MARK: ownership.stack_id}
        props = {**args.props, "metadata": _forced(args.props.get("metadata"), marks)}
        return pulumi.ResourceTransformationResult(props, args.opts)

    return transform


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """The provider and the claim handed to every component."""

    provider: k8s.Provider
    """The explicit kubernetes Provider for every Kubernetes object of the stack (it waits for
    the claim)."""
    claim: pulumi.Resource | None = None
    """The stack's claim on the cluster: what the layers that do not use `provider` wait for."""
    ownership: Ownership | None = None
    """What the program declares, checked on the cluster before the claim is written."""
    sections: Mapping[str, LayerSection] = field(default_factory=dict)
    """{layer component class name: its section}, what a refusal of a layer's object names."""

    def use_namespace(
        self, layer: pulumi.Resource, name: str, needs: Iterable[NamespaceLabel] = ()
    ) -> None:
        """`layer` uses namespace `name` (its namespace setting) without creating it: it must
        exist and carry the labels of `needs` (what the layer would put on a namespace it
        creates for its pods to run), or preview and up stop naming the label and the fix."""
        if self.ownership is not None:
            section = _section(layer, self.sections)
            self.ownership.use_namespace(name, section.namespace_key or section.key, needs)

    def seal(self) -> None:
        """Every object is declared: check them on the cluster, then write the claim (the
        program's last call; nothing of the stack is applied before it)."""
        if self.ownership is not None:
            self.ownership.seal()

    def abandon(self, error: BaseException) -> None:
        """The program failed before everything was declared: the claim, and so everything
        waiting for it, fails with `error` (nothing is applied; the run ends naming it)."""
        if self.ownership is not None:
            self.ownership.abandon(error)

    def __enter__(self) -> ClusterAccess:
        return self

    def __exit__(
        self,
        _type: type[BaseException] | None,
        error: BaseException | None,
        _traceback: TracebackType | None,
    ) -> None:
        """The end of the block that declares the stack: seal(), or abandon() when it raised."""
        if error is None:
            self.seal()
        else:
            self.abandon(error)

    @property
    def after_claim(self) -> list[pulumi.Resource]:
        """depends_on for a resource that must wait for the claim."""
        return [self.claim] if self.claim is not None else []

    def after(self, opts: pulumi.ResourceOptions | None) -> list[pulumi.Resource]:
        """depends_on for a component's resources that do not use the provider: the claim,
        and what the component itself was told to wait for (the engine does not hold a
        component's children back for its depends_on)."""
        extra: Any = opts.depends_on if opts is not None and opts.depends_on else []
        return [*self.after_claim, *([extra] if isinstance(extra, pulumi.Resource) else extra)]

    @classmethod
    def create(
        cls,
        name: str,
        kubeconfig: str,
        context: str | None,
        *,
        sections: Mapping[str, LayerSection],
        retake_claim: bool = False,
    ) -> ClusterAccess:
        """The claim (its own provider), then the provider everything else uses, both with
        `kubeconfig` content as a secret; registers the stack transformation that declares
        every other object to the ownership check and applies it with force. The claim waits
        for `seal()`."""
        secret = pulumi.Output.secret(kubeconfig)
        identity = stack_identity()
        ownership = Ownership(
            stack_id=identity,
            stack_label=stack_label(),
            retake=retake_claim,
            kubeconfig=kubeconfig,
            context=context,
            claim_where=(CLAIM_NAMESPACE, PROJECT),
            keys=ClaimKeys(CLAIM_KEY, CLAIM_LABEL_KEY, CLAIM_OBJECTS_KEY),
        )

        def provider(provider_name: str, opts: pulumi.ResourceOptions | None = None) -> Any:
            return k8s.Provider(
                provider_name,
                kubeconfig=secret if kubeconfig else None,
                context=context,
                enable_server_side_apply=True,
                # A changed ConfigMap or Secret is updated in place, not replaced (with its
                # Deployment): the Deployments roll on the checksum of what they read.
                enable_config_map_mutable=True,
                enable_secret_mutable=True,
                opts=opts,
            )

        claim = k8s.core.v1.ConfigMap(
            f"{name}-claim",
            metadata={
                "name": PROJECT,
                "namespace": CLAIM_NAMESPACE,
                "labels": {"app.kubernetes.io/part-of": PROJECT},
            },
            data={
                CLAIM_KEY: identity,
                CLAIM_LABEL_KEY: stack_label(),
                CLAIM_OBJECTS_KEY: ownership.verified,
            },
            opts=pulumi.ResourceOptions(provider=provider(f"{name}-claim-provider")),
        )
        pulumi.runtime.register_stack_transformation(
            stack_transformation(claim, ownership, sections)
        )
        main = provider(name, pulumi.ResourceOptions(depends_on=[claim]))
        return cls(provider=main, claim=claim, ownership=ownership, sections=sections)


class ClusterLayer(pulumi.ComponentResource):
    """A layer whose children are Kubernetes objects applied through the stack's provider."""

    def __init__(
        self, token: str, name: str, access: ClusterAccess, opts: pulumi.ResourceOptions | None
    ) -> None:
        super().__init__(token, name, None, opts)
        self.children = pulumi.ResourceOptions(parent=self, provider=access.provider)
        """Options for every child: parented here, applied with the stack's provider."""
