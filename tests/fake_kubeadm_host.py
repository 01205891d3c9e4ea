"""A kubeadm host in a temporary directory, for running the host commands without a node.

`kubeadm`, `systemctl` and `curl` are recording stand-ins on PATH: a real kubeadm needs a
kubelet and a cluster for the phases these commands run. `kubeadm` prints the manifests in
`render/` the way kubeadm v1.37's `upgrade node phase control-plane --dry-run` does (the first
"[dryrun] Would write file" glued to the message before it, then the file's lines;
tests/integration/test_kubeadm_live.py runs the host check on the real binary's output), and
for the real phase writes those files where kubeadm would.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from pathlib import Path

COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")

_FAKE_KUBEADM = r"""#!/bin/sh
echo "kubeadm $*" >>"$CALLS"
case "$*" in
  *"phase control-plane --dry-run"*)
    echo '[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to version "v1.37.2"...'
    printf '[dryrun] Would upgrade your static Pod-hosted control plane to version "v1.37.2"'
    for c in kube-apiserver kube-controller-manager kube-scheduler; do
      printf '[dryrun] Would write file "/etc/kubernetes/manifests/%s.yaml" with content:\n' "$c"
      cat "$RENDER/$c.yaml"
    done ;;
  *"phase control-plane"*) cp "$RENDER"/*.yaml "$MANIFESTS/" ;;
  *"phase kubelet-config"*) echo "kind: KubeletConfiguration # from kubeadm" >"$KUBELET_CONFIG" ;;
  *) exit 2 ;;
esac
"""
_FAKE_SYSTEMCTL = '#!/bin/sh\necho "systemctl $*" >>"$CALLS"\n'
_FAKE_CURL = '#!/bin/sh\ncat "$HEALTH"\n'


def _manifest(component: str, *flags: str) -> str:
    command = "\n".join(f"    - {f}" for f in (component, "--v=2", *flags))
    return (
        "apiVersion: v1\nkind: Pod\nmetadata:\n"
        f"  name: {component}\n  namespace: kube-system\n"
        f"spec:\n  containers:\n  - command:\n{command}\n"
        f"    image: registry.k8s.io/{component}:v1.37.2\n    name: {component}\n"
        "  hostNetwork: true\n"
    )


class FakeHost:
    """A host's files under tmp_path and the stand-ins on PATH."""

    def __init__(self, tmp_path: Path) -> None:
        self.root = tmp_path
        self.manifests = tmp_path / "manifests"
        self.render = tmp_path / "render"
        self.state = tmp_path / "state"
        self.calls = tmp_path / "calls.log"
        self.health = tmp_path / "health"
        self.kubelet_config = tmp_path / "kubelet-config.yaml"
        for d in (self.manifests, self.render, tmp_path / "bin"):
            d.mkdir()
        for name, text in (
            ("kubeadm", _FAKE_KUBEADM),
            ("systemctl", _FAKE_SYSTEMCTL),
            ("curl", _FAKE_CURL),
        ):
            (tmp_path / "bin" / name).write_text(text)
            (tmp_path / "bin" / name).chmod(0o755)
        self.health.write_text("ok")
        self.kubelet_config.write_text("kind: KubeletConfiguration\n")
        self.calls.write_text("")
        plugins = "--enable-admission-plugins=NodeRestriction"
        self.set_manifests(self.manifests, {"kube-apiserver": (plugins,)})
        self.set_manifests(self.render, {"kube-apiserver": (plugins,)})

    @staticmethod
    def set_manifests(where: Path, flags: Mapping[str, tuple[str, ...]]) -> None:
        for component in COMPONENTS:
            (where / f"{component}.yaml").write_text(
                _manifest(component, *flags.get(component, ()))
            )

    def env(self) -> dict[str, str]:
        """What the stand-ins and the host script read, pointing into this directory."""
        return {
            "PATH": f"{self.root / 'bin'}:/usr/bin:/bin",
            "CALLS": str(self.calls),
            "RENDER": str(self.render),
            "HEALTH": str(self.health),
            "MANIFESTS": str(self.manifests),
            "KUBELET_CONFIG": str(self.kubelet_config),
        }

    def run(
        self, command: str, overrides: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The registered command as the host would run it (as root, so no sudo)."""
        argv = shlex.split(command.split("$S ", 1)[1])
        env = {**os.environ, **self.env(), **(overrides or {})}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    def kubeadm_calls(self) -> list[str]:
        return [c for c in self.calls.read_text().splitlines() if c.startswith("kubeadm")]
