"""What the gate costs a cluster when its API server restarts: pods refused while it starts.

A native admission policy with a `paramKind` needs the API server's informer of that kind: after
every API server start, until that informer has synced, each request the policy matches fails
("paramKind ... not yet synced to use for admission") and failurePolicy Fail refuses it, CPU
pods included. This benchmark restarts a local kube-apiserver while a client creates pods
(dry run) without pause, and counts what it refused once it answered again, for:

- `configmap-param`: the baseline, one ValidatingAdmissionPolicy bound to a ConfigMap parameter
  by name with failurePolicy Fail, whose only validation always holds (the cost of the lookup
  alone: the design the gate's native engines had);
- `stack`: the gate as OpaGate declares it for the routing engine, device plugin (the document
  written in, no parameter);
- `stack-dra`: the same in DRA mode (the claim policies, whose parameters are the templates and
  claims of the pod's namespace, failurePolicy Ignore, and the allocation policy).

With `--configmaps N` the cluster also holds N ConfigMaps (and as many ResourceClaimTemplates in
DRA mode), which every informer of their kind lists at start.

    python -m bench.admission_gap [--seconds 30] [--configmaps 0,2000] [--configmap-bytes 64]
        [--variants ...]

Prints one row per variant and size; writes them to bench/results/admission-gap/runs.csv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import ADMISSION_GAP, markdown_table, write_rows
from components.gpu_resources import DRA_DEVICE_CLASSES, DRA_DRIVER, GPU_DEVICE_CLASS
from components.kubernetes_names import service_account_user
from components.opa_gate.manifests import allocation_objects, gate_data, native_objects
from tools.harness import LocalControlPlane
from tools.harness.child_process import no_proxy_opener

SCHEDULER = "gpu-binpack-scheduler"
GATE_NAMESPACE = "gpu-admission"
TEAM = "team-a"
FILLER = "filler"
API = "/apis/admissionregistration.k8s.io/v1"
TOLERATION = {
    "key": "nvidia.com/gpu",
    "operator": "Equal",
    "value": "present",
    "effect": "NoSchedule",
}
VARIANTS = ("configmap-param", "stack", "stack-dra")
FIELDS = (
    "variant",
    "configmaps",
    "unreachable_s",
    "cpu_refused",
    "cpu_refused_window_s",
    "cpu_refused_after_ready",
    "cpu_admitted",
    "gpu_unrouted",
    "first_error",
)

Obj = tuple[str, str, dict[str, Any]]


def _objects(variant: str) -> list[Obj]:
    """(collection, name, spec) of the variant's admission objects, policies first."""
    if variant == "configmap-param":
        policy = {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {
                "resourceRules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ]
            },
            "validations": [{"expression": "true"}],
        }
        binding = {
            "policyName": "baseline",
            "validationActions": ["Deny"],
            "paramRef": {
                "name": "baseline-params",
                "namespace": GATE_NAMESPACE,
                "parameterNotFoundAction": "Allow",
            },
        }
        return [
            ("validatingadmissionpolicies", "baseline", policy),
            ("validatingadmissionpolicybindings", "baseline", binding),
        ]
    dra = variant == "stack-dra"
    params = gate_data(
        SCHEDULER,
        [],
        [],
        pool_toleration=TOLERATION,
        device_classes=DRA_DEVICE_CLASSES if dra else (),
    )
    objects = native_objects(params, routing=True, gate_namespace=GATE_NAMESPACE)
    if dra:
        objects += allocation_objects(
            allocator=service_account_user("kube-system", SCHEDULER),
            scheduler_name=SCHEDULER,
            drivers=[DRA_DRIVER],
            gate_namespace=GATE_NAMESPACE,
        )
    return objects


def _pod(gpu: bool) -> dict[str, Any]:
    limits = {"cpu": "1", **({"nvidia.com/gpu": "1"} if gpu else {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}"},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {"name": "main", "image": "registry.invalid/x:1", "resources": {"limits": limits}}
            ],
        },
    }


@dataclass
class Sample:
    at: float
    gpu: bool
    status: int
    """HTTP status; 0 when the API server did not answer."""
    scheduler: str = ""
    message: str = ""


@dataclass
class Client:
    """Creates pods (dry run) without pause, alternating CPU and GPU pods, until stopped."""

    cp: LocalControlPlane
    samples: list[Sample] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        gpu = False
        path = f"/api/v1/namespaces/{TEAM}/pods?dryRun=All"
        while not self.stop.is_set():
            gpu = not gpu
            request = urllib.request.Request(
                f"{self.cp.server}{path}", data=json.dumps(_pod(gpu)).encode(), method="POST"
            )
            request.add_header("Content-Type", "application/json")
            at = time.monotonic()
            try:
                opener = no_proxy_opener(self.cp.ssl_context())
                with opener.open(request, timeout=2) as response:
                    body = json.loads(response.read())
                self.samples.append(Sample(at, gpu, 201, body["spec"].get("schedulerName", "")))
            except urllib.error.HTTPError as exc:
                message = json.loads(exc.read() or b"{}").get("message", "")
                self.samples.append(Sample(at, gpu, exc.code, message=message))
            except (urllib.error.URLError, OSError):
                self.samples.append(Sample(at, gpu, 0))
                time.sleep(0.05)


