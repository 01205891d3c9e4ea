"""Stand-in for pulumi-resource-tls (SDK pulumi_tls): keys and certificates made with `cryptography`.

Resources: PrivateKey, SelfSignedCert, CertRequest and LocallySignedCert, with the real
provider's input and output property names, its input defaults, and its lifecycle: every input
change replaces the resource, and so does a certificate within `earlyRenewalHours` of its end
(`readyForRenewal`). The private key outputs, and the key inputs, are secrets. Keys and
certificates live only in the state: delete does nothing.

What it does NOT do, unlike the real provider:
- no Read: a refresh keeps the state as it is (`readyForRenewal` is recomputed on the next
  diff, not by refresh), and `pulumi import` of a key or certificate is not possible;
- no functions (getPublicKey, getCertificate) and no provider configuration (`proxy`);
- inputs beyond those listed in `_KINDS` (setSubjectKeyId, setAuthorityKeyId, maxPathLength)
  are refused by check instead of being honoured;
- no check that a CSR's signature is valid or that the CA key belongs to the CA certificate;
- certificates carry no subject or authority key identifier; ECDSA P-224 keys have empty
  OpenSSH outputs, as with the real provider, but this is the only OpenSSH limit applied;
- KeyUsage refuses encipher_only/decipher_only without key_agreement (`cryptography` does).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import NameOID, ObjectIdentifier
from pulumi.provider.experimental.provider import (
    CheckFailure,
    CheckRequest,
    CheckResponse,
    CreateRequest,
    CreateResponse,
    DeleteRequest,
    DiffRequest,
    DiffResponse,
    PropertyDiffKind,
    Provider,
)

from tools.plugins import UNKNOWN, changed_inputs, diff_response, plain, serve, unknown, wrap

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey
Outputs = dict[str, Any]

_CURVES: dict[str, type[ec.EllipticCurve]] = {
    "P224": ec.SECP224R1,
    "P256": ec.SECP256R1,
    "P384": ec.SECP384R1,
    "P521": ec.SECP521R1,
}
_ALGORITHMS = ("RSA", "ECDSA", "ED25519")
# allowedUses -> cryptography's KeyUsage fields.
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
# allowedUses -> extended key usage OIDs.
_EXTENDED_USAGES = {
    "any_extended": "2.5.29.37.0",
    "server_auth": "1.3.6.1.5.5.7.3.1",
    "client_auth": "1.3.6.1.5.5.7.3.2",
    "code_signing": "1.3.6.1.5.5.7.3.3",
    "email_protection": "1.3.6.1.5.5.7.3.4",
    "ipsec_end_system": "1.3.6.1.5.5.7.3.5",
    "ipsec_tunnel": "1.3.6.1.5.5.7.3.6",
    "ipsec_user": "1.3.6.1.5.5.7.3.7",
    "timestamping": "1.3.6.1.5.5.7.3.8",
    "ocsp_signing": "1.3.6.1.5.5.7.3.9",
    "microsoft_server_gated_crypto": "1.3.6.1.4.1.311.10.3.3",
    "netscape_server_gated_crypto": "2.16.840.1.113730.4.1",
    "microsoft_commercial_code_signing": "1.3.6.1.4.1.311.2.1.22",
    "microsoft_kernel_code_signing": "1.3.6.1.4.1.311.61.1.1",
}
# subject fields in the order Go's crypto/x509 (the real provider) writes them.
_SUBJECT = {
    "country": NameOID.COUNTRY_NAME,
    "province": NameOID.STATE_OR_PROVINCE_NAME,
    "locality": NameOID.LOCALITY_NAME,
    "streetAddresses": NameOID.STREET_ADDRESS,
    "postalCode": NameOID.POSTAL_CODE,
    "organization": NameOID.ORGANIZATION_NAME,
    "organizationalUnit": NameOID.ORGANIZATIONAL_UNIT_NAME,
    "commonName": NameOID.COMMON_NAME,
    "serialNumber": NameOID.SERIAL_NUMBER,
}
_SECRETS = frozenset(
    {"privateKeyPem", "privateKeyPemPkcs8", "privateKeyOpenssh", "caPrivateKeyPem"}
)
_CERT_OUTPUTS = ("certPem", "validityStartTime", "validityEndTime", "readyForRenewal")


@dataclass(frozen=True)
class _Kind:
    """One resource type: its inputs (required, defaulted, optional) and its outputs."""

    make: Callable[[Mapping[str, Any]], tuple[str, Outputs]]
    required: tuple[str, ...]
    outputs: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    optional: tuple[str, ...] = ()

    @property
    def inputs(self) -> frozenset[str]:
        return frozenset((*self.required, *self.defaults, *self.optional))


def _load_key(pem: str) -> SigningKey:
    key = serialization.load_pem_private_key(pem.encode(), password=None)
    if not isinstance(key, SigningKey):
        raise ValueError(f"unsupported private key type {type(key).__name__}")
    return key


def _algorithm(key: SigningKey) -> str:
    if isinstance(key, rsa.RSAPrivateKey):
        return "RSA"
    return "ECDSA" if isinstance(key, ec.EllipticCurvePrivateKey) else "ED25519"


def _signing_hash(key: SigningKey) -> hashes.SHA256 | hashes.SHA384 | hashes.SHA512 | None:
    """The digest Go's crypto/x509 picks for the key."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return None
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        return hashes.SHA512() if key.curve.key_size > 384 else hashes.SHA384()
    return hashes.SHA256()


