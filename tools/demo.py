"""``python -m tools.demo`` (``make demo``): the stack, for real, on a local control plane.

1. Builds the pinned tools on first use (etcd, kube-apiserver, kube-scheduler, OPA,
   promtool, the Pulumi CLI), with progress; later runs reuse them.
2. Starts etcd + kube-apiserver on loopback and creates the nodes of Pulumi.local.yaml
   (GPU pool nodes advertise nvidia.com/gpu as the device plugin would).
3. Runs the stack's node layers (ExtendedResourceNode, TaintedGpuPool) with the real Pulumi
   engine: ``up``, then a second ``up`` that changes nothing.
4. Runs the binpack scheduler as a local process from the configuration BinpackScheduler
   renders, binds GPU pods, and registers the gate's ValidatingAdmissionPolicy from the
   OpaGate spec functions, which rejects a GPU pod without that scheduler name.
5. ``destroy``, checks the nodes are exactly as before, and stops everything.

The kubernetes provider plugin cannot be built from the Go module proxy (tools/README.md),
so the scheduler's and the gate's Kubernetes objects are not created through the engine
here: the scheduler runs from the same rendered configuration and the gate's policy is
created from the same spec functions the components use.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from components.binpack_scheduler import render_config_yaml
from components.opa_gate import (
    GATE_NAME,
    admission_policy_binding_spec,
    admission_policy_spec,
    gate_data,
)
from stack_config import StackConfig
from tools.harness import CONTROL_PLANE_TOOLS, LocalControlPlane, missing_tools
from tools.harness.fake_nodes import GPU_RESOURCE, create_nodes, inventory_nodes
from tools.harness.fake_nodes import snapshot as node_snapshot
from tools.harness.pulumi_engine import (
    PULUMI_ENGINE_TOOLS,
    inline_stack,
    node_layers_program,
    stack_file_config,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
STACK = "local"


def gpu_pod(name: str, gpus: int, taint: dict[str, str], scheduler: str | None) -> client.V1Pod:
    """A pod requesting whole GPUs and tolerating the pool's taint."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            scheduler_name=scheduler,
            automount_service_account_token=False,
            tolerations=[
                client.V1Toleration(key=taint["key"], operator="Exists", effect=taint["effect"])
            ],
            containers=[
                client.V1Container(
                    name="cuda",
                    image="nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04",
                    resources=client.V1ResourceRequirements(
                        requests={GPU_RESOURCE: str(gpus)}, limits={GPU_RESOURCE: str(gpus)}
                    ),
                )
            ],
        ),
    )


def wait_bound(
    core: client.CoreV1Api, ns: str, names: Sequence[str], timeout: float = 60
) -> dict[str, str]:
    """Pod name -> node name, once every pod is bound (or what is bound after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        bound = {}
        for name in names:
            pod: Any = core.read_namespaced_pod(name, ns)
            if pod.spec.node_name:
                bound[name] = pod.spec.node_name
        if len(bound) == len(names) or time.monotonic() > deadline:
            return bound
        time.sleep(0.2)


def rejection(core: client.CoreV1Api, ns: str, pod: client.V1Pod, timeout: float = 30) -> str:
    """The API server's message refusing `pod` (a dry-run create).

    A freshly created ValidatingAdmissionPolicy takes a moment to be enforced, so an
    admitted probe is retried until `timeout`.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.create_namespaced_pod(ns, pod, dry_run="All")
        except ApiException as exc:
            if exc.status in (400, 403, 422):
                return str(yaml.safe_load(exc.body or "{}").get("message") or exc.reason)
            raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gate still admits the pod after {timeout:.0f} s")
        time.sleep(0.3)


@contextmanager
def admission_policy(cp: LocalControlPlane, config: StackConfig) -> Iterator[None]:
    """The gate's ValidatingAdmissionPolicy and binding, from OpaGate's spec functions."""
    advertised = sorted({r for res in config.extended_resources.values() for r in res})
    data = gate_data(config.scheduler.name, advertised, [])
    api = "/apis/admissionregistration.k8s.io/v1"
    policy = {"metadata": {"name": GATE_NAME}, "spec": admission_policy_spec(data)}
    binding = {"metadata": {"name": GATE_NAME}, "spec": admission_policy_binding_spec()}
    cp.request("POST", f"{api}/validatingadmissionpolicies", policy)
    cp.request("POST", f"{api}/validatingadmissionpolicybindings", binding)
    try:
        yield
    finally:
        cp.request("DELETE", f"{api}/validatingadmissionpolicybindings/{GATE_NAME}")
        cp.request("DELETE", f"{api}/validatingadmissionpolicies/{GATE_NAME}")


