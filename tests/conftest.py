"""Shared Pulumi mocks and fixtures.

`run_program` runs __main__.py under Pulumi mocks with a stack's config (Pulumi.yaml defaults
overridden by Pulumi.<stack>.yaml, as the CLI does) and returns every registration the
program made (type, name, parent, dependencies, which inputs were secret) and the stack's
exports, resolved. Component tests use `register` to build one component under the same mocks.
"""

from __future__ import annotations

import contextlib
import json
import runpy
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml
from google.protobuf import json_format
from pulumi.runtime import rpc, settings
from pulumi.runtime.mocks import MockMonitor

from tests.fake_cluster import FakeCluster, monitoring_ready_cluster

ROOT = Path(__file__).resolve().parent.parent

SECRET_SIG = rpc._special_sig_key  # "4dabf18193072939515e22adb298388d"
SECRET_VALUE = rpc._special_secret_sig


@dataclass
class Registration:
    """One RegisterResource call, decoded for assertions."""

    typ: str
    name: str
    urn: str
    parent: str
    provider: str
    dependencies: list[str]
    inputs: dict[str, Any]
    secret_inputs: set[str]


@dataclass
class Recording:
    """What a program or component registered under the mocks."""

    resources: list[Registration] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)

    def of_type(self, typ: str) -> list[Registration]:
        return [r for r in self.resources if r.typ == typ]

    def named(self, name: str) -> Registration:
        matches = [r for r in self.resources if r.name == name]
        assert len(matches) == 1, f"expected one resource named {name!r}, got {len(matches)}"
        return matches[0]

    def by_urn(self, urn: str) -> Registration:
        return next(r for r in self.resources if r.urn == urn)

    def gate_policy(self) -> Registration:
        """The native gate's ValidatingAdmissionPolicy (GATE_NAME)."""
        from components.opa_gate.settings import GATE_NAME

        (policy,) = [
            r
            for r in self.of_type(
                "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
            )
            if r.inputs["metadata"]["name"] == GATE_NAME
        ]
        return policy

    def gate_document(self) -> dict[str, str]:
        """The gate's parameter document (gate_data()) as the native gate's policy was
        rendered with it."""
        from components.opa_gate.manifests import written_document

        return written_document(self.gate_policy().inputs["spec"])


UNREACHABLE_PREFIX = "unreachable-"
"""Nodes named so fail in the node-set providers' mocks, as a node the API server refuses."""


def _node_set(nodes: Mapping[str, Any], record: Callable[[Any], Any]) -> dict[str, Any]:
    """A node-set provider's outputs: every node applied, except the unreachable ones."""
    failed = {
        n: f"cannot patch node {n!r}: API server unreachable"
        for n in nodes
        if n.startswith(UNREACHABLE_PREFIX)
    }
    applied = {n: record(spec) for n, spec in nodes.items() if n not in failed}
    return {"applied": applied, "failed": failed}


