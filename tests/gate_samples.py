"""The gate's sample table (tests/fixtures/gate_samples.yaml): sample pods and the verdict each
engine must reach on them, read into plain objects for the live tests."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

SAMPLES_FILE = Path(__file__).resolve().parent / "fixtures" / "gate_samples.yaml"
Verdict = Literal["allowed", "routed", "refused"]
VERDICTS: tuple[Verdict, ...] = ("allowed", "routed", "refused")
# The engines that only refuse, and the one that routes.
REFUSING_ENGINES = ("opa", "validating-admission-policy")
ROUTING_ENGINE = "mutating-admission-policy"


@dataclass(frozen=True)
class Sample:
    name: str
    spec: dict[str, Any]
    """The pod's spec as a user writes it; containers hold only their resources' limits and
    claims, and get a name and image when built."""
    refuse: Verdict
    """The verdict of the refusing engines."""
    route: Verdict
    """The verdict of the routing engine."""
    message: str | None
    """Part of the refusal message; {pod} stands for namespace/name."""

    def verdict(self, engine: str) -> Verdict:
        return self.route if engine == ROUTING_ENGINE else self.refuse

    def pod(self, name: str) -> dict[str, Any]:
        spec = dict(self.spec)
        for field in ("containers", "initContainers"):
            if field in spec:
                spec[field] = [
                    {
                        "name": f"{field.lower()[:4]}-{i}",
                        "image": "registry.invalid/sample:1",
                        "resources": {
                            k: container[k] for k in ("limits", "claims") if k in container
                        },
                    }
                    for i, container in enumerate(spec[field])
                ]
        spec.setdefault("automountServiceAccountToken", False)
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@dataclass(frozen=True)
class SampleTable:
    scheduler: str
    gpu_resources: list[str]
    gpu_resource_prefixes: list[str]
    samples: list[Sample]


def load_samples(path: Path = SAMPLES_FILE) -> SampleTable:
    raw = yaml.safe_load(path.read_text())
    samples = []
    for entry in raw["samples"]:
        both = entry.get("verdict")
        samples.append(
            Sample(
                name=entry["name"],
                spec=entry["pod"],
                refuse=entry.get("refuse", both),
                route=entry.get("route", both),
                message=entry.get("message"),
            )
        )
    return SampleTable(
        scheduler=raw["scheduler"],
        gpu_resources=list(raw["gpu_resources"]),
        gpu_resource_prefixes=list(raw["gpu_resource_prefixes"]),
        samples=samples,
    )
