"""The admission section of the stack config: OpaGate's settings and the facts they name.

The engines, failure policies and the names every engine's objects share (the gate, its
webhook, its default namespace) are settings facts; the policies OPA loads default to
policies/*.rego. components/opa_gate_manifests.py renders the objects from these values.

failurePolicy: `Fail` means no GPU pod is admitted while the gate cannot answer (OPA down,
timeout), so bin-packing is never bypassed; CPU pods never reach OPA, so an outage does not
block them. `Ignore` admits GPU pods during an outage, possibly onto the default scheduler.
The native engines have no server to fail, so their failure policy only matters for CEL
evaluation errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, get_args

from components.settings import BOOL, PROJECT, Settings, between, choice

AdmissionEngine = Literal["mutating-admission-policy", "validating-admission-policy", "opa"]
ADMISSION_ENGINES: tuple[AdmissionEngine, ...] = get_args(AdmissionEngine)
FailurePolicy = Literal["Fail", "Ignore"]
FAILURE_POLICIES: tuple[FailurePolicy, ...] = get_args(FailurePolicy)

POLICY_DIR = Path(__file__).resolve().parent.parent / "policies"
# The engine that routes GPU pods (MutatingAdmissionPolicy) and the first minor version that
# serves its GA API, admissionregistration.k8s.io/v1, without a feature gate.
# Ref: https://kubernetes.io/docs/reference/access-authn-authz/mutating-admission-policy/
ROUTING_ENGINE: AdmissionEngine = "mutating-admission-policy"
ROUTING_MIN_MINOR = 36
# Name of the ValidatingWebhookConfiguration, ValidatingAdmissionPolicy and its binding
# (and of the MutatingAdmissionPolicy and its binding).
GATE_NAME = "gpu-scheduler-gate"
# The gate's namespace when none is given (OpaGateArgs.namespace's default).
DEFAULT_GATE_NAMESPACE = "gpu-admission"
WEBHOOK_NAME = f"gpu-scheduler.{PROJECT}.io"


def load_policies(directory: Path = POLICY_DIR) -> dict[str, str]:
    """{file stem: Rego source} of the policies in `directory`, tests excluded."""
    return {
        path.stem: path.read_text()
        for path in sorted(directory.glob("*.rego"))
        if not path.stem.endswith("_test")
    }


class OpaGateSettings(Settings):
    """The gate that keeps GPU pods on the binpack scheduler (the stack config's admission)."""

    engine: Annotated[AdmissionEngine, choice(ADMISSION_ENGINES)] = ROUTING_ENGINE
    """`mutating-admission-policy` (native, Kubernetes v1.36+: GPU pods that leave
    spec.schedulerName unset are routed to the binpack scheduler and given the pool's
    toleration; only what cannot be routed is refused), `validating-admission-policy`
    (native, refuses GPU pods off the binpack scheduler) or `opa` (webhook, refuses them
    too). The native engines need no server."""
    failure_policy: Annotated[FailurePolicy, choice(FAILURE_POLICIES)] = "Fail"
    """Fail: a GPU pod is refused while the gate cannot answer. Ignore: it is admitted."""
    timeout_seconds: Annotated[int, between(1, 30)] = 5
    """Webhook timeout in seconds (the API server allows 1-30)."""
    replicas: Annotated[int, between(1, 5)] = 2
    """OPA replicas (engine opa)."""
    gate_extended_resources: Annotated[bool, BOOL] = True
    """Also gate the extended resources this stack advertises (extendedResources)."""