class Mocks(pulumi.runtime.Mocks):
    """Echo inputs and add what the real providers compute (ids, status, metadata)."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == "pulumi-python:dynamic/gpu-cluster:ExtendedResourceNodeSet":
            nodes = dict(args.inputs["nodes"])
            outputs.update(_node_set(nodes, lambda counts: {"spec": counts, "live": counts}))
            return "extended-resources", outputs
        if args.typ == "pulumi-python:dynamic/gpu-cluster:GpuPoolNodes":
            inputs = args.inputs
            spec = {"value": inputs["value"], "labels": inputs["labels"]}
            nodes = dict.fromkeys(inputs["nodes"], spec)
            outputs.update(_node_set(nodes, lambda s: {"spec": s, "previous": None}))
            return f"{inputs['key']}:{inputs['effect']}", outputs
        if args.typ == "pulumi-python:dynamic/gpu-cluster:KubeadmConfig":
            # The real check leaves out gates the API server locks; here every gate is set.
            gates = dict(args.inputs.get("feature_gates") or {})
            outputs.update(gates=gates, notes={}, added={})
            return f"kube-system/kubeadm-config:{args.inputs['stack']}", outputs
        if args.typ == "tls:index/privateKey:PrivateKey":
            outputs["private_key_pem"] = f"-----BEGIN PRIVATE KEY-----\n{args.name}\n"
        if args.typ in (
            "tls:index/selfSignedCert:SelfSignedCert",
            "tls:index/locallySignedCert:LocallySignedCert",
        ):
            outputs["cert_pem"] = f"-----BEGIN CERTIFICATE-----\n{args.name}\n"
            outputs["validity_end_time"] = "2028-11-23T11:00:00Z"
        if args.typ == "tls:index/certRequest:CertRequest":
            outputs["cert_request_pem"] = f"-----BEGIN CERTIFICATE REQUEST-----\n{args.name}\n"
        if args.typ == "command:remote:Command":
            outputs.update(stdout="", stderr="")
        if args.typ == "kubernetes:helm.sh/v3:Release":
            inputs = args.inputs
            outputs["status"] = {
                "name": inputs.get("name") or args.name,
                "namespace": inputs.get("namespace") or "default",
                "chart": inputs.get("chart"),
                "version": inputs.get("version"),
                "status": "deployed",
                "revision": 1,
            }
        if args.typ.startswith("kubernetes:") and args.typ != "pulumi:providers:kubernetes":
            metadata = dict(outputs.get("metadata") or {})
            metadata.setdefault("name", args.name)
            metadata.setdefault("uid", f"uid-{args.name}")
            outputs["metadata"] = metadata
        return f"{args.name}-id", outputs

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        return {}, []


class RecordingMonitor(MockMonitor):
    def __init__(self, mocks: pulumi.runtime.Mocks, recording: Recording) -> None:
        super().__init__(mocks)
        self.recording = recording

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)
        if request.type == "pulumi:pulumi:Stack":
            return response
        raw = json_format.MessageToDict(request.object)
        self.recording.resources.append(
            Registration(
                typ=request.type,
                name=request.name,
                urn=response.urn,
                parent=request.parent,
                provider=request.provider,
                dependencies=list(request.dependencies),
                inputs=rpc.deserialize_properties(request.object),
                secret_inputs={k for k, v in raw.items() if _is_secret(v)},
            )
        )
        return response


def _is_secret(value: Any) -> bool:
    return isinstance(value, dict) and value.get(SECRET_SIG) == SECRET_VALUE


def stack_config(stack: str) -> dict[str, str]:
    """Pulumi.yaml defaults overridden by Pulumi.<stack>.yaml, as Pulumi's raw config map
    (objects as JSON text)."""
    from tools.harness.pulumi_engine import PROJECT, project_config

    return {
        f"{PROJECT}:{k}": v if isinstance(v, str) else json.dumps(v)
        for k, v in project_config(stack).items()
    }


def component_access(context: str | None = None) -> Any:
    """ClusterAccess for one component under test: its provider, no claim (the claim and the
    force transformation belong to the whole program, tests/test_main.py)."""
    import pulumi_kubernetes as k8s

    from components.cluster_access import ClusterAccess

    kubeconfig = pulumi.Output.secret("apiVersion: v1\nkind: Config\n")
    provider = k8s.Provider("cluster", kubeconfig=kubeconfig, context=context)
    return ClusterAccess(provider=provider)


def register(
    build: Callable[[], Any],
    config: Mapping[str, str] | None = None,
    stack: str = "dev",
    recording: Recording | None = None,
    cluster: FakeCluster | None = None,
) -> Recording:
    """Run `build` under fresh mocks and wait for every registration to finish; the ownership
    check reads `cluster` (when None: one the stack claimed, with the namespace `monitoring`
    that the dev and prod stacks use without creating it)."""
    recording = recording if recording is not None else Recording()
    fake = cluster if cluster is not None else monitoring_ready_cluster()
    with _reading(fake):
        return _register(build, config, stack, recording)


@contextlib.contextmanager
def _reading(cluster: FakeCluster) -> Iterator[None]:
    """The ownership check reads `cluster` instead of a real API server."""
    from components import ownership

    real = ownership.connect

    def connect(kubeconfig: str, context: str | None) -> ownership.ClusterReader:
        return ownership.ClusterReader(cluster.get)

    ownership.connect = connect
    try:
        yield
    finally:
        ownership.connect = real


def _register(
    build: Callable[[], Any],
    config: Mapping[str, str] | None,
    stack: str,
    recording: Recording,
) -> Recording:
    mocks = Mocks()
    settings.ROOT.set(None)  # a fresh root stack, so exports of earlier tests do not linger
    # No secret keys left from an earlier run (the SDK keeps them when none are given).
    pulumi.runtime.set_all_config(dict(config or {}), [])
    pulumi.runtime.set_mocks(
        mocks,
        project="gpu-cluster",
        stack=stack,
        preview=False,
        monitor=RecordingMonitor(mocks, recording),
    )

    @pulumi.runtime.test
    def _run() -> pulumi.Output[Any]:
        build()
        root = settings.get_root_resource()
        exports = dict(getattr(root, "outputs", {}))
        return pulumi.Output.from_input(exports).apply(recording.outputs.update)

    _run()
    return recording


def run_program(
    stack: str = "dev",
    overrides: Mapping[str, Any] | None = None,
    recording: Recording | None = None,
    cluster: FakeCluster | None = None,
) -> Recording:
    """Run __main__.py with a stack's config (plus overrides, JSON-encoded as the CLI does),
    against `cluster` (see `register`)."""
    config = stack_config(stack)
    for key, value in (overrides or {}).items():
        config[f"gpu-cluster:{key}"] = value if isinstance(value, str) else json.dumps(value)
    return register(
        lambda: runpy.run_path(str(ROOT / "__main__.py"), run_name="__main__"),
        config,
        stack,
        recording,
        cluster,
    )


@pytest.fixture
def empty_kubeconfig_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A kubeconfig file the program can read, so tests never touch ~/.kube/config."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {"token": "test-token"}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", str(path))
    monkeypatch.setenv("HOME", str(tmp_path))
    yield path
