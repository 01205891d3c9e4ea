#!/usr/bin/env bash
# Build the pinned control-plane tools used by the integration tests:
#
#   opa             github.com/open-policy-agent/opa      v1.22.2  (tools/go/opa)
#   etcd            go.etcd.io/etcd/server/v3             v3.6.16  (tools/go/etcd)
#   kube-apiserver           k8s.io/kubernetes/cmd/kube-apiserver           v1.37.2  (tools/go/kubernetes)
#   kube-controller-manager  k8s.io/kubernetes/cmd/kube-controller-manager  v1.37.2  (tools/go/kubernetes)
#   kube-scheduler           k8s.io/kubernetes/cmd/kube-scheduler           v1.37.2  (tools/go/kubernetes)
#   kubeadm                  k8s.io/kubernetes/cmd/kubeadm                  v1.37.2  (tools/go/kubernetes)
#   gpu-binpack-scheduler    kube-scheduler v1.37.2 with the GpuFragmentation and
#                            GpuClaimBinpack score plugins
#                            (scheduler/, the stack's own module, not a wrapper: its unit tests
#                            run with `make test`)
#   kwok                     sigs.k8s.io/kwok/cmd/kwok                      v0.8.0   (tools/go/kwok;
#                            simulated kubelets; kwok-stages.yaml: its default node and pod stages,
#                            from the same module zip)
#   monitoring-crds.yaml  the monitoring.coreos.com CRDs (ServiceMonitor, PrometheusRule, ...)
#                   rendered by controller-gen (sigs.k8s.io/controller-tools v0.23.0) from
#                   github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
#                   v0.95.1 (tools/go/crds); the e2e harness installs them where the
#                   kube-prometheus-stack chart would
#   promtool        github.com/prometheus/prometheus/cmd/promtool  v0.315.0 = Prometheus 3.15.0
#                   (tools/go/promtool; checks and unit-tests the GPU alert rules)
#   promql-metrics  tools/go/promtool/cmd/promql-metrics  (same module: Prometheus' PromQL
#                   parser, lists the metrics each dashboard expression selects)
#   celgate         tools/go/celgate (k8s.io/apiserver v0.37.2's CEL libraries: the gate's
#                   policies judged without a cluster, as the admission plugins judge them)
#
# and, for `make scheduler-image` only (not in the default set):
#
#   ko              github.com/google/ko                              v0.19.1  (tools/go/ko)
#   crane           github.com/google/go-containerregistry/cmd/crane  v0.21.7  (tools/go/ko; the
#                   go-containerregistry release ko v0.19.1 requires)
#   ko-base         tools/go/ko/cmd/ko-base  (same module: the minimal base image, served from a
#                   throwaway registry on 127.0.0.1 while ko builds, and the reproducible archive)
#
# Each tool is built from a small wrapper Go module whose go.mod/go.sum pin the
# exact dependency graph. Binaries go to <repo>/.tools/bin (git-ignored), or to
# $GPU_CLUSTER_TOOLS_BIN if set. A tool is rebuilt only when its stamp file
# (.tools/bin/.<tool>.stamp: version, go version, build flags and a hash of the
# wrapper module's go.mod/go.sum/sources) changes or the binary is missing, so
# a second run is a no-op.
#
# Usage: tools/build-tools.sh [tool...]   (default: all, in the order above)
set -euo pipefail

# shellcheck source=tools/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

# Build date of a pinned module = its release time on the proxy, so that the
# stamped version info is reproducible (not the wall clock of this build).
module_time() {
  (cd "$1" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "$2")
}

opa_version=v1.22.2
etcd_version=v3.6.16
k8s_version=v1.37.2
promtool_version=v0.315.0
kwok_version=v0.8.0
controller_tools_version=v0.23.0
monitoring_apis_version=v0.95.1
ko_version=v0.19.1
crane_version=v0.21.7

build_opa() {
  # github.com/open-policy-agent/opa/v1/version.Version is already "1.22.2"
  # in the released module; nothing to stamp.
  build opa "${opa_version}" "${go_dir}/opa" github.com/open-policy-agent/opa "-s -w"
}

build_etcd() {
  # go.etcd.io/etcd/api/v3/version.Version is already "3.6.16"; the git SHA
  # is unknown for a module build, so say where the binary came from.
  build etcd "${etcd_version}" "${go_dir}/etcd" ./cmd/etcd \
    "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-${etcd_version}"
}

k8s_ldflags() {
  local major minor date pkg flags="-s -w"
  major="${k8s_version#v}"; major="${major%%.*}"
  minor="${k8s_version#v*.}"; minor="${minor%%.*}"
  date="$(module_time "${go_dir}/kubernetes" k8s.io/kubernetes)"
  # Same variables upstream's hack/lib/version.sh sets.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X ${pkg}.gitVersion=${k8s_version}"
    flags+=" -X ${pkg}.gitMajor=${major}"
    flags+=" -X ${pkg}.gitMinor=${minor}"
    flags+=" -X ${pkg}.gitTreeState=archive"
    flags+=" -X ${pkg}.buildDate=${date}"
  done
  echo "${flags}"
}

# build_k8s <command>: one of the k8s.io/kubernetes commands of the wrapper module.
build_k8s() {
  build "$1" "${k8s_version}" "${go_dir}/kubernetes" "k8s.io/kubernetes/cmd/$1" "$(k8s_ldflags)"
}

