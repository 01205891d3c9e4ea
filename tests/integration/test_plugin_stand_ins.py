"""The tls and command provider stand-ins (tools/plugins) under the real Pulumi engine.

Small inline programs run through the pulumi CLI built in .tools/bin, which starts
pulumi-resource-tls and pulumi-resource-command from tools/plugins/bin on PATH, the way it
starts the real plugins. The TLS tests share one deployment and run in file order; the last
one destroys it. The command tests record (no host is contacted) or run over SSH against an
sshd on 127.0.0.1.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pulumi
import pulumi_command.remote as remote
import pulumi_tls as tls
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from pulumi import automation as auto
from pulumi.runtime import rpc

from tests.integration.conftest import Sshd, require_tools
from tools.harness import tools_bin
from tools.harness.pulumi_engine import REPO_ROOT, inline_stack
from tools.plugins.command import RECORD_ENV

PLUGINS_BIN = REPO_ROOT / "tools" / "plugins" / "bin"
DNS_NAMES = ["opa.gate.svc", "opa.gate.svc.cluster.local"]
# The stack, two keys, the CA, the request and the serving certificate.
TLS_RESOURCES = 6
# The hosts of the e2e stacks: never contacted, only recorded.
UNREACHABLE = "10.10.0.10"
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK0wmN/Cr3JXqmLW7u+g9pTh+wyqDHpSQEIQczXkVx9q"
NOT_A_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nbm90LWEta2V5\n-----END OPENSSH PRIVATE KEY-----\n"


def _stack(name: str, program: auto.PulumiFn, state_dir: Path, **env: str) -> auto.Stack:
    """A stack whose engine finds the stand-ins on PATH, ahead of anything installed."""
    require_tools("pulumi")
    path = os.pathsep.join([str(PLUGINS_BIN), str(tools_bin()), os.environ.get("PATH", "")])
    return inline_stack("plugin-stand-ins", name, program, state_dir, {"PATH": path, **env})


def _resources(stack: auto.Stack) -> list[dict[str, Any]]:
    """The resources of `pulumi stack export --show-secrets` (the Automation API's export)."""
    return list((stack.export_stack().deployment or {}).get("resources") or [])


def _stored_state(state_dir: Path, stack: str) -> str:
    """The stack's checkpoint as the backend stores it (secrets encrypted)."""
    (path,) = state_dir.glob(f"backend/.pulumi/stacks/*/{stack}.json")
    return path.read_text()


def _is_secret(value: Any) -> bool:
    """A value the exported deployment marks as a secret (shown, since it is exported with them)."""
    return (
        isinstance(value, dict)
        and value.get(rpc._special_sig_key) == rpc._special_secret_sig
        and set(value) == {rpc._special_sig_key, "plaintext"}
    )


# --- tls -----------------------------------------------------------------------------------


def _tls_program(serving_hours: int) -> auto.PulumiFn:
    """A CA and a serving certificate it signs, as OpaGate declares them."""

    def program() -> None:
        ca_key = tls.PrivateKey("ca-key", algorithm="ECDSA", ecdsa_curve="P256")
        ca = tls.SelfSignedCert(
            "ca",
            private_key_pem=ca_key.private_key_pem,
            is_ca_certificate=True,
            subject=tls.SelfSignedCertSubjectArgs(common_name="stand-in CA"),
            validity_period_hours=24,
            allowed_uses=["cert_signing", "crl_signing", "digital_signature"],
        )
        key = tls.PrivateKey("serving-key", algorithm="RSA", rsa_bits=2048)
        request = tls.CertRequest(
            "serving-csr",
            private_key_pem=key.private_key_pem,
            subject=tls.CertRequestSubjectArgs(common_name=DNS_NAMES[0]),
            dns_names=DNS_NAMES,
        )
        cert = tls.LocallySignedCert(
            "serving-cert",
            cert_request_pem=request.cert_request_pem,
            ca_private_key_pem=ca_key.private_key_pem,
            ca_cert_pem=ca.cert_pem,
            validity_period_hours=serving_hours,
            early_renewal_hours=1,
            allowed_uses=["digital_signature", "key_encipherment", "server_auth"],
        )
        pulumi.export("caCert", ca.cert_pem)
        pulumi.export("cert", cert.cert_pem)
        pulumi.export("servingPublicKey", key.public_key_pem)

    return program


@dataclass
class TlsDeployment:
    stack: auto.Stack
    state_dir: Path
    first: auto.UpResult
    destroyed: bool = False

    def cert(self, result: auto.UpResult | None = None) -> x509.Certificate:
        outputs = (result or self.first).outputs
        return x509.load_pem_x509_certificate(outputs["cert"].value.encode())


@pytest.fixture(scope="module")
def tls_deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsDeployment]:
    state_dir = tmp_path_factory.mktemp("tls")
    stack = _stack("tls", _tls_program(48), state_dir)
    deployment = TlsDeployment(stack, state_dir, stack.up())
    try:
        yield deployment
    finally:
        if not deployment.destroyed:
            stack.destroy()


