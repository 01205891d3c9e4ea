"""``python -m tools.demo`` (``make demo``): the whole stack on a local cluster, then workloads.

1. Builds the pinned tools on first use (etcd, kube-apiserver, kube-controller-manager,
   kube-scheduler, kwok, OPA, the monitoring CRDs), with progress; later runs reuse them.
2. Starts a local cluster (tools/harness/cluster.py: etcd, kube-apiserver with
   ExtendedResourceToleration, kube-controller-manager, kube-scheduler, kwok) with the nodes
   of Pulumi.<stack>.yaml as simulated kubelets; GPU pool nodes advertise nvidia.com/gpu.
3. Runs `pulumi up` of the whole program (__main__.py) with the real Pulumi CLI and the real
   kubernetes provider (built like the tools), its output shown as it comes; the Helm
   releases install local charts that render their values, then a second `up` changes
   nothing.
4. Runs what a user runs: GPU pods with only their GPU limit and the scheduler name, bound
   by the stack's own scheduler (a kube-scheduler process started from the applied
   ConfigMap with the token of the stack's ServiceAccount); a GPU pod without the scheduler
   name, routed to that scheduler (or refused, with a reject-only admission engine); one
   naming another scheduler, refused by the applied gate; a CPU pod, kept off the GPU nodes;
   with scheduler.gangScheduling, a distributed job (an indexed Job of GPU workers and a
   launcher in one PodGroup) that waits whole while the pool is full and starts whole when
   room appears (tools/harness/gangs.py).
5. Shows the dashboard ConfigMap and the PrometheusRule, runs `pulumi destroy` and checks the
   nodes are as before and no object of the stack is left.

What cannot run here (the charts' own workloads, SSH to hosts) is said in README.md, "What
`make demo` proves".
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, dynamic
from kubernetes.client.exceptions import ApiException

from tools.harness import gangs
from tools.harness.pulumi_engine import project_config
from tools.harness.stack import STACK_TOOLS, AppliedStack, StackError
from tools.harness.tools import missing_tools

REPO_ROOT = Path(__file__).resolve().parents[1]

GPU = "nvidia.com/gpu"


def step(text: str) -> None:
    print(f"\n==> {text}", flush=True)


def ensure_tools() -> None:
    """Build whatever is missing (each build is a no-op when up to date), with progress."""
    if missing_tools(STACK_TOOLS):
        subprocess.run(["bash", str(REPO_ROOT / "tools/build-tools.sh")], check=True)
        subprocess.run(["bash", str(REPO_ROOT / "tools/build-pulumi.sh")], check=True)


def cli_output(line: str) -> None:
    """A line of the CLI's own output, indented under the demo's steps."""
    print(f"  | {line.rstrip()}", flush=True)


def print_nodes(title: str, state: dict[str, dict[str, Any]]) -> None:
    print(f"  {title}")
    print(f"    {'node':<16} {'gpu':>4} {'dongle':>6}  taints / pool labels")
    for name, node in state.items():
        taints = ", ".join(f"{k}{'=' + v if v else ''}:{e}" for k, v, e in node["taints"]) or "-"
        labels = ", ".join(f"{k}={v}" for k, v in node["labels"].items() if "gpu-cluster" in k)
        gpus = node["allocatable"].get(GPU, "-")
        dongles = node["allocatable"].get("example.com/dongle", "-")
        print(f"    {name:<16} {gpus:>4} {dongles:>6}  {taints}{'; ' + labels if labels else ''}")


def pod(name: str, limits: dict[str, str], scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.invalid/job:1", "resources": {}}]
    }
    spec["containers"][0]["resources"]["limits" if GPU in limits else "requests"] = limits
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def wait_running(core: Any, ns: str, names: list[str], timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        pods = {n: core.read_namespaced_pod(n, ns) for n in names}
        if all(p.status.phase == "Running" for p in pods.values()):
            return pods
        if time.monotonic() > deadline:
            pending = [n for n, p in pods.items() if p.status.phase != "Running"]
            raise RuntimeError(f"pods not Running after {timeout:.0f} s: {pending}")
        time.sleep(0.3)


def scheduled_by(core: Any, ns: str, name: str) -> str:
    events = core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},reason=Scheduled"
    ).items
    return ", ".join(sorted({e.reporting_component or "" for e in events})) or "?"


def admitted(core: Any, ns: str, manifest: dict[str, Any]) -> bool:
    """Create the pod; print the gate's refusal and return False when it refuses."""
    try:
        core.create_namespaced_pod(ns, manifest)
        return True
    except ApiException as exc:
        message = yaml.safe_load(exc.body or "{}").get("message", exc.reason)
        print(f"  refused, HTTP {exc.status}: {message}")
        return False


