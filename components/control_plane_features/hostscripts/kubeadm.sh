# kubeadm's own phases on one host, run as root: sh -c "$(cat kubeadm.sh)" kubeadm.sh ACTION
#
#   check          refuse if regenerating the control-plane manifests would drop hand edits
#   control-plane  check, then `kubeadm upgrade node phase control-plane` (kubeadm writes the
#                  manifests from the kubeadm-config ConfigMap, backs the old ones up, waits for
#                  the static pods and rolls back on failure)
#   kubelet        write the stack's kubelet patch; with every stack's patch on the host, ask
#                  kubeadm's dry run of `upgrade node phase kubelet-config --patches` what the
#                  kubelet would get; refuse if that drops settings of the kubelet's config other
#                  than this stack's gates, naming them; done if the kubelet already runs with
#                  it; else the phase, restart the kubelet, wait for /healthz (else put the old
#                  config and the old patch back)
#   kubelet-remove remove the stack's kubelet patch and do the same
#
# Environment: STACK_DIR (this stack's state and patches, named by the stack's id; its parent
# holds every stack's), FORMER (names of directories beside it that an earlier version kept
# for this stack, keyed by the stack's name: control-plane, kubelet and kubelet-remove adopt
# them first), OURS (the admission plugins, gates and API versions the stack adds, space separated:
# regenerating may drop those), GATES (kubelet gates, `Name=true,...`; for kubelet-remove the
# ones it set), TIMEOUT (kubelet health wait, seconds). MANIFESTS, KUBELET_CONFIG,
# INSTANCE_CONFIG and HEALTHZ default to kubeadm's and the kubelet's paths.
# Ref: https://kubernetes.io/docs/tasks/administer-cluster/kubeadm/kubeadm-reconfigure/
set -eu
MANIFESTS=${MANIFESTS:-/etc/kubernetes/manifests}
KUBELET_CONFIG=${KUBELET_CONFIG:-/var/lib/kubelet/config.yaml}
HEALTHZ=${HEALTHZ:-http://127.0.0.1:10248/healthz}
TIMEOUT=${TIMEOUT:-120}
OURS=${OURS:-}
INSTANCE_CONFIG=${INSTANCE_CONFIG:-$(dirname "$KUBELET_CONFIG")/instance-config.yaml}
STATE=$(dirname "${STACK_DIR:?STACK_DIR is required}")
PATCH=kubeletconfiguration+strategic.yaml
COMPONENTS="kube-apiserver kube-controller-manager kube-scheduler"
MANAGED='^[[:space:]]*- --(enable-admission-plugins|feature-gates|runtime-config)='
# Only the manifests: etcd and the certificates are not this layer's to touch.
PHASE_FLAGS="--etcd-upgrade=false --certificate-renewal=false"

log() { printf 'gpu-cluster: %s\n' "$*" >&2; }
fail() { log "$*"; exit 1; }

# render DIR: kubeadm's manifests for this node from the cluster's ClusterConfiguration. The
# dry run prints each as `[dryrun] Would write file "PATH" with content:` (not always at the
# start of a line) and the file's lines; the next `[...]` message ends it.
render() {
  kubeadm upgrade node phase control-plane --dry-run $PHASE_FLAGS >"$1/dry-run" 2>"$1/dry-run.err" \
    || { cat "$1/dry-run" "$1/dry-run.err" >&2; fail "kubeadm cannot render the control-plane manifests"; }
  awk -v dir="$1" '
    /\[dryrun\] Would write file "/ {
      f = $0; sub(/.*\[dryrun\] Would write file "/, "", f); sub(/".*/, "", f)
      k = split(f, p, "/"); out = dir "/" p[k]; next
    }
    /^\[/ { out = ""; next }
    out != "" { print > out }' "$1/dry-run"
}

# flag_items FILE FLAG: the comma-separated items of one flag in a manifest, one a line.
flag_items() {
  sed -n "s/^[[:space:]]*- --$2=//p" "$1" | tr -d "\"'" | tr ',' '\n' | sed '/^$/d' | sort -u
}

# dropped LIVE RENDERED: what the live manifest has and kubeadm's rendering lacks, apart from
# the items this stack adds (in $OURS and in the previous run's record).
dropped() {
  grep -v '^[[:space:]]*$' "$2" >"$2.lines" || true
  grep -vxF -f "$2.lines" "$1" | grep -v '^[[:space:]]*$' | grep -vE "$MANAGED" || true
  ours=" $OURS $(cat "$STACK_DIR/control-plane-items" 2>/dev/null || true) "
  for flag in enable-admission-plugins feature-gates runtime-config; do
    flag_items "$1" "$flag" >"$2.live"
    flag_items "$2" "$flag" >"$2.new"
    comm -23 "$2.live" "$2.new" | while read -r item; do
      case "$ours" in *" ${item%%=*} "*) ;; *) echo "--$flag item $item" ;; esac
    done
  done
}

