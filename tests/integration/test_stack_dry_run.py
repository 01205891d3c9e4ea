"""Every Kubernetes object a stack declares is accepted by the real kube-apiserver.

The program runs under Pulumi mocks with the stack's config (as tests/test_main.py does);
each kubernetes object it registers is then server-side applied with dryRun=All to the
harness API server, so a wrong field name, a bad label value, an invalid CEL expression or
an invalid spec fails here instead of in a platform engineer's `pulumi up`.

Objects that cannot be checked this way are listed (as a warning in pytest's summary) with
the reason, never dropped silently: dynamic-provider resources (proven by
test_node_providers_live.py), other non-Kubernetes resources (remote commands), Helm releases (their charts come from a repository this test
cannot reach) and kinds from CRDs the harness does not install.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tests.conftest import SECRET_SIG, SECRET_VALUE, Recording, Registration, run_program
from tools.harness import LocalControlPlane

# API groups served only once a chart installs their CRDs; anything else must be known.
CRD_GROUPS = {
    "monitoring.coreos.com": "CRD installed by the kube-prometheus-stack chart",
    "nvidia.com": "CRD installed by the GPU Operator chart",
}
FIELD_MANAGER = "gpu-cluster-dry-run"


@dataclass(frozen=True)
class Manifest:
    """A declared object as the kubernetes provider would send it."""

    source: str  # "<type token> <resource name>"
    body: dict[str, Any]
    patch: bool  # a *Patch resource: server-side apply onto an object that already exists

    @property
    def api_version(self) -> str:
        return str(self.body["apiVersion"])

    @property
    def kind(self) -> str:
        return str(self.body["kind"])


def _manifests(recording: Recording) -> tuple[list[Manifest], list[str]]:
    """Kubernetes objects to check, and the skipped ones with their reasons."""
    manifests: list[Manifest] = []
    skipped: list[str] = []
    for reg in recording.resources:
        source = f"{reg.typ} {reg.name}"
        if reg.typ.startswith("pulumi-python:dynamic/"):
            skipped.append(f"{source}: dynamic provider, proven by test_node_providers_live.py")
            continue
        if reg.typ.startswith(("gpu-cluster:index:", "pulumi:providers:")):
            continue  # components and providers: groupings, nothing sent to the API server
        if not reg.typ.startswith("kubernetes:"):
            skipped.append(f"{source}: not a Kubernetes object")
            continue
        if reg.typ.startswith("kubernetes:helm.sh/"):
            skipped.append(f"{source}: Helm release, its chart repository is not reachable here")
            continue
        manifests.append(_manifest(reg, source))
    for m in list(manifests):
        group = m.api_version.rpartition("/")[0]
        if group in CRD_GROUPS:
            manifests.remove(m)
            skipped.append(f"{m.source}: {m.api_version} {m.kind}, {CRD_GROUPS[group]}")
    return manifests, skipped


def _reveal(value: Any) -> Any:
    """The plain value, with Pulumi's secret wrappers removed (the provider sends it so)."""
    if isinstance(value, dict):
        if value.get(SECRET_SIG) == SECRET_VALUE:
            return _reveal(value["value"])
        return {k: _reveal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_reveal(v) for v in value]
    return value


def _manifest(reg: Registration, source: str) -> Manifest:
    body = _reveal(json.loads(json.dumps(reg.inputs, default=str)))
    patch = reg.typ.endswith("Patch")
    metadata = body.setdefault("metadata", {})
    # Without metadata.name the provider auto-names from the resource name.
    metadata.setdefault("name", reg.name)
    if patch:
        body["kind"] = body["kind"].removesuffix("Patch")
    return Manifest(source=source, body=body, patch=patch)


@pytest.fixture
def stack_nodes(api_client: Any, request: pytest.FixtureRequest) -> Iterator[None]:
    """Create the stack's inventory nodes (NodePatch targets), deleted afterwards, and the
    namespace the README asks for beforehand."""
    stack: str = request.node.callspec.params["stack"]
    stack_file = Path(__file__).resolve().parents[2] / f"Pulumi.{stack}.yaml"
    config = yaml.safe_load(stack_file.read_text())["config"]
    names = [n["name"] for n in config.get("gpu-cluster:nodes", [])]
    core = client.CoreV1Api(api_client)
    existing = {n.metadata.name for n in core.list_node().items if n.metadata}
    created = [n for n in names if n not in existing]
    for name in created:
        core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=name)))
    # A user who keeps Grafana's admin Secret outside the stack creates its namespace first.
    monitoring = config.get("gpu-cluster:monitoring") or {}
    user_namespace = monitoring.get("namespace", "monitoring")
    namespaces = {n.metadata.name for n in core.list_namespace().items if n.metadata}
    if monitoring.get("grafanaAdminSecret") and user_namespace not in namespaces:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=user_namespace)))
    try:
        yield
    finally:
        for name in created:
            core.delete_node(name)


def _apply(api: dynamic.DynamicClient, m: Manifest, dry_run: bool) -> str | None:
    """Server-side apply one manifest; the API server's complaint, or None."""
    try:
        resource = api.resources.get(api_version=m.api_version, kind=m.kind)
    except Exception as exc:  # the kind is unknown to the API server
        return f"{m.source}: {m.api_version} {m.kind} is not served: {exc}"
    metadata = m.body["metadata"]
    namespace = (metadata.get("namespace") or "default") if resource.namespaced else None
    try:
        api.server_side_apply(
            resource,
            body=m.body,
            name=metadata["name"],
            namespace=namespace,
            field_manager=FIELD_MANAGER,
            force_conflicts=True,
            dry_run="All" if dry_run else None,
        )
    except ApiException as exc:
        try:
            reason = json.loads(exc.body or "").get("message")
        except (TypeError, ValueError):
            reason = exc.reason
        return f"{m.source}: HTTP {exc.status}: {reason}"
    return None


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_stack_objects_pass_server_side_dry_run(
    stack: str,
    control_plane: LocalControlPlane,
    api_client: Any,
    stack_nodes: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(control_plane.kubeconfig_path))
    manifests, skipped = _manifests(run_program(stack))
    api = dynamic.DynamicClient(api_client)

    # Namespaced objects can only be dry-run in a namespace that exists, so the stack's
    # namespaces are applied for real first (the harness is thrown away after the session).
    namespaces = [m for m in manifests if m.kind == "Namespace" and not m.patch]
    problems = [p for m in namespaces if (p := _apply(api, m, dry_run=False))]
    problems += [p for m in manifests if m not in namespaces if (p := _apply(api, m, True))]

    if skipped:
        warnings.warn(
            f"{stack}: not dry-run ({len(skipped)}):\n  " + "\n  ".join(skipped), stacklevel=1
        )
    assert len(manifests) >= 10, f"{stack}: suspiciously few objects: {manifests}"
    assert not problems, f"{stack}: the API server rejected:\n" + "\n".join(problems)