def ensure_tools() -> None:
    """Build whatever is missing (no-ops when up to date), showing the builders' progress."""
    if missing_tools(("opa", *CONTROL_PLANE_TOOLS)):
        subprocess.run(["bash", str(REPO_ROOT / "tools/build-tools.sh")], check=True)
    if missing_tools(PULUMI_ENGINE_TOOLS):
        subprocess.run(["bash", str(REPO_ROOT / "tools/build-pulumi.sh")], check=True)


def print_nodes(title: str, snap: dict[str, dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"  {'node':<13} {'nvidia.com/gpu':>14} {'example.com/dongle':>18}  taints")
    for name, node in snap.items():
        taints = ", ".join(
            f"{t['key']}{'=' + t['value'] if t.get('value') else ''}:{t['effect']}"
            for t in node["taints"]
        )
        gpus = node["allocatable"].get(GPU_RESOURCE, "-")
        dongles = node["allocatable"].get("example.com/dongle", "-")
        print(f"  {name:<13} {gpus:>14} {dongles:>18}  {taints or '-'}")


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def run(keep: bool) -> int:
    config = stack_file_config(STACK)
    ensure_tools()
    step("starting etcd + kube-apiserver on 127.0.0.1")
    with LocalControlPlane() as cp:
        api_client = cp.api_client()
        core = client.CoreV1Api(api_client)
        nodes = create_nodes(api_client, inventory_nodes(config))
        before = node_snapshot(api_client, nodes)
        print_nodes("nodes before", before)

        step("pulumi up (node layers, real engine, local backend)")
        stack = inline_stack(
            "gpu-cluster",
            STACK,
            node_layers_program(config, cp.kubeconfig_yaml()),
            cp.workdir / "pulumi",
        )
        started = time.monotonic()
        first = stack.up(on_output=print)
        print(f"pulumi up: {first.summary.resource_changes} in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        again = stack.up()
        print(
            f"second pulumi up: {again.summary.resource_changes} "
            f"in {time.monotonic() - started:.1f} s"
        )
        print_nodes("nodes after pulumi up", node_snapshot(api_client, nodes))
        taint = first.outputs["gpuTaint"].value

        step(f"{config.scheduler.name}: kube-scheduler with the rendered configuration")
        ns = f"demo-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        # No controller-manager runs here to create the namespace's default ServiceAccount.
        core.create_namespaced_service_account(
            ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
        )
        names = [f"train-{i}" for i in range(3)]
        with cp.start_scheduler(render_config_yaml(config.scheduler.profile)):
            for name in names:
                core.create_namespaced_pod(ns, gpu_pod(name, 1, taint, config.scheduler.name))
            for pod, node in sorted(wait_bound(core, ns, names).items()):
                print(f"  {ns}/{pod}: 1 GPU, schedulerName={config.scheduler.name} -> {node}")

        step("the gate (ValidatingAdmissionPolicy) and a GPU pod without the scheduler name")
        with admission_policy(cp, config):
            message = rejection(core, ns, gpu_pod("rogue", 1, taint, None))
            print(f"  rejected: {message}")
            if keep:
                print(f"\n  export KUBECONFIG={cp.kubeconfig_path}\n  Ctrl-C to finish")
                try:
                    while True:
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass

        step("pulumi destroy")
        stack.destroy(on_output=print)
        after = node_snapshot(api_client, nodes)
        print_nodes("nodes after pulumi destroy", after)
        same = after == before
        print(f"\nnodes exactly as before: {'yes' if same else 'NO'}")
        step("stopping the control plane")
    return 0 if same else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.demo", description="gpu-cluster on a local control plane"
    )
    parser.add_argument("--keep", action="store_true", help="pause before destroy until Ctrl-C")
    args = parser.parse_args(argv)
    return run(args.keep)


if __name__ == "__main__":
    sys.exit(main())