check() {
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  render "$work"
  edits=""
  for c in $COMPONENTS; do
    [ -f "$MANIFESTS/$c.yaml" ] || fail "$MANIFESTS/$c.yaml missing: not a kubeadm control-plane host"
    [ -f "$work/$c.yaml" ] || fail "kubeadm rendered no $c manifest"
    lost=$(dropped "$MANIFESTS/$c.yaml" "$work/$c.yaml")
    if [ -n "$lost" ]; then edits="$edits
$MANIFESTS/$c.yaml:
$lost"; fi
  done
  [ -z "$edits" ] || fail "refusing: regenerating with kubeadm would drop these hand edits (put them in the kubeadm-config ClusterConfiguration, or remove them, then run again):$edits"
  log "control-plane manifests match kubeadm's rendering"
}

control_plane() {
  adopt
  check
  kubeadm upgrade node phase control-plane $PHASE_FLAGS \
    || fail "kubeadm upgrade node phase control-plane failed (kubeadm rolled the manifests back); see its output above"
  record_items
  log "control-plane manifests regenerated by kubeadm"
}

# in_manifests ITEM: a plugin or gate of ITEM's name is in a regenerated manifest's flags.
in_manifests() {
  for c in $COMPONENTS; do grep -hE "$MANAGED" "$MANIFESTS/$c.yaml" || true; done \
    | tr '=,' '\n\n' | grep -qx "$1"
}

# record_items: remember the stack's items ($OURS, and earlier ones kubeadm still renders, as
# when a host's command is replaced while the ConfigMap keeps them) for the next check.
record_items() {
  items=$OURS
  for item in $(cat "$STACK_DIR/control-plane-items" 2>/dev/null || true); do
    case " $items " in *" $item "*) ;; *) if in_manifests "$item"; then items="$items $item"; fi ;; esac
  done
  items=$(echo $items)
  if [ -n "$items" ]; then
    mkdir -p "$STACK_DIR"
    printf '%s\n' "$items" >"$STACK_DIR/control-plane-items"
  else
    rm -f "$STACK_DIR/control-plane-items"
    rmdir "$STACK_DIR" 2>/dev/null || true
  fi
}

# ---------------------------------------------------------------------------- former keys

# patch_gates FILE...: the gate lines (`  Name: value`) of kubelet patches of this script.
patch_gates() {
  grep -h '^  [A-Za-z0-9]*: [a-z]*$' "$@" 2>/dev/null || true
}

# write_patch FILE: a kubelet patch with the gate lines on standard input, each gate once (the
# first line naming it wins); written beside FILE, then moved over it.
write_patch() {
  mkdir -p "$(dirname "$1")"
  {
    echo "apiVersion: kubelet.config.k8s.io/v1beta1"
    echo "kind: KubeletConfiguration"
    echo "featureGates:"
    awk -F: '!seen[$1]++'
  } >"$1.new"
  mv "$1.new" "$1"
}