def _rfc3339(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _ready_for_renewal(end: datetime.datetime, early_renewal_hours: float) -> bool:
    now = datetime.datetime.now(datetime.UTC)
    return now >= end - datetime.timedelta(hours=early_renewal_hours)


def _openssh(key: SigningKey) -> Outputs:
    """The OpenSSH forms of the key and its public key's fingerprints (empty for P-224)."""
    names = ("privateKeyOpenssh", "publicKeyOpenssh")
    fingerprints = ("publicKeyFingerprintMd5", "publicKeyFingerprintSha256")
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp224r1":
        return dict.fromkeys((*names, *fingerprints), "")
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    blob = base64.b64decode(public.split()[1])
    md5 = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    sha256 = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return {
        "privateKeyOpenssh": private,
        "publicKeyOpenssh": public.decode() + "\n",
        "publicKeyFingerprintMd5": ":".join(md5[i : i + 2] for i in range(0, len(md5), 2)),
        "publicKeyFingerprintSha256": f"SHA256:{sha256}",
    }


def _private_key(inputs: Mapping[str, Any]) -> tuple[str, Outputs]:
    key: SigningKey
    if inputs["algorithm"] == "ECDSA":
        key = ec.generate_private_key(_CURVES[inputs["ecdsaCurve"]]())
    elif inputs["algorithm"] == "ED25519":
        key = ed25519.Ed25519PrivateKey.generate()
    else:
        key = rsa.generate_private_key(65537, int(inputs["rsaBits"]))

    def pem(form: serialization.PrivateFormat) -> str:
        return key.private_bytes(
            serialization.Encoding.PEM, form, serialization.NoEncryption()
        ).decode()

    pkcs8 = pem(serialization.PrivateFormat.PKCS8)
    # privateKeyPem is PKCS#1 for RSA, SEC 1 for ECDSA, PKCS#8 for ED25519, as the real one.
    traditional = (
        pkcs8
        if isinstance(key, ed25519.Ed25519PrivateKey)
        else pem(serialization.PrivateFormat.TraditionalOpenSSL)
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    outputs = {
        "privateKeyPem": traditional,
        "privateKeyPemPkcs8": pkcs8,
        "publicKeyPem": public.decode(),
        **_openssh(key),
    }
    return hashlib.sha1(public, usedforsecurity=False).hexdigest(), outputs


def _name(subject: Mapping[str, Any] | None) -> x509.Name:
    attributes = []
    for key, oid in _SUBJECT.items():
        value = (subject or {}).get(key)
        for item in [value] if isinstance(value, str) else value or []:
            attributes.append(x509.NameAttribute(oid, item))
    return x509.Name(attributes)


def _alt_names(inputs: Mapping[str, Any]) -> x509.SubjectAlternativeName | None:
    names: list[x509.GeneralName] = [
        *(x509.DNSName(n) for n in inputs.get("dnsNames") or []),
        *(x509.IPAddress(ipaddress.ip_address(a)) for a in inputs.get("ipAddresses") or []),
        *(x509.UniformResourceIdentifier(u) for u in inputs.get("uris") or []),
    ]
    return x509.SubjectAlternativeName(names) if names else None


def _certificate(
    inputs: Mapping[str, Any],
    subject: x509.Name,
    public_key: Any,
    issuer: x509.Name,
    signing_key: SigningKey,
    alt_names: x509.SubjectAlternativeName | None,
) -> tuple[str, Outputs]:
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    end = now + datetime.timedelta(hours=inputs["validityPeriodHours"])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=inputs["isCaCertificate"], path_length=None), True)
    )
    if alt_names is not None:
        builder = builder.add_extension(alt_names, critical=False)
    uses = inputs["allowedUses"]
    flags = {flag: use in uses for use, flag in _KEY_USAGES.items()}
    if any(flags.values()):
        builder = builder.add_extension(x509.KeyUsage(**flags), critical=True)
    extended = [ObjectIdentifier(oid) for use, oid in _EXTENDED_USAGES.items() if use in uses]
    if extended:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended), critical=False)
    cert = builder.sign(signing_key, _signing_hash(signing_key))
    return str(cert.serial_number), {
        "certPem": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "validityStartTime": _rfc3339(now),
        "validityEndTime": _rfc3339(end),
        "readyForRenewal": _ready_for_renewal(end, inputs["earlyRenewalHours"]),
    }