def test_tls_stand_in_chain_verifies_against_the_ca(tls_deployment: TlsDeployment) -> None:
    outputs = tls_deployment.first.outputs
    ca = x509.load_pem_x509_certificate(outputs["caCert"].value.encode())
    cert = tls_deployment.cert()
    serving_key = serialization.load_pem_public_key(outputs["servingPublicKey"].value.encode())

    assert tls_deployment.first.summary.resource_changes == {"create": TLS_RESOURCES}
    cert.verify_directly_issued_by(ca)
    assert cert.public_key() == serving_key
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    alt_names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert alt_names.get_values_for_type(x509.DNSName) == DNS_NAMES


def test_tls_stand_in_keeps_private_keys_secret_in_the_state(
    tls_deployment: TlsDeployment,
) -> None:
    resources = _resources(tls_deployment.stack)
    keys = [r for r in resources if r["type"] == "tls:index/privateKey:PrivateKey"]
    signed = next(r for r in resources if r["type"].endswith(":LocallySignedCert"))

    assert "PRIVATE KEY" not in _stored_state(tls_deployment.state_dir, "tls")
    assert len(keys) == 2
    for secret in [
        *(k["outputs"][o] for k in keys for o in ("privateKeyPem", "privateKeyPemPkcs8")),
        signed["inputs"]["caPrivateKeyPem"],
    ]:
        assert _is_secret(secret), secret


def test_tls_stand_in_second_up_changes_nothing(tls_deployment: TlsDeployment) -> None:
    again = tls_deployment.stack.up()

    assert again.summary.resource_changes == {"same": TLS_RESOURCES}
    assert tls_deployment.cert(again) == tls_deployment.cert()


def test_tls_stand_in_validity_change_replaces_the_cert(tls_deployment: TlsDeployment) -> None:
    changed = tls_deployment.stack.up(program=_tls_program(72))
    cert = tls_deployment.cert(changed)

    assert changed.summary.resource_changes == {"replace": 1, "same": TLS_RESOURCES - 1}
    assert cert.serial_number != tls_deployment.cert().serial_number
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == datetime.timedelta(hours=72)


def test_tls_stand_in_destroy_deletes_all(tls_deployment: TlsDeployment) -> None:
    result = tls_deployment.stack.destroy()
    tls_deployment.destroyed = True

    assert result.summary.resource_changes == {"delete": TLS_RESOURCES}
    assert _resources(tls_deployment.stack) == []


# --- command -------------------------------------------------------------------------------


def _recorded_program(create: str, triggers: list[str]) -> auto.PulumiFn:
    """One command with create, update and delete, options as ControlPlaneFeatures sets them."""

    def program() -> None:
        remote.Command(
            "guard-cp-1",
            connection=remote.ConnectionArgs(
                host=UNREACHABLE,
                user="root",
                private_key=pulumi.Output.secret(NOT_A_KEY),
                host_key=HOST_KEY,
            ),
            create=create,
            update="converge",
            delete="restore",
            triggers=triggers,
            opts=pulumi.ResourceOptions(delete_before_replace=True),
        )

    return program


