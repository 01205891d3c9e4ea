"""Stand-in for the tls provider: keys and certificates generated locally with `cryptography`.

Outputs carry the provider's property names (privateKeyPem, certPem, certRequestPem, ...), so
the program reads them exactly as it reads the real provider's.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .engine import Resource, reveal
from .recorded import changed_inputs

_CURVES: dict[str, Any] = {
    "P224": ec.SECP224R1,
    "P256": ec.SECP256R1,
    "P384": ec.SECP384R1,
    "P521": ec.SECP521R1,
}
# The provider's allowed_uses names -> cryptography's KeyUsage fields.
_KEY_USAGES = {
    "digital_signature": "digital_signature",
    "content_commitment": "content_commitment",
    "key_encipherment": "key_encipherment",
    "data_encipherment": "data_encipherment",
    "key_agreement": "key_agreement",
    "cert_signing": "key_cert_sign",
    "crl_signing": "crl_sign",
    "encipher_only": "encipher_only",
    "decipher_only": "decipher_only",
}
_EXTENDED_USAGES = {
    "server_auth": ExtendedKeyUsageOID.SERVER_AUTH,
    "client_auth": ExtendedKeyUsageOID.CLIENT_AUTH,
    "code_signing": ExtendedKeyUsageOID.CODE_SIGNING,
}


def _private_key(inputs: Mapping[str, Any]) -> Any:
    algorithm = inputs.get("algorithm", "RSA")
    if algorithm == "ECDSA":
        return ec.generate_private_key(_CURVES[inputs.get("ecdsaCurve") or "P224"]())
    if algorithm == "ED25519":
        return ed25519.Ed25519PrivateKey.generate()
    return rsa.generate_private_key(65537, int(inputs.get("rsaBits") or 2048))


def _load_key(pem: str) -> Any:
    return serialization.load_pem_private_key(pem.encode(), password=None)


def _subject(inputs: Mapping[str, Any]) -> x509.Name:
    subject = inputs.get("subject") or {}
    attrs = []
    if subject.get("organization"):
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, subject["organization"]))
    if subject.get("commonName"):
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, subject["commonName"]))
    return x509.Name(attrs)


def _signing_hash(key: Any) -> Any:
    return None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()


def _usages(builder: x509.CertificateBuilder, uses: Sequence[str]) -> x509.CertificateBuilder:
    flags = {field: name in uses for name, field in _KEY_USAGES.items()}
    if any(flags.values()):
        builder = builder.add_extension(x509.KeyUsage(**flags), critical=True)
    extended = [_EXTENDED_USAGES[u] for u in uses if u in _EXTENDED_USAGES]
    if extended:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended), critical=False)
    return builder


def _certificate(
    inputs: Mapping[str, Any],
    subject: x509.Name,
    public_key: Any,
    issuer: x509.Name,
    signing_key: Any,
    dns_names: Sequence[str],
) -> dict[str, Any]:
    now = datetime.datetime.now(datetime.UTC)
    end = now + datetime.timedelta(hours=int(inputs["validityPeriodHours"]))
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(end)
    )
    is_ca = bool(inputs.get("isCaCertificate"))
    builder = builder.add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), True)
    if dns_names:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.DNSName(n) for n in dns_names]), critical=False
        )
    builder = _usages(builder, inputs.get("allowedUses") or [])
    cert = builder.sign(signing_key, _signing_hash(signing_key))
    renew = datetime.timedelta(hours=int(inputs.get("earlyRenewalHours") or 0))
    return {
        **inputs,
        "certPem": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "validityStartTime": now.isoformat(),
        "validityEndTime": end.isoformat(),
        "readyForRenewal": now >= end - renew,
    }


def _pem(key: Any) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


class TlsProvider:
    """PrivateKey, SelfSignedCert, CertRequest and LocallySignedCert."""

    def create(self, res: Resource) -> tuple[str, dict[str, Any]]:
        inputs = reveal(res.inputs)
        kind = res.typ.rpartition(":")[2]
        if kind == "PrivateKey":
            key = _private_key(inputs)
            public = key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            outputs = {
                **inputs,
                # A secret output, as the provider declares it.
                "privateKeyPem": pulumi.Output.secret(_pem(key)),
                "publicKeyPem": public.decode(),
            }
        elif kind == "SelfSignedCert":
            key = _load_key(inputs["privateKeyPem"])
            subject = _subject(inputs)
            outputs = _certificate(
                inputs, subject, key.public_key(), subject, key, inputs.get("dnsNames") or []
            )
        elif kind == "CertRequest":
            key = _load_key(inputs["privateKeyPem"])
            builder = x509.CertificateSigningRequestBuilder().subject_name(_subject(inputs))
            names = inputs.get("dnsNames") or []
            if names:
                builder = builder.add_extension(
                    x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False
                )
            csr = builder.sign(key, _signing_hash(key))
            outputs = {
                **inputs,
                "certRequestPem": csr.public_bytes(serialization.Encoding.PEM).decode(),
            }
        elif kind == "LocallySignedCert":
            csr = x509.load_pem_x509_csr(inputs["certRequestPem"].encode())
            ca = x509.load_pem_x509_certificate(inputs["caCertPem"].encode())
            names = []
            try:
                san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName)
                names = san.value.get_values_for_type(x509.DNSName)
            except x509.ExtensionNotFound:
                pass
            outputs = _certificate(
                inputs,
                csr.subject,
                csr.public_key(),
                ca.subject,
                _load_key(inputs["caPrivateKeyPem"]),
                names,
            )
        else:
            raise NotImplementedError(f"{res.typ} is not provided by this harness")
        return uuid.uuid4().hex, outputs

    def diff(self, old: Resource, new: Resource) -> list[str]:
        return changed_inputs(old, new)

    def update(self, old: Resource, new: Resource) -> dict[str, Any]:
        # Every tls input forces a replacement; the engine would create anew.
        return self.create(new)[1]

    def delete(self, res: Resource) -> None:
        """Keys and certificates live only in state."""