def _self_signed_cert(inputs: Mapping[str, Any]) -> tuple[str, Outputs]:
    key = _load_key(inputs["privateKeyPem"])
    subject = _name(inputs.get("subject"))
    cert_id, outputs = _certificate(
        inputs, subject, key.public_key(), subject, key, _alt_names(inputs)
    )
    return cert_id, {**outputs, "keyAlgorithm": _algorithm(key)}


def _cert_request(inputs: Mapping[str, Any]) -> tuple[str, Outputs]:
    key = _load_key(inputs["privateKeyPem"])
    builder = x509.CertificateSigningRequestBuilder().subject_name(_name(inputs.get("subject")))
    alt_names = _alt_names(inputs)
    if alt_names is not None:
        builder = builder.add_extension(alt_names, critical=False)
    pem = builder.sign(key, _signing_hash(key)).public_bytes(serialization.Encoding.PEM)
    outputs = {"certRequestPem": pem.decode(), "keyAlgorithm": _algorithm(key)}
    return hashlib.sha1(pem, usedforsecurity=False).hexdigest(), outputs


def _locally_signed_cert(inputs: Mapping[str, Any]) -> tuple[str, Outputs]:
    """Subject and alternative names come from the request, as with the real provider."""
    request = x509.load_pem_x509_csr(inputs["certRequestPem"].encode())
    ca = x509.load_pem_x509_certificate(inputs["caCertPem"].encode())
    ca_key = _load_key(inputs["caPrivateKeyPem"])
    try:
        alt_names = request.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        alt_names = None
    cert_id, outputs = _certificate(
        inputs, request.subject, request.public_key(), ca.subject, ca_key, alt_names
    )
    return cert_id, {**outputs, "caKeyAlgorithm": _algorithm(ca_key)}