def _lines(record: Path) -> list[dict[str, Any]]:
    """The records appended since the last call (the file is emptied)."""
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    record.write_text("")
    return lines


def _op(op: str, command: str) -> dict[str, Any]:
    return {"op": op, "name": "guard-cp-1", "host": UNREACHABLE, "port": 22, "command": command}


def test_command_stand_in_records_each_operation_without_connecting(tmp_path: Path) -> None:
    record = tmp_path / "commands.jsonl"
    record.touch()
    stack = _stack(
        "record", _recorded_program("check", ["1"]), tmp_path / "state", **{RECORD_ENV: str(record)}
    )

    stack.up()
    assert _lines(record) == [_op("create", "check")]
    stack.up(program=_recorded_program("check --strict", ["1"]))
    assert _lines(record) == [_op("update", "converge")]
    stack.up(program=_recorded_program("check --strict", ["2"]))
    assert _lines(record) == [_op("delete", "restore"), _op("create", "check --strict")]
    stack.up(program=_recorded_program("check --strict", ["2"]))
    assert _lines(record) == []
    stack.destroy()
    assert _lines(record) == [_op("delete", "restore")]


def test_command_stand_in_keeps_the_connection_secret(tmp_path: Path) -> None:
    record = tmp_path / "commands.jsonl"
    stack = _stack(
        "secret", _recorded_program("check", []), tmp_path / "state", **{RECORD_ENV: str(record)}
    )
    stack.up()
    try:
        (command,) = [r for r in _resources(stack) if r["type"] == "command:remote:Command"]
        assert "bm90LWEta2V5" not in _stored_state(tmp_path / "state", "secret")
        assert _is_secret(command["inputs"]["connection"])
        assert _is_secret(command["outputs"]["connection"])
    finally:
        stack.destroy()


@pytest.fixture(name="pulumi_sshd")
def pulumi_sshd_fixture(sshd: Sshd) -> Sshd:
    """The test sshd (tests/integration/conftest.py), for programs the real engine runs."""
    require_tools("pulumi")
    return sshd


def _ssh_program(sshd: Sshd, create: str, delete: str | None = None) -> auto.PulumiFn:
    def program() -> None:
        command = remote.Command(
            "on-localhost",
            connection=remote.ConnectionArgs(
                host="127.0.0.1",
                port=sshd.port,
                user="root",
                private_key=pulumi.Output.secret(sshd.client_key.read_text()),
                host_key=sshd.public_host_key(),
            ),
            create=create,
            delete=delete,
        )
        pulumi.export("stdout", command.stdout)

    return program


def test_command_stand_in_runs_create_and_delete_over_ssh(
    tmp_path: Path, pulumi_sshd: Sshd
) -> None:
    sshd = pulumi_sshd
    marker = tmp_path / "marker"
    program = _ssh_program(sshd, f"echo created > {marker} && echo done", f"rm {marker}")
    stack = _stack("ssh", program, tmp_path / "state")

    result = stack.up()
    assert marker.read_text() == "created\n"
    assert result.outputs["stdout"].value == "done"
    stack.destroy()
    assert not marker.exists()


def test_command_stand_in_failing_command_fails_up_without_the_key(
    tmp_path: Path, pulumi_sshd: Sshd
) -> None:
    sshd = pulumi_sshd
    stack = _stack(
        "ssh-fails", _ssh_program(sshd, "echo no kubeadm here >&2; exit 3"), tmp_path / "state"
    )

    with pytest.raises(auto.CommandError) as failure:
        stack.up()
    message = str(failure.value)
    assert "process exited with status 3" in message
    assert "no kubeadm here" in message
    key_lines = sshd.client_key.read_text().splitlines()
    assert not [line for line in key_lines if line in message]
