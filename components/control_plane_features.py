"""ControlPlaneFeatures: admission plugins and feature gates on kubeadm hosts, over SSH.

Each host gets the stdlib-only editor (components/hostscripts/kube_flags_edit.py) and one
remote command that runs it under a guard: snapshot the file and the editor's state, edit, let
the component restart (kubelet restarts the kube-apiserver static pod by itself; the kubelet
service is restarted here), wait until it is healthy, and put the snapshot back and fail if it
is not. The commands form one chain, so exactly one host is being edited at any moment:
control-plane hosts first, then the kubeadm-config ConfigMap, then kubelet hosts, then the
kubelet-config ConfigMap. `pulumi destroy` walks the chain backwards and takes out exactly what
the editor recorded.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi_command import remote

from components.hostscripts.kube_flags_edit import build_argv, filter_gates

TOKEN = "gpu-cluster:index:ControlPlaneFeatures"

SCRIPT = Path(__file__).resolve().parent / "hostscripts" / "kube_flags_edit.py"
"""The editor shipped to every host (stdlib only: hosts may lack PyYAML)."""

HOST_DIR = "/var/lib/gpu-cluster"
HOST_SCRIPT = f"{HOST_DIR}/bin/kube_flags_edit.py"
STATE_DIR = f"{HOST_DIR}/state"
BACKUP_DIR = f"{HOST_DIR}/backups"
WORK_DIR = f"{HOST_DIR}/work"
APISERVER_MANIFEST = "/etc/kubernetes/manifests/kube-apiserver.yaml"
KUBELET_CONFIG = "/var/lib/kubelet/config.yaml"
ADMIN_KUBECONFIG = "/etc/kubernetes/admin.conf"
KUBELET_KUBECONFIG = "/etc/kubernetes/kubelet.conf"

# `kube-apiserver --help` of v1.34.4 (the harness build): every plugin --enable-admission-plugins
# accepts. An unknown name stops the API server, so the config loader rejects it up front.
ADMISSION_PLUGINS: tuple[str, ...] = (
    "AlwaysAdmit",
    "AlwaysDeny",
    "AlwaysPullImages",
    "CertificateApproval",
    "CertificateSigning",
    "CertificateSubjectRestriction",
    "ClusterTrustBundleAttest",
    "DefaultIngressClass",
    "DefaultStorageClass",
    "DefaultTolerationSeconds",
    "DenyServiceExternalIPs",
    "EventRateLimit",
    "ExtendedResourceToleration",
    "ImagePolicyWebhook",
    "LimitPodHardAntiAffinityTopology",
    "LimitRanger",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "NamespaceAutoProvision",
    "NamespaceExists",
    "NamespaceLifecycle",
    "NodeRestriction",
    "OwnerReferencesPermissionEnforcement",
    "PersistentVolumeClaimResize",
    "PodNodeSelector",
    "PodSecurity",
    "PodTolerationRestriction",
    "PodTopologyLabels",
    "Priority",
    "ResourceQuota",
    "RuntimeClass",
    "ServiceAccount",
    "StorageObjectInUseProtection",
    "TaintNodesByCondition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
)


@dataclass(frozen=True, kw_only=True)
class RemoteHost:
    """A host reached over SSH; `name` is its Kubernetes Node name."""

    name: str
    """Node name (kubelet hosts are waited for by this name)."""
    address: str
    """Address SSH connects to."""


@dataclass(frozen=True, kw_only=True)
class SshAccess:
    """How to log in to the hosts. The user must be root or have passwordless sudo."""

    user: str
    """SSH user."""
    port: int = 22
    """SSH port."""
    private_key: pulumi.Output[str] | None = None
    """The private key, a Pulumi secret; None uses the SSH agent ($SSH_AUTH_SOCK)."""


@dataclass(frozen=True, kw_only=True)
class ControlPlaneFeaturesArgs:
    """Inputs of ControlPlaneFeatures."""

    ssh: SshAccess
    """SSH login shared by every host."""
    control_plane_hosts: Sequence[RemoteHost]
    """Hosts running a kubeadm kube-apiserver static pod, edited one at a time in this order."""
    kubernetes_version: str
    """The cluster's version; gates that are GA (locked), removed or unknown in it are left out."""
    kubelet_hosts: Sequence[RemoteHost] = ()
    """Hosts whose /var/lib/kubelet/config.yaml gets the feature gates (after the control plane)."""
    admission_plugins: Sequence[str] = ()
    """Admission plugins added to --enable-admission-plugins (existing ones are kept)."""
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    """Feature gates merged into --feature-gates and the kubelets' featureGates."""
    ready_timeout_seconds: int = 300
    """How long a restarted kube-apiserver or kubelet may take to be healthy before rollback."""
    persist_kubeadm_config: bool = True
    """Also edit kube-system/kubeadm-config (and kubelet-config) so `kubeadm upgrade` keeps it."""

    def __post_init__(self) -> None:
        if not self.control_plane_hosts:
            raise ValueError("control_plane_hosts: got []; at least one host is required")
        for key, hosts in (
            ("control_plane_hosts", self.control_plane_hosts),
            ("kubelet_hosts", self.kubelet_hosts),
        ):
            names = [h.name for h in hosts]
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{key}: got {twice} twice; each host may be listed once")
        if self.ready_timeout_seconds < 1:
            raise ValueError(
                f"ready_timeout_seconds: got {self.ready_timeout_seconds}; expected >= 1"
            )
        for gate, value in self.feature_gates.items():
            if not isinstance(value, bool):
                raise ValueError(f"feature_gates.{gate}: got {value!r}; expected true or false")