def workloads(applied: AppliedStack) -> None:
    core: Any = client.CoreV1Api(applied.api_client())
    scheduler = applied.outputs["schedulerName"]
    ns = f"demo-{uuid.uuid4().hex[:6]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    step(f"GPU pods with only a GPU limit and schedulerName {scheduler}")
    names = ["train-a", "train-b", "train-c"]
    for name, gpus in zip(names, ("2", "1", "1"), strict=True):
        core.create_namespaced_pod(ns, pod(name, {GPU: gpus}, scheduler))
    for name, p in wait_running(core, ns, names).items():
        tolerations = [f"{t.key}:{t.effect}" for t in p.spec.tolerations or [] if t.key == GPU]
        print(
            f"  {name}: {p.status.phase} on {p.spec.node_name}, bound by "
            f"{scheduled_by(core, ns, name)}; tolerations added at admission: {tolerations}"
        )

    step("a GPU pod without the scheduler name")
    if admitted(core, ns, pod("stray", {GPU: "1"})):
        stray = wait_running(core, ns, ["stray"])["stray"]
        print(
            f"  routed at admission: schedulerName {stray.spec.scheduler_name}, "
            f"{stray.status.phase} on {stray.spec.node_name}, bound by "
            f"{scheduled_by(core, ns, 'stray')}"
        )

    step("a GPU pod naming another scheduler")
    if admitted(core, ns, pod("elsewhere", {GPU: "1"}, "team-scheduler")):
        print("  ADMITTED (the gate did not refuse it)")

    step("a CPU pod")
    core.create_namespaced_pod(ns, pod("web", {"cpu": "100m"}))
    web = wait_running(core, ns, ["web"])["web"]
    where = "a GPU node!" if web.spec.node_name in applied.gpu_nodes else "a CPU node"
    print(f"  web: Running on {web.spec.node_name} ({where})")
    if (project_config(applied.stack).get("scheduler") or {}).get("gangScheduling"):
        gang_job(applied, core, ns)
    core.delete_namespace(ns)


def gang_job(applied: AppliedStack, core: Any, ns: str) -> None:
    workers = 3
    step(f"a gang: an indexed Job of {workers} GPU workers and a launcher in one PodGroup")
    fillers = gangs.fill_pool(core, ns, applied.gpu_nodes, leave=workers - 1)
    print(f"  the pool filled but for {workers - 1} GPUs ({len(fillers)} filler pods)")
    gang = gangs.submit_gang(applied.api_client(), ns, "train-gang", workers)
    gang.wait_created(core)
    time.sleep(10)
    print(
        f"  after 10 s, members bound: {len(gang.bound(core))} of {gang.members} (none: whole or not at all)"
    )
    core.delete_namespaced_pod(fillers[0], ns, grace_period_seconds=0)
    print(f"  {fillers[0]} deleted")
    for name, node in sorted(gang.wait_started(core).items()):
        print(f"  {name}: started on {node}, bound by {scheduled_by(core, ns, name)}")


