#!/usr/bin/env bash
# Build the pinned control-plane tools used by the integration tests:
#
#   opa             github.com/open-policy-agent/opa      v1.22.2  (tools/go/opa)
#   etcd            go.etcd.io/etcd/server/v3             v3.6.16  (tools/go/etcd)
#   kube-apiserver  k8s.io/kubernetes/cmd/kube-apiserver  v1.34.4  (tools/go/kubernetes)
#   kube-scheduler  k8s.io/kubernetes/cmd/kube-scheduler  v1.34.4  (tools/go/kubernetes)
#   promtool        github.com/prometheus/prometheus/cmd/promtool  v0.315.0 = Prometheus 3.15.0
#                   (tools/go/promtool; checks and unit-tests the GPU alert rules)
#   promql-metrics  tools/go/promtool/cmd/promql-metrics  (same module: Prometheus' PromQL
#                   parser, lists the metrics each dashboard expression selects)
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

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
go_dir="${repo_root}/tools/go"
bin_dir="${GPU_CLUSTER_TOOLS_BIN:-${repo_root}/.tools/bin}"

# Module downloads come from the Go module proxy, which is the only Go endpoint
# reachable from the build machines. The checksum database sum.golang.org is not
# reachable directly, but the proxy mirrors it (the "supported sumdb" protocol
# at <proxy>/sumdb/<name>), so keep verifying against sum.golang.org's key and
# only change where the database is fetched from. Checksums are never disabled
# (no GONOSUMDB/GOFLAGS=-insecure); the committed go.sum files are checked too.
export GOPROXY="${GOPROXY:-https://proxy.golang.org}"
export GOSUMDB="${GOSUMDB:-sum.golang.org https://proxy.golang.org/sumdb/sum.golang.org}"
# Never silently download a different Go toolchain; the wrapper modules need
# go >= 1.26.0 (OPA v1.22.2 and etcd v3.6.16 declare it).
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
# Build exactly what go.mod/go.sum say; fail instead of editing them.
export GOFLAGS="-mod=readonly -buildvcs=false"
# Static binaries, as upstream releases them (no C toolchain needed).
export CGO_ENABLED=0

mkdir -p "${bin_dir}"

go_version="$(go env GOVERSION)"

# sha256 over the files that define a wrapper module's build.
module_hash() {
  local dir="$1"
  (cd "${dir}" && find . -type f \( -name go.mod -o -name go.sum -o -name '*.go' \) -print0 \
    | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
}

# build <tool> <version> <module dir> <package> <ldflags>
build() {
  local tool="$1" version="$2" dir="$3" pkg="$4" ldflags="$5"
  local out="${bin_dir}/${tool}" stamp_file="${bin_dir}/.${tool}.stamp"
  local stamp
  stamp="$(printf '%s\n' \
    "tool=${tool}" "version=${version}" "package=${pkg}" "go=${go_version}" \
    "goos=$(go env GOOS)" "goarch=$(go env GOARCH)" "cgo=${CGO_ENABLED}" \
    "goflags=${GOFLAGS}" "flags=-trimpath" "ldflags=${ldflags}" \
    "module=$(module_hash "${dir}")")"

  if [[ -x "${out}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
    echo "${tool} ${version} up to date"
    return 0
  fi

  echo "building ${tool} ${version} ..."
  local start=${SECONDS}
  rm -f "${stamp_file}"
  (cd "${dir}" && go build -trimpath -ldflags "${ldflags}" -o "${out}.tmp" "${pkg}")
  mv -f "${out}.tmp" "${out}"
  printf '%s\n' "${stamp}" >"${stamp_file}"
  echo "built ${tool} in $((SECONDS - start)) s"
}

# Build date of a pinned module = its release time on the proxy, so that the
# stamped version info is reproducible (not the wall clock of this build).
module_time() {
  (cd "$1" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "$2")
}

opa_version=v1.22.2
etcd_version=v3.6.16
k8s_version=v1.34.4
promtool_version=v0.315.0

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

build_kube_apiserver() {
  build kube-apiserver "${k8s_version}" "${go_dir}/kubernetes" \
    k8s.io/kubernetes/cmd/kube-apiserver "$(k8s_ldflags)"
}

build_kube_scheduler() {
  build kube-scheduler "${k8s_version}" "${go_dir}/kubernetes" \
    k8s.io/kubernetes/cmd/kube-scheduler "$(k8s_ldflags)"
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

tools=("$@")
if [[ ${#tools[@]} -eq 0 ]]; then
  tools=(opa etcd kube-apiserver kube-scheduler promtool promql-metrics)
fi

for tool in "${tools[@]}"; do
  case "${tool}" in
    opa) build_opa ;;
    etcd) build_etcd ;;
    kube-apiserver) build_kube_apiserver ;;
    kube-scheduler) build_kube_scheduler ;;
    promtool) build_promtool ;;
    promql-metrics) build_promql_metrics ;;
    *) echo "unknown tool: ${tool} (known: opa etcd kube-apiserver kube-scheduler promtool promql-metrics)" >&2; exit 2 ;;
  esac
done
echo "tools in ${bin_dir}"