# The shell side, run as root on each host (POSIX sh; needs python3, curl, pgrep, sha256sum).
_HOST_LIB = r"""
log() { printf 'gpu-cluster: %s\n' "$*" >&2; }
fail() { log "$*"; exit 1; }
now() { date +%s; }

# The editor from the staged copy, refused unless it is byte for byte the one this stack ships.
ensure_editor() {
  mkdir -p "$STATES" "$BACKUPS" "$WORK"
  chmod 0700 "$STATES" "$BACKUPS" "$WORK"
  if [ -f "$STAGED" ]; then install -D -m 0755 "$STAGED" "$EDIT"; fi
  echo "$EDIT_SHA256  $EDIT" | sha256sum -c --status 2>/dev/null \
    || fail "$EDIT is missing or is not the editor this stack ships (sha256 $EDIT_SHA256)"
}

apiserver_pids() { pgrep -x kube-apiserver | sort -n | tr '\n' ' ' || true; }

# This host's kube-apiserver, never the load balancer: --bind-address (default all) and
# --secure-port (default 6443) from its manifest.
apiserver_readyz_url() {
  port=$(sed -n 's/^[[:space:]]*-[[:space:]]*--secure-port=\([0-9][0-9]*\).*/\1/p' "$MANIFEST" | head -n 1)
  addr=$(sed -n 's/^[[:space:]]*-[[:space:]]*--bind-address=\([^[:space:]"]*\).*/\1/p' "$MANIFEST" | head -n 1)
  case "$addr" in ""|0.0.0.0|::) addr=127.0.0.1 ;; *:*) addr="[$addr]" ;; esac
  echo "https://$addr:${port:-6443}/readyz"
}

apiserver_ready() { [ "$(curl -sk --max-time 5 "$(apiserver_readyz_url)" 2>/dev/null)" = ok ]; }

# settle_apiserver OLD_PIDS: the kubelet replaced the kube-apiserver (none of OLD_PIDS is alive,
# a new one runs) and the new one answers /readyz "ok", within $TIMEOUT seconds.
settle_apiserver() {
  end=$(( $(now) + TIMEOUT ))
  while [ "$(now)" -lt "$end" ]; do
    sleep 2
    old=""
    for p in $1; do if kill -0 "$p" 2>/dev/null; then old=1; fi; done
    if [ -z "$old" ] && [ -n "$(apiserver_pids)" ] && apiserver_ready; then
      log "kube-apiserver ready at $(apiserver_readyz_url)"
      return 0
    fi
  done
  return 1
}

# settle_kubelet: restart the kubelet, wait for its /healthz, then for node $NODE to be Ready
# with a heartbeat newer than the restart (a Ready condition from before proves nothing).
settle_kubelet() {
  start=$(now)
  end=$(( start + TIMEOUT ))
  systemctl restart kubelet
  port=$(sed -n 's/^healthzPort:[[:space:]]*\([0-9][0-9]*\).*/\1/p' "$KUBELET_CONFIG" | head -n 1)
  until [ "$(curl -s --max-time 3 "http://127.0.0.1:${port:-10248}/healthz" 2>/dev/null)" = ok ]; do
    [ "$(now)" -lt "$end" ] || return 1
    sleep 2
  done
  if ! command -v kubectl >/dev/null 2>&1 || [ ! -f "$KUBELET_KUBECONFIG" ]; then
    log "kubectl or $KUBELET_KUBECONFIG missing: kubelet /healthz is ok, node Ready not checked"
    return 0
  fi
  jp='{range .status.conditions[?(@.type=="Ready")]}{.status} {.lastHeartbeatTime}{end}'
  while [ "$(now)" -lt "$end" ]; do
    ready=$(kubectl --kubeconfig "$KUBELET_KUBECONFIG" get node "$NODE" -o jsonpath="$jp" 2>/dev/null || true)
    status=${ready%% *}
    beat=${ready#* }
    if [ "$status" = True ] && [ "$(date -d "$beat" +%s 2>/dev/null || echo 0)" -ge "$start" ]; then
      log "node $NODE Ready"
      return 0
    fi
    sleep 3
  done
  return 1
}

# guarded FILE STATE SETTLE EDITOR-ARGS...: run the editor on FILE; if it changed FILE, SETTLE
# must succeed, else FILE and STATE go back to their snapshot, SETTLE runs again, and we fail.
guarded() {
  file=$1 state=$2 settle=$3
  shift 3
  pre="$BACKUPS/$(basename "$file").pre-edit"
  cp -p "$file" "$pre"
  if [ -f "$state" ]; then cp -p "$state" "$pre.state"; else rm -f "$pre.state"; fi
  before=$(apiserver_pids)
  summary=$(python3 "$EDIT" "$@") || fail "the editor refused or failed on $file (nothing written)"
  printf '%s\n' "$summary"
  case "$summary" in
    *'"changed": true'*) ;;
    *) log "$file already as configured"; return 0 ;;
  esac
  if "$settle" "$before"; then return 0; fi
  log "not healthy within ${TIMEOUT}s after editing $file: restoring the previous file"
  before=$(apiserver_pids)
  tmp="$(dirname "$file")/.$(basename "$file").gpu-cluster-restore"
  cp -p "$pre" "$tmp" && mv -f "$tmp" "$file"
  if [ -f "$pre.state" ]; then cp -p "$pre.state" "$state"; else rm -f "$state"; fi
  "$settle" "$before" || log "still not healthy after restoring $file"
  fail "edit of $file rolled back; see the messages above"
}

# cm_edit CONFIGMAP KEY IN OUT STATE EDITOR-ARGS...: the editor on data[KEY] of kube-system/
# CONFIGMAP (extracted to IN, result in OUT), written back with a merge patch that carries the
# resourceVersion read, so a concurrent change makes this fail instead of being overwritten.
cm_edit() {
  cm=$1 key=$2 src=$3 dst=$4 state=$5
  shift 5
  k="kubectl --kubeconfig $ADMIN_KUBECONFIG -n kube-system"
  $k get configmap "$cm" -o json > "$WORK/$cm.json" || fail "cannot read kube-system/$cm"
  python3 - "$WORK/$cm.json" "$key" "$src" <<'PY'
import json, sys
cm = json.load(open(sys.argv[1]))
text = (cm.get("data") or {}).get(sys.argv[2])
if text is None:
    sys.exit("kube-system/%s has no data key %s" % (cm["metadata"]["name"], sys.argv[2]))
open(sys.argv[3], "w").write(text)
PY
  if [ -f "$state" ]; then cp -p "$state" "$state.pre-edit"; else rm -f "$state.pre-edit"; fi
  python3 "$EDIT" "$@" || fail "the editor refused or failed on kube-system/$cm (nothing written)"
  if cmp -s "$src" "$dst"; then log "kube-system/$cm already as configured"; return 0; fi
  python3 - "$WORK/$cm.json" "$key" "$dst" > "$WORK/$cm.patch.json" <<'PY'
import json, sys
cm = json.load(open(sys.argv[1]))
patch = {"metadata": {"resourceVersion": cm["metadata"]["resourceVersion"]},
         "data": {sys.argv[2]: open(sys.argv[3]).read()}}
print(json.dumps(patch))
PY
  if ! $k patch configmap "$cm" --type merge --patch-file "$WORK/$cm.patch.json"; then
    if [ -f "$state.pre-edit" ]; then mv -f "$state.pre-edit" "$state"; else rm -f "$state"; fi
    fail "kube-system/$cm not updated (changed meanwhile?); run pulumi up again"
  fi
  log "kube-system/$cm updated"
}
"""