_CERT_DEFAULTS = {"isCaCertificate": False, "earlyRenewalHours": 0}
_NAMES = ("subject", "dnsNames", "ipAddresses", "uris")
_KINDS = {
    "tls:index/privateKey:PrivateKey": _Kind(
        _private_key,
        required=("algorithm",),
        defaults={"ecdsaCurve": "P224", "rsaBits": 2048},
        outputs=(
            "privateKeyPem",
            "privateKeyPemPkcs8",
            "privateKeyOpenssh",
            "publicKeyPem",
            "publicKeyOpenssh",
            "publicKeyFingerprintMd5",
            "publicKeyFingerprintSha256",
        ),
    ),
    "tls:index/selfSignedCert:SelfSignedCert": _Kind(
        _self_signed_cert,
        required=("privateKeyPem", "validityPeriodHours", "allowedUses"),
        defaults=_CERT_DEFAULTS,
        optional=_NAMES,
        outputs=(*_CERT_OUTPUTS, "keyAlgorithm"),
    ),
    "tls:index/certRequest:CertRequest": _Kind(
        _cert_request,
        required=("privateKeyPem",),
        optional=_NAMES,
        outputs=("certRequestPem", "keyAlgorithm"),
    ),
    "tls:index/locallySignedCert:LocallySignedCert": _Kind(
        _locally_signed_cert,
        required=(
            "certRequestPem",
            "caPrivateKeyPem",
            "caCertPem",
            "validityPeriodHours",
            "allowedUses",
        ),
        defaults=_CERT_DEFAULTS,
        outputs=(*_CERT_OUTPUTS, "caKeyAlgorithm"),
    ),
}
_CHOICES = {
    "algorithm": _ALGORITHMS,
    "ecdsaCurve": tuple(_CURVES),
    "allowedUses": (*_KEY_USAGES, *_EXTENDED_USAGES),
}


def _token(urn_type: str) -> str:
    """`tls:index/privateKey:PrivateKey` of a URN type that may name its parents first."""
    return urn_type.rpartition("$")[2]


def _invalid_choices(inputs: Mapping[str, Any]) -> list[CheckFailure]:
    failures = []
    for key, allowed in _CHOICES.items():
        value = inputs.get(key)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if item not in (None, UNKNOWN) and item not in allowed:
                reason = f"{key}: {item!r} is not one of {', '.join(allowed)}"
                failures.append(CheckFailure(key, reason))
    return failures


def _due_for_renewal(state: Mapping[str, Any]) -> bool:
    end = state.get("validityEndTime")
    if not isinstance(end, str):
        return False
    moment = datetime.datetime.fromisoformat(end)
    return _ready_for_renewal(moment, state.get("earlyRenewalHours") or 0)


class TlsProvider(Provider):
    """The four tls resources; every change replaces."""

    async def check(self, request: CheckRequest) -> CheckResponse:
        token = _token(request.type)
        kind = _KINDS.get(token)
        if kind is None:
            return CheckResponse(failures=[CheckFailure("", f"{token} is not provided here")])
        news = {k: v for k, v in request.new_inputs.items() if v.value is not None}
        values = {k: plain(v) for k, v in news.items()}
        failures = [CheckFailure(k, f"{k} is required") for k in kind.required if k not in news]
        failures += [
            CheckFailure(k, f"{k} is not supported by this stand-in of the tls provider")
            for k, v in values.items()
            if k not in kind.inputs and v not in (False, [], {})
        ]
        failures += _invalid_choices(values)
        inputs = {**{k: wrap(v) for k, v in kind.defaults.items()}, **news}
        return CheckResponse(inputs=inputs, failures=failures)

    async def diff(self, request: DiffRequest) -> DiffResponse:
        kind = _KINDS[_token(request.type)]
        changes = changed_inputs(request.old_state, request.new_inputs, kind.outputs)
        if _due_for_renewal({k: plain(v) for k, v in request.old_state.items()}):
            changes["readyForRenewal"] = PropertyDiffKind.UPDATE
        return diff_response(changes, replaces=changes)

    async def create(self, request: CreateRequest) -> CreateResponse:
        kind = _KINDS[_token(request.type)]
        if request.preview:
            resource_id, outputs = "", {k: unknown() for k in kind.outputs}
        else:
            inputs = {k: plain(v) for k, v in request.properties.items()}
            resource_id, made = kind.make(inputs)
            outputs = {k: wrap(v) for k, v in made.items()}
        properties = {**request.properties, **outputs}
        return CreateResponse(
            resource_id=resource_id,
            properties={k: wrap(v, secret=k in _SECRETS) for k, v in properties.items()},
        )

    async def delete(self, request: DeleteRequest) -> None:
        """Keys and certificates exist only in the state."""


if __name__ == "__main__":
    serve(TlsProvider(), "pulumi-tls")
