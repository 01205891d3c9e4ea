"""Credentials of the dynamic providers: which kubeconfig a run uses, as kubectl would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from components.kubeconfig import KubeconfigNotFound, kubeconfig_content, kubernetes_access
from tests.fake_node_api import stack_config_request


def _kubeconfig(path: Path, name: str, server: str, current: str | None = None) -> Path:
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": f"token-{name}"}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        **({"current-context": current} if current else {}),
    }
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home whose ~/.kube/config names another cluster, the one a fallback would reach."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    (tmp_path / ".kube").mkdir()
    _kubeconfig(tmp_path / ".kube" / "config", "laptop", "https://laptop:6443", "laptop")
    return tmp_path


def test_a_configured_path_that_does_not_exist_is_an_error_not_the_default_cluster(
    home: Path,
) -> None:
    missing = str(home / "prod-admin.conf")
    with pytest.raises(KubeconfigNotFound) as excinfo:
        kubeconfig_content(missing)
    message = str(excinfo.value)
    assert message.startswith("gpu-cluster:kubeconfig: the configured kubeconfig file does not")
    assert missing not in message  # the path may be stored as a secret
    # The providers stop at configure, before any call reaches a cluster.
    with pytest.raises(KubeconfigNotFound):
        kubernetes_access(stack_config_request(missing).config)


def test_an_empty_key_uses_the_kubeconfig_env_merged_the_way_kubectl_merges_it(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _kubeconfig(home / "a.conf", "dev", "https://dev:6443")
    second = _kubeconfig(home / "b.conf", "prod", "https://prod:6443", current="prod")
    shadow = home / "c.conf"
    shadow.write_text(
        yaml.safe_dump(
            {
                "clusters": [{"name": "dev", "cluster": {"server": "https://elsewhere:6443"}}],
                "current-context": "dev",
            }
        )
    )
    monkeypatch.setenv("KUBECONFIG", f"{first}:{home / 'missing.conf'}:{second}:{shadow}")
    merged = yaml.safe_load(kubeconfig_content(""))
    # The first file naming an entry wins; the first current-context wins; missing files are
    # skipped; ~/.kube/config is not read while $KUBECONFIG is set.
    assert {c["name"]: c["cluster"]["server"] for c in merged["clusters"]} == {
        "dev": "https://dev:6443",
        "prod": "https://prod:6443",
    }
    assert [c["name"] for c in merged["contexts"]] == ["dev", "prod"]
    assert merged["current-context"] == "prod"


def test_an_empty_key_without_kubeconfig_env_reads_the_home_kubeconfig(home: Path) -> None:
    content = yaml.safe_load(kubeconfig_content(""))
    assert content["current-context"] == "laptop"


def test_an_empty_key_with_no_kubeconfig_anywhere_gives_empty_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none.conf"))
    assert kubeconfig_content("") == ""


def test_relative_certificate_paths_are_resolved_against_their_own_file(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (home / "certs").mkdir()
    (home / "certs" / "ca.crt").write_bytes(b"CA-ONE")
    one = home / "certs" / "one.conf"
    one.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "one",
                        "cluster": {"server": "https://one", "certificate-authority": "ca.crt"},
                    }
                ]
            }
        )
    )
    two = _kubeconfig(home / "two.conf", "two", "https://two:6443", current="two")
    monkeypatch.setenv("KUBECONFIG", f"{one}:{two}")
    merged = yaml.safe_load(kubeconfig_content(""))
    one_cluster = next(c["cluster"] for c in merged["clusters"] if c["name"] == "one")
    assert one_cluster["certificate-authority-data"] == "Q0EtT05F"  # base64 of CA-ONE


def test_a_refused_token_says_how_to_run_with_the_current_credentials() -> None:
    from components.providers.node_api import api_error

    message = str(api_error(401, "Unauthorized", "node 'gpu-1'", "read", "https://10.0.0.1:6443"))
    assert "pulumi destroy --run-program" in message
    # A 403 is a permission the credentials lack, not stale credentials.
    forbidden = str(api_error(403, "Forbidden", "node 'gpu-1'", "patch", "https://10.0.0.1:6443"))
    assert "--run-program" not in forbidden