def _sh(name: str, value: str | int) -> str:
    return f"{name}={shlex.quote(str(value))}"


def script_sha256() -> str:
    """sha256 of the editor, as the hosts check it."""
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()


def staged_path(sha: str) -> str:
    """Where the editor is copied before root installs it (a name per editor version)."""
    return f"/tmp/gpu-cluster-kube_flags_edit-{sha[:16]}.py"


def host_command(variables: Mapping[str, str | int], body: str, sha: str, timeout: int) -> str:
    """The remote command: the host library, `body`, run as root (sudo -n unless root)."""
    lines = [
        "set -eu",
        _sh("EDIT", HOST_SCRIPT),
        _sh("EDIT_SHA256", sha),
        _sh("STAGED", staged_path(sha)),
        _sh("STATES", STATE_DIR),
        _sh("BACKUPS", BACKUP_DIR),
        _sh("WORK", WORK_DIR),
        _sh("MANIFEST", APISERVER_MANIFEST),
        _sh("KUBELET_CONFIG", KUBELET_CONFIG),
        _sh("ADMIN_KUBECONFIG", ADMIN_KUBECONFIG),
        _sh("KUBELET_KUBECONFIG", KUBELET_KUBECONFIG),
        _sh("TIMEOUT", timeout),
        *(_sh(k, v) for k, v in variables.items()),
        _HOST_LIB.strip(),
        "ensure_editor",
        body,
    ]
    script = "\n".join(lines)
    return (
        f'if [ "$(id -u)" -eq 0 ]; then S=""; else S="sudo -n"; fi; $S sh -c {shlex.quote(script)}'
    )