# adopt: what an earlier version left for this stack under its name (each of $FORMER) becomes
# this stack's: the kubelet patch's gates are merged into this stack's patch (its own values
# first; the kubelet already runs with both, so it is left as it is) and the control-plane
# record into its record; the old directory then goes, unless it holds files of no stack's.
adopt() {
  for key in ${FORMER:-}; do
    case "$key" in */* | . | ..) continue ;; esac
    old="$STATE/$key"
    [ "$old" != "$STACK_DIR" ] && [ -d "$old" ] || continue
    if [ -f "$old/patches/$PATCH" ]; then
      patch_gates "$STACK_DIR/patches/$PATCH" "$old/patches/$PATCH" | write_patch "$STACK_DIR/patches/$PATCH"
      rm -f "$old/patches/$PATCH"
      rmdir "$old/patches" 2>/dev/null || true
    fi
    if [ -f "$old/control-plane-items" ]; then
      items=$(cat "$STACK_DIR/control-plane-items" "$old/control-plane-items" 2>/dev/null \
        | tr ' ' '\n' | awk 'NF && !seen[$0]++')
      mkdir -p "$STACK_DIR"
      echo $items >"$STACK_DIR/control-plane-items"
      rm -f "$old/control-plane-items"
    fi
    rmdir "$old" 2>/dev/null || log "left $old: it holds files this script did not write"
    log "adopted $old (this stack under its former name) into $STACK_DIR"
  done
}

# ---------------------------------------------------------------------------- kubelet
#
# kubeadm writes the kubelet's config from the kubelet-config ConfigMap, then the --patches
# directory, then the node's instance-config.yaml; anything else in the file is lost. Every
# stack's patch goes in (not only this one's), so a gate of another stack stays; kubeadm's own
# dry run says what the kubelet would get, and that is compared with the config the kubelet
# runs with, not with a patch file. A node's own settings are refused rather than carried
# over: the file cannot tell them from stale cluster-wide values, and only in the instance
# config do they survive kubeadm's own runs too.
# Ref: https://github.com/kubernetes/kubernetes/blob/v1.37.2/cmd/kubeadm/app/phases/kubelet/config.go

# flatten FILE: a block-style YAML document (kubeadm writes the kubelet's config so) as one
# `path: value` line per scalar, sorted: `featureGates.Foo: true`, `clusterDNS[0]: 10.96.0.10`.
# Comments and quotes go; one-level flow collections ({a: 1}, [x, y]) are unfolded and empty
# ones carry nothing. Anchors and multi-line flow collections are not understood.
flatten() {
  awk -v q="'" '
    function trim(s) { sub(/^[[:space:]]+/, "", s); sub(/[[:space:]]+$/, "", s); return s }
    function unquote(s,   f) {
      s = trim(s); f = substr(s, 1, 1)
      if (length(s) > 1 && (f == "\"" || f == q) && substr(s, length(s)) == f)
        s = substr(s, 2, length(s) - 2)
      return s
    }
    function here(   p, i) {
      p = ""
      for (i = 1; i <= n; i++) p = p (p == "" || item[i] ? "" : ".") name[i]
      return p
    }
    function join(p, key) { return p == "" ? key : p "." key }
    function flow(v,   f, l, inner) {  # "{" or "[" for a one-level flow collection, else ""
      f = substr(v, 1, 1); l = substr(v, length(v)); inner = substr(v, 2, length(v) - 2)
      if (!((f == "{" && l == "}") || (f == "[" && l == "]"))) return ""
      if (index(inner, "{") || index(inner, "}") || index(inner, "[") || index(inner, "]")) return ""
      return f
    }
    function emit(p, v,   kind, parts, k, i, c) {
      v = trim(v); kind = flow(v)
      if (kind == "") { print p ": " unquote(v); return }
      if (trim(substr(v, 2, length(v) - 2)) == "") return
      k = split(substr(v, 2, length(v) - 2), parts, ",")
      for (i = 1; i <= k; i++) {
        if (kind == "[") { emit(p "[" (i - 1) "]", parts[i]); continue }
        c = index(parts[i], ":")
        if (c) emit(join(p, unquote(substr(parts[i], 1, c - 1))), substr(parts[i], c + 1))
      }
    }
    BEGIN { keyre = "^(\"[^\"]*\"|" q "[^" q "]*" q "|[^:\"" q "]*):( |$)" }
    block != "" {  # the lines of a | or > scalar, joined by spaces
      match($0, /^ */)
      if ($0 ~ /^[[:space:]]*$/ || RLENGTH > blockind) { value = value " " trim($0); next }
      print block ": " substr(value, 2); block = ""
    }
    /^[[:space:]]*(#.*)?$/ || /^(---|\.\.\.)/ { next }
    {
      line = $0
      sub(/[[:space:]]+#.*$/, "", line)
      match(line, /^ */); ind = RLENGTH; rest = substr(line, ind + 1)
      while (rest ~ /^-( |$)/) {  # a list item: closes deeper entries and the previous item
        while (n > 0 && (lvl[n] > ind || (lvl[n] == ind && item[n]))) n--
        p = here(); idx = count[p]++
        n++; lvl[n] = ind; name[n] = "[" idx "]"; item[n] = 1
        rest = substr(rest, 2); match(rest, /^ */)
        ind += 1 + RLENGTH; rest = substr(rest, RLENGTH + 1)
      }
      if (rest == "") next
      if (match(rest, keyre)) {
        key = unquote(substr(rest, 1, index(rest, ":") - 1))
        value = trim(substr(rest, RLENGTH + 1))
        while (n > 0 && lvl[n] >= ind) n--
        p = join(here(), key)
        if (value == "") { n++; lvl[n] = ind; name[n] = key; item[n] = 0; delete count[p] }
        else if (value ~ /^[|>][-+0-9]*$/) { block = p; blockind = ind; value = "" }
        else emit(p, value)
      } else {
        emit(here(), rest)
      }
    }
    END { if (block != "") print block ": " substr(value, 2) }' "$1" | LC_ALL=C sort
}

# gate_names FILE...: the feature gates a kubelet patch of this script sets, one a line.
gate_names() {
  sed -n 's/^  \([A-Za-z0-9]*\): [a-z]*$/\1/p' "$@" 2>/dev/null || true
}

# kubelet_patches DIR: every stack's kubelet patch on this host into DIR, for kubeadm's
# --patches (`kubeletconfiguration<n>+strategic.yaml`, applied in stack-name order). Fails,
# naming them, when two stacks want a gate at different values.
kubelet_patches() {
  n=0
  for patch in "$STATE"/*/patches/"$PATCH"; do
    [ -f "$patch" ] || continue
    n=$((n + 1))
    cp "$patch" "$1/kubeletconfiguration$(printf '%03d' "$n")+strategic.yaml"
    stack=${patch%/patches/*}
    sed -n "s/^  \([A-Za-z0-9]*\): \([a-z]*\)$/\1 \2 ${stack##*/}/p" "$patch"
  done >"$work/gates"
  conflicts=$(awk '
    !($1 in value) { value[$1] = $2; stack[$1] = $3; next }
    value[$1] != $2 { print "  " $1 ": " value[$1] " (stack " stack[$1] "), " $2 " (stack " $3 ")" }
  ' "$work/gates")
  [ -z "$conflicts" ] || {
    log "refusing: the stacks on this host want different values for kubelet feature gates:
$conflicts"
    return 1
  }
}

# kubelet_dropped LIVE RENDERED OURS: the settings of LIVE that RENDERED lacks or changes,
# apart from the feature gates named in OURS, each with what kubeadm would write instead.
kubelet_dropped() {
  flatten "$1" >"$work/live.flat"
  flatten "$2" >"$work/rendered.flat"
  LC_ALL=C comm -23 "$work/live.flat" "$work/rendered.flat" | awk -v ours=" $(echo $3) " '
    NR == FNR { c = index($0, ": "); rendered[substr($0, 1, c - 1)] = substr($0, c + 2); next }
    {
      c = index($0, ": "); path = substr($0, 1, c - 1)
      if (path ~ /^featureGates\./ && index(ours, " " substr(path, 14) " ")) next
      print "  " $0 " (kubeadm would write " (path in rendered ? rendered[path] : "nothing") ")"
    }' "$work/rendered.flat" -
}

# kubelet_begin: a work directory beside the stacks' (the same path inside kubeadm's --rootfs),
# and a copy of this stack's patch to put back when the run does not go through.
kubelet_begin() {
  mkdir -p "$STATE"
  work=$(mktemp -d "$STATE/.kubelet.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  [ ! -d "$STACK_DIR/patches" ] || cp -Rp "$STACK_DIR/patches" "$work/stack-patches"
}

# kubelet_undo: this stack's patch as it was, so the host says what the kubelet runs with.
kubelet_undo() {
  rm -rf "$STACK_DIR/patches"
  if [ -d "$work/stack-patches" ]; then
    mkdir -p "$STACK_DIR"
    cp -Rp "$work/stack-patches" "$STACK_DIR/patches"
  fi
  rmdir "$STACK_DIR" 2>/dev/null || true
}

# kubelet_converge OURS: give the kubelet kubeadm's config with every stack's patch, unless it
# already runs with it. Refused, naming them, when that would drop settings other than the
# gates in OURS; an unhealthy kubelet gets its old config back. Either way this stack's patch
# is put back as it was.
kubelet_converge() {
  ours=$1
  [ -f "$KUBELET_CONFIG" ] || { kubelet_undo; fail "$KUBELET_CONFIG missing: not a kubeadm node"; }
  mkdir "$work/patches" "$work/dry-run"
  kubelet_patches "$work/patches" || { kubelet_undo; exit 1; }
  set -- kubeadm upgrade node phase kubelet-config
  [ -z "$(ls "$work/patches")" ] || set -- "$@" --patches "$work/patches"
  # kubeadm's dry run writes the config into its dry-run directory, applying the instance
  # config it finds there last, as the real run applies the node's.
  [ ! -f "$INSTANCE_CONFIG" ] || cp -p "$INSTANCE_CONFIG" "$work/dry-run/instance-config.yaml"
  KUBEADM_UPGRADE_DRYRUN_DIR=$work/dry-run "$@" --dry-run >"$work/dry-run.out" 2>&1 \
    && [ -f "$work/dry-run/config.yaml" ] \
    || { cat "$work/dry-run.out" >&2; kubelet_undo; fail "kubeadm cannot render the kubelet configuration"; }
  lost=$(kubelet_dropped "$KUBELET_CONFIG" "$work/dry-run/config.yaml" "$ours")
  if [ -n "$lost" ]; then
    kubelet_undo
    fail "refusing: kubeadm would drop these settings of $KUBELET_CONFIG, which are in neither the kubelet-config ConfigMap, a stack's patch nor $INSTANCE_CONFIG (move a node's own settings to $INSTANCE_CONFIG, which kubeadm applies last on every kubelet-config phase, or cluster-wide ones to the ConfigMap; then run again):
$lost"
  fi
  if cmp -s "$work/live.flat" "$work/rendered.flat"; then
    log "kubelet already runs with this configuration ($KUBELET_CONFIG)"
    return 0
  fi
  kubelet_phase "$@"
}

# kubelet_phase KUBEADM...: the phase for real, then the kubelet restarted and waited for;
# on any failure the old config, the kubelet on it and this stack's old patch are put back.
kubelet_phase() {
  cp -p "$KUBELET_CONFIG" "$work/config.yaml"
  # kubeadm names its backup directory by the second: a second run within it fails once.
  if ! { "$@" || { sleep 1; "$@"; }; }; then
    kubelet_rollback "kubeadm upgrade node phase kubelet-config failed"
  fi
  systemctl restart kubelet || kubelet_rollback "systemctl restart kubelet failed"
  end=$(($(date +%s) + TIMEOUT))
  until [ "$(curl -s --max-time 3 "$HEALTHZ" 2>/dev/null || true)" = ok ]; do
    [ "$(date +%s)" -lt "$end" ] || kubelet_rollback "kubelet not healthy within ${TIMEOUT}s"
    sleep 2
  done
  log "kubelet healthy"
}

kubelet_rollback() {
  cp -p "$work/config.yaml" "$KUBELET_CONFIG"
  systemctl restart kubelet || log "systemctl restart kubelet failed on the restored config"
  kubelet_undo
  fail "$1: previous $KUBELET_CONFIG restored"
}

# gates_in LIST: the names in `Name=true,...`, one a line.
gates_in() {
  printf '%s\n' "$1" | tr ',' '\n' | sed -n 's/^\([A-Za-z0-9]*\)=.*/\1/p'
}

kubelet() {
  # No gates left to set (all GA, say): an empty featureGates patch would clear the kubelet's.
  [ -n "${GATES:-}" ] || { kubelet_remove; return 0; }
  adopt
  kubelet_begin
  patch="$STACK_DIR/patches/$PATCH"
  ours="$(gate_names "$patch") $(gates_in "$GATES")"
  printf '%s\n' "$GATES" | tr ',' '\n' | sed -n 's/^\([A-Za-z0-9]*\)=\([a-z][a-z]*\)$/  \1: \2/p' \
    | write_patch "$patch"
  kubelet_converge "$ours"
}

# kubelet_remove: without this stack's patch. Its gates (the patch's, and those of GATES, the
# ones it last set) may go; the kubelet is compared with kubeadm's rendering even when the
# patch is already gone, as after a removal rolled back by an earlier version.
kubelet_remove() {
  adopt
  kubelet_begin
  ours="$(gate_names "$STACK_DIR/patches/$PATCH") $(gates_in "${GATES:-}")"
  rm -rf "$STACK_DIR/patches"
  rmdir "$STACK_DIR" 2>/dev/null || true
  kubelet_converge "$ours"
}

case "${1:-}" in
  check) check ;;
  control-plane) control_plane ;;
  kubelet) kubelet ;;
  kubelet-remove) kubelet_remove ;;
  *) fail "usage: kubeadm.sh check|control-plane|kubelet|kubelet-remove" ;;
esac