def monitoring(applied: AppliedStack) -> None:
    outputs = applied.outputs
    if "gpuDashboard" not in outputs:
        print("  (monitoring is off in this stack)")
        return
    api = dynamic.DynamicClient(applied.api_client())
    maps = api.resources.get(api_version="v1", kind="ConfigMap")
    dashboard = outputs["gpuDashboard"]
    namespace = outputs["monitoringNamespace"]
    found = maps.get(namespace=namespace, label_selector="grafana_dashboard=1").items
    print(f"  dashboard ConfigMap(s) in {namespace}: {[m.metadata.name for m in found]}")
    print(f"  dashboard: {dashboard}")
    rules = api.resources.get(api_version="monitoring.coreos.com/v1", kind="PrometheusRule")
    for rule in rules.get(namespace=namespace).items:
        alerts = [r.alert for g in rule.spec.groups for r in g.rules if r.alert]
        print(f"  PrometheusRule {rule.metadata.name}: {', '.join(alerts)}")
    for key in ("gpuOperatorRelease", "monitoringRelease"):
        if key in outputs:
            print(f"  Helm release {key.removesuffix('Release')}: {outputs[key]}")


def run(stack: str) -> int:
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="gpu-cluster-demo-") as tmp:
        step(f"local cluster with the nodes of Pulumi.{stack}.yaml (kwok kubelets)")
        with AppliedStack(stack, Path(tmp)) as applied:
            print_nodes("before", applied.nodes_before)

            step("pulumi up (the real CLI and kubernetes provider)")
            started = time.monotonic()
            created = applied.up(on_output=cli_output)
            print(f"  {len(created)} resources created in {time.monotonic() - started:.1f} s")
            print_nodes("after", applied.node_state())
            started = time.monotonic()
            again = applied.up()
            print(
                f"  second up: {len(applied.engine.steps) - len(again)} unchanged, "
                f"{len(again)} changed in {time.monotonic() - started:.1f} s"
            )

            workloads(applied)

            step("monitoring objects")
            monitoring(applied)

            step("pulumi destroy")
            objects = applied.kubernetes_objects()
            started = time.monotonic()
            deleted = applied.destroy(on_output=cli_output)
            print(f"  {len(deleted)} resources deleted in {time.monotonic() - started:.1f} s")
            same = applied.node_state() == applied.nodes_before
            print(f"  nodes as before (taints, labels, capacity): {'yes' if same else 'NO'}")
            left = [f"{o['kind']} {o['name']}" for o in objects if applied.exists(o)]
            print(f"  objects of the stack left: {', '.join(left) or 'none'}")
            print(
                "  kept on purpose: the monitoring.coreos.com CRDs, which the chart installs "
                "and `helm uninstall` keeps"
            )
            if not same or left:
                print_nodes("after destroy", applied.node_state())
                return 1
    return 0


def preview(stack: str) -> int:
    """`pulumi preview --diff` of a new stack against a fresh local cluster (CI's check that
    the program still previews); fails when the preview fails or plans no create."""
    ensure_tools()
    with tempfile.TemporaryDirectory(prefix="gpu-cluster-preview-") as tmp:
        step(f"local cluster with the nodes of Pulumi.{stack}.yaml (kwok kubelets)")
        with AppliedStack(stack, Path(tmp)) as applied:
            step(f"pulumi preview --diff --stack {stack}")
            try:
                planned = applied.preview(on_output=cli_output)
            except StackError as exc:
                print(f"preview failed:\n{exc}", file=sys.stderr)
                return 1
            creates = [urn for op, urn in planned if op == "create"]
            print(f"  {len(creates)} resources to create, {len(planned)} changes in all")
            return 0 if creates else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="local", help="stack config to apply (default: local)")
    parser.add_argument(
        "--preview", action="store_true", help="only `pulumi preview --diff` on a fresh cluster"
    )
    args = parser.parse_args(argv)
    return preview(args.stack) if args.preview else run(args.stack)


if __name__ == "__main__":
    sys.exit(main())
