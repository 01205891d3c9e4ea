"""The local cluster and the whole program on it: set-up, apply and teardown against the floor.

Measures, in one run:

- tool set-up: the warm run of tools/build-tools.sh (every tool up to date), and the cold
  build times it printed the last time each tool was built (`--build-log`, optional);
- the local cluster's start (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
  kwok) with the stack's nodes;
- `up` of the whole program through the e2e harness, a no-op `up`, and `destroy`;
- the floor: a plain client creating the same Kubernetes objects (the manifests the harness
  applied, in the same order) and deleting them, without the engine, the awaits or the
  dynamic providers. The ratio says what the harness and the program cost on top.

    .venv/bin/python -m bench.local_stack                 # the local stack
    .venv/bin/python -m bench.local_stack --stack prod    # another stack's shape

The node layers under the real Pulumi CLI are measured by bench/scale.py.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kubernetes import dynamic  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402

from tests.e2e.kubernetes import PROVIDER_TYPE, manifest  # noqa: E402
from tests.e2e.providers import HELM_RELEASE  # noqa: E402
from tests.e2e.stack import AppliedStack  # noqa: E402


def warm_tool_setup() -> float:
    started = time.monotonic()
    subprocess.run(
        ["bash", str(REPO_ROOT / "tools/build-tools.sh")], check=True, capture_output=True
    )
    return time.monotonic() - started


def cold_builds(log: Path) -> dict[str, int]:
    """`built <tool> in <n> s` lines of a build log."""
    found = re.findall(r"^built (\S+) in (\d+) s$", log.read_text(), flags=re.MULTILINE)
    return {tool: int(seconds) for tool, seconds in found}


def floor(applied: AppliedStack, bodies: list[dict[str, Any]]) -> tuple[float, float]:
    """Seconds for a plain client to create the objects in order, then delete them in reverse."""
    api = dynamic.DynamicClient(applied.api_client())

    def resource(body: dict[str, Any]) -> tuple[Any, str | None]:
        res = api.resources.get(api_version=body["apiVersion"], kind=body["kind"])
        namespace = (body["metadata"].get("namespace") or "default") if res.namespaced else None
        return res, namespace

    started = time.monotonic()
    for body in bodies:
        res, namespace = resource(body)
        res.create(body=body, namespace=namespace)
    created = time.monotonic() - started
    started = time.monotonic()
    for body in reversed(bodies):
        res, namespace = resource(body)
        try:
            res.delete(name=body["metadata"]["name"], namespace=namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return created, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", default="local")
    parser.add_argument(
        "--build-log", type=Path, nargs="*", default=[], help="tools/build-tools.sh logs to read"
    )
    args = parser.parse_args(argv)

    rows: list[tuple[str, float, float | None]] = []
    rows.append(("tools: warm set-up (all up to date)", warm_tool_setup(), None))
    with tempfile.TemporaryDirectory(prefix="bench-local-") as tmp:
        started = time.monotonic()
        with AppliedStack(args.stack, Path(tmp)) as applied:
            rows.append(("cluster start + nodes Ready", time.monotonic() - started, None))
            started = time.monotonic()
            applied.up()
            up = time.monotonic() - started
            engine = applied.engine
            assert engine is not None
            bodies = []
            for res in engine.of_prefix("kubernetes:"):
                if res.typ in (PROVIDER_TYPE, HELM_RELEASE) or res.typ.endswith("Patch"):
                    continue
                body, _ = manifest(res)
                body["metadata"]["name"] = f"floor-{body['metadata']['name']}"[:63]
                if body["kind"] == "Namespace":
                    continue  # the objects go into the stack's namespaces, which exist now
                bodies.append(body)
            count = len(engine.order)
            started = time.monotonic()
            applied.up()
            noop = time.monotonic() - started
            floor_up, floor_down = floor(applied, bodies)
            started = time.monotonic()
            applied.destroy()
            down = time.monotonic() - started
    rows += [
        (f"up ({args.stack}, {count} resources)", up, floor_up),
        ("no-op up", noop, None),
        ("destroy", down, floor_down),
    ]
    print(f"{'step':<44} {'seconds':>8} {'floor s':>8} {'ratio':>6}")
    for name, seconds, floor_s in rows:
        ratio = f"{seconds / floor_s:6.1f}" if floor_s else f"{'-':>6}"
        floor_text = f"{floor_s:8.2f}" if floor_s else f"{'-':>8}"
        print(f"{name:<44} {seconds:8.2f} {floor_text} {ratio}")
    builds = {tool: s for log in args.build_log for tool, s in cold_builds(log).items()}
    if builds:
        print("\ncold builds (from the logs):")
        for tool, seconds in builds.items():
            print(f"  {tool:<26} {seconds:>5} s")
        print(f"  {'total':<26} {sum(builds.values()):>5} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