# The scheduler with the GpuFragmentation plugin (the product's own Go module, scheduler/): the
# same version stamps as kube-scheduler, whose k8s.io/kubernetes version its go.mod pins.
build_gpu_binpack_scheduler() {
  build gpu-binpack-scheduler "${k8s_version}" "${repo_root}/scheduler" ./cmd/kube-scheduler "$(k8s_ldflags)"
}

build_kwok() {
  # sigs.k8s.io/kwok/pkg/consts.Version is already "0.8.0" in the released module.
  build kwok "${kwok_version}" "${go_dir}/kwok" sigs.k8s.io/kwok/cmd/kwok "-s -w"
  # The `kwok` command has no built-in stages (kwokctl embeds them); install the module's own
  # fast node and pod stages, with the lease heartbeat, as one --config file.
  local dir
  dir="$(module_dir "${go_dir}/kwok" sigs.k8s.io/kwok)/kustomize/stage"
  install_concat kwok-stages.yaml "${kwok_version}" \
    "${dir}/node/fast/node-initialize.yaml" \
    "${dir}/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
    "${dir}/pod/fast/pod-ready.yaml" \
    "${dir}/pod/fast/pod-complete.yaml" \
    "${dir}/pod/fast/pod-delete.yaml"
}

build_monitoring_crds() {
  build controller-gen "${controller_tools_version}" "${go_dir}/crds" \
    sigs.k8s.io/controller-tools/cmd/controller-gen "-s -w"
  local out="${bin_dir}/monitoring-crds.yaml" stamp_file="${bin_dir}/.monitoring-crds.yaml.stamp"
  local stamp tmp file
  stamp="$(printf '%s\n' "apis=${monitoring_apis_version}" "module=$(module_hash "${go_dir}/crds")" \
    "controller-gen=$(cat "${bin_dir}/.controller-gen.stamp")")"
  if up_to_date "${out}" "${stamp_file}" "${stamp}"; then
    echo "monitoring-crds.yaml ${monitoring_apis_version} up to date"
    return 0
  fi
  echo "rendering monitoring-crds.yaml ${monitoring_apis_version} ..."
  rm -f "${stamp_file}"
  tmp="$(mktemp -d)"
  # Descriptions dropped: the CRDs serve schema validation in tests, not documentation.
  (cd "${go_dir}/crds" && "${bin_dir}/controller-gen" crd:maxDescLen=0 \
    paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
    output:crd:dir="${tmp}")
  for file in "${tmp}"/*.yaml; do
    printf -- '---\n'
    cat "${file}"
  done >"${out}.tmp"
  rm -rf "${tmp}"
  mv -f "${out}.tmp" "${out}"
  printf '%s\n' "${stamp}" >"${stamp_file}"
  echo "rendered monitoring-crds.yaml"
}

build_promtool() {
  # Prometheus 3.x ships as Go module v0.3xx.y; promtool --version reads these.
  local date pkg=github.com/prometheus/common/version
  date="$(module_time "${go_dir}/promtool" github.com/prometheus/prometheus)"
  build promtool "${promtool_version}" "${go_dir}/promtool" \
    github.com/prometheus/prometheus/cmd/promtool \
    "-s -w -X ${pkg}.Version=3.15.0 -X ${pkg}.Revision=module-${promtool_version} -X ${pkg}.BuildDate=${date}"
}

build_promql_metrics() {
  build promql-metrics "${promtool_version}" "${go_dir}/promtool" ./cmd/promql-metrics "-s -w"
}

build_celgate() {
  build celgate "${k8s_version}" "${go_dir}/celgate" . "-s -w"
}

build_ko() {
  build ko "${ko_version}" "${go_dir}/ko" github.com/google/ko \
    "-s -w -X github.com/google/ko/pkg/commands.Version=${ko_version}"
}

build_crane() {
  build crane "${crane_version}" "${go_dir}/ko" github.com/google/go-containerregistry/cmd/crane \
    "-s -w -X github.com/google/go-containerregistry/cmd/crane/cmd.Version=${crane_version}"
}

build_ko_base() {
  build ko-base "${crane_version}" "${go_dir}/ko" ./cmd/ko-base "-s -w"
}

tools=("$@")
if [[ ${#tools[@]} -eq 0 ]]; then
  tools=(opa etcd kube-apiserver kube-controller-manager kube-scheduler kubeadm gpu-binpack-scheduler kwok monitoring-crds promtool promql-metrics celgate)
fi

for tool in "${tools[@]}"; do
  case "${tool}" in
    opa) build_opa ;;
    etcd) build_etcd ;;
    kube-apiserver|kube-controller-manager|kube-scheduler|kubeadm) build_k8s "${tool}" ;;
    gpu-binpack-scheduler) build_gpu_binpack_scheduler ;;
    kwok) build_kwok ;;
    monitoring-crds) build_monitoring_crds ;;
    promtool) build_promtool ;;
    promql-metrics) build_promql_metrics ;;
    celgate) build_celgate ;;
    ko) build_ko ;;
    crane) build_crane ;;
    ko-base) build_ko_base ;;
    *) echo "unknown tool: ${tool} (known: opa etcd kube-apiserver kube-controller-manager kube-scheduler kubeadm gpu-binpack-scheduler kwok monitoring-crds promtool promql-metrics celgate ko crane ko-base)" >&2; exit 2 ;;
  esac
done
echo "tools in ${bin_dir}"
