"""A kubeadm host in a temporary directory, for running the host commands without a node.

`kubeadm`, `systemctl` and `curl` are recording stand-ins on PATH: a real kubeadm needs a
kubelet and a cluster for the phases these commands run (tests/integration/test_kubeadm_live.py
runs the real binary where it can).

- `kubeadm upgrade node phase control-plane --dry-run` prints the manifests in `render/` the way
  kubeadm v1.37 does (the first "[dryrun] Would write file" glued to the message before it,
  then the file's lines); without --dry-run it writes them where kubeadm would.
- `kubeadm upgrade node phase kubelet-config [--dry-run] [--patches DIR]` writes the kubelet
  config as kubeadm's WriteConfigToDisk does: the kubelet-config ConfigMap (`kubelet-base.yaml`
  here), then every `kubeletconfiguration*` patch of DIR in name order, then the kubelet's
  instance-config.yaml (created with the CRI socket when missing), keys sorted. With --dry-run
  into $KUBEADM_UPGRADE_DRYRUN_DIR, else into the kubelet config file. What it leaves out: the
  defaults kubeadm adds, strategic-merge directives and list merge keys (a patch's list
  replaces the list, a map merges key by key), and the JSON and merge patch types.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")

KUBELET_BASE = """\
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  x509:
    clientCAFile: /etc/kubernetes/pki/ca.crt
cgroupDriver: systemd
clusterDNS:
- 10.96.0.10
clusterDomain: cluster.local
kind: KubeletConfiguration
staticPodPath: /etc/kubernetes/manifests
"""
"""The kubelet-config ConfigMap's KubeletConfiguration, as kubeadm writes it."""

INSTANCE_CONFIG = 'containerRuntimeEndpoint: "unix:///run/containerd/containerd.sock"\n'
"""The instance-config.yaml kubeadm writes at join."""

