"""The gpu-binpack-scheduler image `make scheduler-image` builds (tools/build-scheduler-image.sh).

The OCI archive is built by the real ko from scheduler/ (or reused: the script's stamp), then
read here as a registry would get it: the manifest and config the stack's Deployment relies on
(user 65532, the binary on PATH as kube-scheduler), the base layer's files, and the binary
itself, run from the extracted layer, reporting the Kubernetes version scheduler/go.mod pins.
A second build into another folder must give the same digest. Without Go the tests skip; under
CI=true they fail.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tools" / "build-scheduler-image.sh"
IMAGES_DIR_ENV = "GPU_CLUSTER_IMAGES_DIR"
BINARY = "ko-app/kube-scheduler"
BASE_NAME = "org.opencontainers.image.base.name"
GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def _kubernetes_version() -> str:
    match = re.search(
        r"^\s*k8s\.io/kubernetes (v\S+)", (ROOT / "scheduler" / "go.mod").read_text(), re.M
    )
    assert match, "scheduler/go.mod requires no k8s.io/kubernetes"
    return match.group(1)


def _build(images_dir: Path | None = None) -> tuple[Path, str]:
    """Build (or reuse) the archive; skip without Go, fail instead under CI=true."""
    if shutil.which("go") is None:
        reason = "go not found: building the scheduler image needs Go (make scheduler-image)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)
    env = dict(os.environ)
    if images_dir is not None:
        env[IMAGES_DIR_ENV] = str(images_dir)
    images = images_dir or Path(env.get(IMAGES_DIR_ENV) or ROOT / ".tools" / "images")
    result = subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert result.returncode == 0, result.stdout + result.stderr
    stem = f"gpu-binpack-scheduler-{_kubernetes_version()}"
    digest = (images / f"{stem}.digest").read_text().strip()
    assert f"digest {digest}" in result.stdout
    return images / f"{stem}.tar", digest


class Archive:
    """An OCI archive's blobs, each checked against its digest when read."""

    def __init__(self, path: Path) -> None:
        with tarfile.open(path) as tar:
            self.files = {
                m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers()
                if m.isfile()
            }

    def json(self, name: str) -> Any:
        return json.loads(self.files[name])

    def blob(self, digest: str) -> bytes:
        data = self.files[f"blobs/{digest.replace(':', '/')}"]
        assert f"sha256:{hashlib.sha256(data).hexdigest()}" == digest
        return data


@pytest.fixture(scope="module")
def built() -> tuple[Path, str]:
    return _build()


@pytest.fixture(scope="module")
def image(built: tuple[Path, str]) -> dict[str, Any]:
    archive = Archive(built[0])
    (top,) = archive.json("index.json")["manifests"]
    manifest = json.loads(archive.blob(top["digest"]))
    return {
        "archive": archive,
        "top": top,
        "manifest": manifest,
        "config": json.loads(archive.blob(manifest["config"]["digest"])),
        "layers": [archive.blob(layer["digest"]) for layer in manifest["layers"]],
    }


def _layer_files(layer: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer))) as tar:
        return {m.name.lstrip("/").rstrip("/"): m for m in tar.getmembers()}


def test_scheduler_image_is_one_oci_image_named_by_its_kubernetes_version(
    built: tuple[Path, str], image: dict[str, Any]
) -> None:
    archive: Archive = image["archive"]
    assert archive.json("oci-layout") == {"imageLayoutVersion": "1.0.0"}
    assert image["top"]["digest"] == built[1]
    assert image["top"]["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert image["top"]["annotations"] == {
        "org.opencontainers.image.ref.name": _kubernetes_version()
    }
    # The throwaway registry that served the base image is not part of the image.
    assert BASE_NAME not in image["manifest"].get("annotations", {})


def test_scheduler_image_runs_kube_scheduler_from_path_as_user_65532(
    image: dict[str, Any],
) -> None:
    config = image["config"]
    assert config["os"] == "linux"
    assert config["config"]["User"] == "65532"
    assert config["config"]["Entrypoint"] == [f"/{BINARY}"]
    (path,) = [e for e in config["config"]["Env"] if e.startswith("PATH=")]
    assert "/ko-app" in path.removeprefix("PATH=").split(":")
    assert config["created"] == "1970-01-01T00:00:00Z"


def test_scheduler_image_base_layer_holds_only_the_nonroot_user(image: dict[str, Any]) -> None:
    base, *_, app = image["layers"]
    files = _layer_files(base)
    assert set(files) == {"etc", "etc/passwd", "etc/group", "home", "home/nonroot", "tmp"}
    assert (files["home/nonroot"].uid, files["home/nonroot"].mode) == (65532, 0o700)
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(base))) as tar:
        passwd = tar.extractfile("etc/passwd").read().decode()  # type: ignore[union-attr]
    assert "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin" in passwd.splitlines()
    assert all(m.mtime == 0 for m in files.values())
    assert BINARY in _layer_files(app)


def test_scheduler_image_binary_reports_the_pinned_kubernetes_version(
    image: dict[str, Any], tmp_path: Path
) -> None:
    if GOARCH.get(platform.machine()) != image["config"]["architecture"]:
        pytest.skip(
            f"a {image['config']['architecture']} image does not run on {platform.machine()}"
        )
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(image["layers"][-1]))) as tar:
        member = tar.getmember(f"/{BINARY}")
        binary = tmp_path / "kube-scheduler"
        binary.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    binary.chmod(0o755)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == f"Kubernetes {_kubernetes_version()}"


def test_scheduler_image_second_build_gives_the_same_digest(
    built: tuple[Path, str], tmp_path: Path
) -> None:
    again, digest = _build(tmp_path / "images")
    assert digest == built[1]
    assert again.read_bytes() == built[0].read_bytes()