class ControlPlaneFeatures(pulumi.ComponentResource):
    """Enables admission plugins and feature gates on kubeadm control planes and kubelets."""

    hosts: pulumi.Output[list[str]]
    """Hosts edited, in the order they were edited (control plane first)."""
    admission_plugins: pulumi.Output[list[str]]
    """Admission plugins enabled on every control-plane host."""
    feature_gates: pulumi.Output[dict[str, bool]]
    """Feature gates set, after leaving out those locked or gone in the Kubernetes version."""
    skipped_gates: pulumi.Output[list[str]]
    """Configured gates left out for the Kubernetes version (each logged as a warning)."""

    def __init__(
        self,
        name: str,
        args: ControlPlaneFeaturesArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(TOKEN, name, None, opts)
        # One source of truth for gate lifecycles: the table the host editor uses too.
        gates, warnings = filter_gates(dict(args.feature_gates), args.kubernetes_version)
        for warning in warnings:
            pulumi.log.warn(warning, resource=self)
        skipped = [gate for gate in args.feature_gates if gate not in gates]
        sha = script_sha256()

        copies: dict[str, remote.CopyToRemote] = {}
        chain: list[remote.Command] = []
        touched: list[str] = []

        def connection(host: RemoteHost) -> remote.ConnectionArgs:
            return remote.ConnectionArgs(
                host=host.address,
                port=args.ssh.port,
                user=args.ssh.user,
                private_key=args.ssh.private_key,
            )

        def copy(host: RemoteHost) -> remote.CopyToRemote:
            if host.name not in copies:
                copies[host.name] = remote.CopyToRemote(
                    f"{name}-editor-{host.name}",
                    connection=connection(host),
                    source=pulumi.FileAsset(str(SCRIPT)),
                    remote_path=staged_path(sha),
                    triggers=[sha],
                    opts=pulumi.ResourceOptions(parent=self),
                )
            return copies[host.name]

        def step(
            suffix: str,
            host: RemoteHost,
            variables: Mapping[str, str | int],
            apply: str,
            revert: str,
        ) -> None:
            deps: list[pulumi.Resource] = [copy(host)]
            if chain:
                deps.append(chain[-1])  # one host at a time: each waits for the previous one
            create = host_command(variables, apply, sha, args.ready_timeout_seconds)
            cmd = remote.Command(
                f"{name}-{suffix}",
                connection=connection(host),
                create=create,
                # The editor converges (drops entries it added that are no longer configured),
                # so a changed configuration or editor is applied in place. No `triggers`: they
                # force a replacement, whose delete would revert the new apply on the same file.
                update=create,
                delete=host_command(variables, revert, sha, args.ready_timeout_seconds),
                opts=pulumi.ResourceOptions(
                    parent=self,
                    depends_on=deps,
                    # If a replacement is forced anyway (new address, new key), revert the old
                    # edit before applying the new one, never the other way round.
                    delete_before_replace=True,
                ),
            )
            chain.append(cmd)
            if host.name not in touched:
                touched.append(host.name)

        def editor(target: str, action: str, **kw: Any) -> str:
            return shlex.join(build_argv(target, action, backup_dir=BACKUP_DIR, **kw))

        plugins = list(args.admission_plugins)
        version = args.kubernetes_version
        apiserver_state = f"{STATE_DIR}/kube-apiserver.json"
        for host in args.control_plane_hosts:
            common = {"file": APISERVER_MANIFEST, "state": apiserver_state}
            guard = f"guarded {APISERVER_MANIFEST} {apiserver_state} settle_apiserver "
            step(
                f"apiserver-{host.name}",
                host,
                {"NODE": host.name},
                # Never start on an API server that is already unhealthy: rollback could not
                # tell our damage from what was there.
                'apiserver_ready || fail "kube-apiserver is not ready before the edit"\n'
                + guard
                + editor(
                    "apiserver-manifest",
                    "apply",
                    admission_plugins=plugins,
                    feature_gates=gates,
                    kubernetes_version=version,
                    **common,
                ),
                guard + editor("apiserver-manifest", "revert", **common),
            )

        first = args.control_plane_hosts[0]

        def configmap_step(suffix: str, configmap: str, key: str, target: str, **kw: Any) -> None:
            files = {
                "file": f"{WORK_DIR}/{configmap}.in.yaml",
                "out": f"{WORK_DIR}/{configmap}.out.yaml",
                "state": f"{STATE_DIR}/{configmap}.json",
            }
            head = f"cm_edit {configmap} {key} {files['file']} {files['out']} {files['state']} "
            step(
                suffix,
                first,
                {"NODE": first.name},
                head + editor(target, "apply", kubernetes_version=version, **kw, **files),
                head + editor(target, "revert", **files),
            )

        if args.persist_kubeadm_config:
            configmap_step(
                "kubeadm-config",
                "kubeadm-config",
                "ClusterConfiguration",
                "kubeadm-config",
                admission_plugins=plugins,
                feature_gates=gates,
            )

        kubelet_state = f"{STATE_DIR}/kubelet-config.json"
        for host in args.kubelet_hosts:
            common = {"file": KUBELET_CONFIG, "state": kubelet_state}
            guard = f"guarded {KUBELET_CONFIG} {kubelet_state} settle_kubelet "
            step(
                f"kubelet-{host.name}",
                host,
                {"NODE": host.name},
                guard
                + editor(
                    "kubelet-config",
                    "apply",
                    feature_gates=gates,
                    kubernetes_version=version,
                    **common,
                ),
                guard + editor("kubelet-config", "revert", **common),
            )

        if args.persist_kubeadm_config and args.kubelet_hosts:
            # `kubeadm upgrade node` rewrites /var/lib/kubelet/config.yaml from this ConfigMap.
            # Ref: https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-reconfigure/
            configmap_step(
                "kubelet-configmap",
                "kubelet-config",
                "kubelet",
                "kubelet-config",
                feature_gates=gates,
            )

        done = pulumi.Output.all(*(c.id for c in chain))
        self.hosts = done.apply(lambda _: list(touched))
        self.admission_plugins = done.apply(lambda _: list(plugins))
        self.feature_gates = done.apply(lambda _: dict(gates))
        self.skipped_gates = pulumi.Output.from_input(list(skipped))
        self.register_outputs(
            {
                "hosts": self.hosts,
                "admission_plugins": self.admission_plugins,
                "feature_gates": self.feature_gates,
                "skipped_gates": self.skipped_gates,
            }
        )