_FAKE_KUBEADM = r"""
import os, shutil, sys
from pathlib import Path

import yaml

args = sys.argv[1:]
with open(os.environ["CALLS"], "a") as calls:
    calls.write(" ".join(["kubeadm", *args]) + "\n")
line = " ".join(args)
dry_run = "--dry-run" in args


def merge(target, patch):
    if not isinstance(target, dict) or not isinstance(patch, dict):
        return patch
    merged = dict(target)
    for key, value in patch.items():
        merged[key] = merge(merged.get(key), value)
    return merged


if "phase control-plane" in line and dry_run:
    render = Path(os.environ["RENDER"])
    print('[upgrade/control-plane] Upgrading your Static Pod-hosted control plane instance to version "v1.37.2"...')
    sys.stdout.write('[dryrun] Would upgrade your static Pod-hosted control plane to version "v1.37.2"')
    for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        sys.stdout.write(f'[dryrun] Would write file "/etc/kubernetes/manifests/{c}.yaml" with content:\n')
        sys.stdout.write((render / f"{c}.yaml").read_text())
elif "phase control-plane" in line:
    for manifest in Path(os.environ["RENDER"]).glob("*.yaml"):
        shutil.copy(manifest, Path(os.environ["MANIFESTS"]) / manifest.name)
elif "phase kubelet-config" in line:
    config = yaml.safe_load(Path(os.environ["KUBELET_BASE"]).read_text())
    if "--patches" in args:
        patches = Path(args[args.index("--patches") + 1])
        for patch in sorted(patches.glob("kubeletconfiguration*.yaml")):
            config = merge(config, yaml.safe_load(patch.read_text()))
    live = Path(os.environ["KUBELET_CONFIG"])
    out = Path(os.environ["KUBEADM_UPGRADE_DRYRUN_DIR"]) / "config.yaml" if dry_run else live
    instance = out.parent / "instance-config.yaml" if dry_run else live.parent / "instance-config.yaml"
    if not instance.exists():
        instance.write_text(DEFAULT_INSTANCE_CONFIG)
    config = merge(config, yaml.safe_load(instance.read_text()))
    out.write_text(yaml.safe_dump(config, sort_keys=True))
    print("[upgrade/kubelet-config] The kubelet configuration for this node was successfully upgraded!")
else:
    sys.exit(2)
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


def _merge(target: Any, patch: Any) -> Any:
    """A strategic merge patch without directives: maps merge key by key, the rest replaces."""
    if not isinstance(target, dict) or not isinstance(patch, dict):
        return patch
    return {**target, **{k: _merge(target.get(k), v) for k, v in patch.items()}}


def kubelet_config(*patches: Mapping[str, Any], instance: str = INSTANCE_CONFIG) -> str:
    """The kubelet config the fake kubeadm writes for these patches (the ConfigMap unchanged)."""
    config: Any = yaml.safe_load(KUBELET_BASE)
    for patch in (*patches, yaml.safe_load(instance)):
        config = _merge(config, patch)
    return yaml.safe_dump(config, sort_keys=True)


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
        """The kubelet's config file (/var/lib/kubelet/config.yaml)."""
        self.instance_config = tmp_path / "instance-config.yaml"
        """/var/lib/kubelet/instance-config.yaml, beside it."""
        self.kubelet_base = tmp_path / "kubelet-base.yaml"
        """The kubelet-config ConfigMap's KubeletConfiguration."""
        for d in (self.manifests, self.render, tmp_path / "bin"):
            d.mkdir()
        for name, text in (
            (
                "kubeadm",
                f"#!{sys.executable}\nDEFAULT_INSTANCE_CONFIG = {INSTANCE_CONFIG!r}\n{_FAKE_KUBEADM}",
            ),
            ("systemctl", _FAKE_SYSTEMCTL),
            ("curl", _FAKE_CURL),
        ):
            (tmp_path / "bin" / name).write_text(text)
            (tmp_path / "bin" / name).chmod(0o755)
        self.health.write_text("ok")
        self.kubelet_base.write_text(KUBELET_BASE)
        self.instance_config.write_text(INSTANCE_CONFIG)
        # As `kubeadm join` left it: the ConfigMap with the instance config over it.
        self.kubelet_config.write_text(kubelet_config())
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

    def add_kubelet_patch(self, stack: str, gates: Mapping[str, bool]) -> None:
        """Another stack's kubelet patch on this host, as its kubelet command writes it."""
        patches = self.state / stack / "patches"
        patches.mkdir(parents=True)
        lines = "".join(f"  {g}: {str(v).lower()}\n" for g, v in gates.items())
        (patches / "kubeletconfiguration+strategic.yaml").write_text(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
            f"featureGates:\n{lines}"
        )

    def kubelet_settings(self) -> dict[str, Any]:
        """The kubelet's config file, parsed."""
        return dict(yaml.safe_load(self.kubelet_config.read_text()))

    def env(self) -> dict[str, str]:
        """What the stand-ins and the host script read, pointing into this directory."""
        return {
            "PATH": f"{self.root / 'bin'}:/usr/bin:/bin",
            "CALLS": str(self.calls),
            "RENDER": str(self.render),
            "HEALTH": str(self.health),
            "MANIFESTS": str(self.manifests),
            "KUBELET_CONFIG": str(self.kubelet_config),
            "KUBELET_BASE": str(self.kubelet_base),
        }

    def run(
        self, command: str, overrides: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The registered command as the host would run it (as root, so no sudo)."""
        argv = shlex.split(command.split("$S ", 1)[1])
        env = {**os.environ, **self.env(), **(overrides or {})}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    def kubeadm_calls(self) -> list[str]:
        """kubeadm's command lines, a kubelet run's work directory named `.kubelet.XXXXXX`."""
        return [
            re.sub(r"/\.kubelet\.[^/]+/", "/.kubelet.XXXXXX/", c)
            for c in self.calls.read_text().splitlines()
            if c.startswith("kubeadm")
        ]