@dataclass(frozen=True)
class Row:
    variant: str
    configmaps: int
    unreachable_s: float
    """From the first request the stopped API server did not answer to the first it answered."""
    cpu_refused: int
    """CPU pods refused once it answered again."""
    cpu_refused_window_s: float
    """From its first answer to the last CPU pod refused."""
    cpu_refused_after_ready: int
    """Of those, refused after /readyz answered 200."""
    cpu_admitted: int
    gpu_unrouted: int
    """GPU pods admitted off the stack's scheduler (the gate's variants only)."""
    first_error: str


def measure(
    samples: Sequence[Sample], variant: str, configmaps: int, down: float, ready: float
) -> Row:
    """The row of one run: what happened to the pods created once the API server, stopped at
    `down`, answered again (`ready`: when /readyz answered 200)."""
    gone = next((s.at for s in samples if s.at >= down and s.status == 0), down)
    back = [s for s in samples if s.at > gone and s.status != 0]
    first = back[0].at if back else ready
    cpu_refused = [s for s in back if not s.gpu and s.status != 201]
    gpu_unrouted = [s for s in back if s.gpu and s.status == 201 and s.scheduler != SCHEDULER]
    return Row(
        variant=variant,
        configmaps=configmaps,
        unreachable_s=round(first - gone, 2),
        cpu_refused=len(cpu_refused),
        cpu_refused_window_s=round(max(s.at for s in cpu_refused) - first, 2)
        if cpu_refused
        else 0.0,
        cpu_refused_after_ready=sum(1 for s in cpu_refused if s.at >= ready),
        cpu_admitted=sum(1 for s in back if not s.gpu and s.status == 201),
        gpu_unrouted=len(gpu_unrouted) if variant != "configmap-param" else 0,
        first_error=_reason(cpu_refused[0].message) if cpu_refused else "",
    )


def _reason(message: str) -> str:
    """What a refusal says, after the policy's and binding's names."""
    return message.rpartition("denied request: ")[2][:160]


def _fill(cp: LocalControlPlane, count: int, dra: bool, size: int) -> None:
    """`count` ConfigMaps of `size` bytes (and, in DRA mode, as many ResourceClaimTemplates) in
    the filler namespace."""
    for i in range(count):
        cp.request(
            "POST",
            f"/api/v1/namespaces/{FILLER}/configmaps",
            {"metadata": {"name": f"cm-{i}"}, "data": {"k": "v" * size}},
        )
        if dra:
            template = {
                "metadata": {"name": f"t-{i}"},
                "spec": {
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "gpu", "exactly": {"deviceClassName": GPU_DEVICE_CLASS}}
                            ]
                        }
                    }
                },
            }
            cp.request(
                "POST",
                f"/apis/resource.k8s.io/v1/namespaces/{FILLER}/resourceclaimtemplates",
                template,
            )


def _wait(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


@contextlib.contextmanager
def _plane(workdir: Path) -> Iterator[LocalControlPlane]:
    with LocalControlPlane(base_dir=workdir) as cp:
        for namespace in (GATE_NAMESPACE, TEAM, FILLER):
            cp.create_namespace(namespace)
        yield cp


def run_once(variant: str, configmaps: int, seconds: float, workdir: Path, size: int = 64) -> Row:
    """One fresh control plane with the variant's objects and `configmaps` ConfigMaps; the API
    server restarted while the client creates pods; the row."""
    with _plane(workdir) as cp:
        _fill(cp, configmaps, variant == "stack-dra", size)
        for collection, name, spec in _objects(variant):
            cp.request("POST", f"{API}/{collection}", {"metadata": {"name": name}, "spec": spec})
        if variant == "configmap-param":
            cp.request(
                "POST",
                f"/api/v1/namespaces/{GATE_NAMESPACE}/configmaps",
                {"metadata": {"name": "baseline-params"}, "data": {}},
            )
        time.sleep(3)  # the policies in force
        client = Client(cp)
        worker = threading.Thread(target=client.run, daemon=True)
        worker.start()
        time.sleep(1)
        down = time.monotonic()
        cp.restart_apiserver()
        ready = time.monotonic()
        time.sleep(seconds)
        client.stop.set()
        worker.join(timeout=10)
        return measure(client.samples, variant, configmaps, down, ready)


def table(rows: Sequence[Row]) -> str:
    return markdown_table(FIELDS, (asdict(r) for r in rows))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="pods created after ready")
    parser.add_argument("--configmaps", default="0,2000", help="comma-separated fill sizes")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--configmap-bytes", type=int, default=64, help="data of each ConfigMap")
    parser.add_argument("--csv", type=Path, default=ADMISSION_GAP / "runs.csv")
    args = parser.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; allowed: {', '.join(VARIANTS)}")
    sizes = [int(n) for n in args.configmaps.split(",") if n]
    rows: list[Row] = []
    for size in sizes:
        for variant in variants:
            print(f"==> {variant}, {size} ConfigMaps", flush=True)
            with tempfile.TemporaryDirectory(prefix="admission-gap-") as workdir:
                rows.append(
                    run_once(variant, size, args.seconds, Path(workdir), args.configmap_bytes)
                )
            write_rows(args.csv, FIELDS, (asdict(r) for r in rows))
    print(table(rows))


if __name__ == "__main__":
    main()
