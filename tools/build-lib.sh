# Shared by tools/build-tools.sh and tools/build-pulumi.sh (sourced, not run):
# the Go environment, the output folder and `build`, which rebuilds a tool only
# when its stamp changed.
# shellcheck shell=bash

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

# up_to_date <output> <stamp file> <stamp>: the output exists and was built from this stamp.
up_to_date() {
  local out="$1" stamp_file="$2" stamp="$3"
  [[ -f "${out}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]
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

  if up_to_date "${out}" "${stamp_file}" "${stamp}"; then
    echo "${tool} ${version} up to date"
    return 0
  fi

  echo "building ${tool} ${version} ..."
  local start=${SECONDS}
  rm -f "${stamp_file}"
  (cd "${dir}" && nice -n 10 go build -trimpath -ldflags "${ldflags}" -o "${out}.tmp" "${pkg}")
  mv -f "${out}.tmp" "${out}"
  printf '%s\n' "${stamp}" >"${stamp_file}"
  echo "built ${tool} in $((SECONDS - start)) s"
}


# module_dir <module dir> <module path>: where the pinned module's zip is unpacked (downloaded
# and checked against the wrapper's go.sum if needed).
module_dir() {
  (cd "$1" && go mod download -json "$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
}

# install_concat <output name> <version> <file>...: the files, joined as one multi-document
# YAML in the output folder; reinstalled only when their content changed.
install_concat() {
  local name="$1" version="$2"
  shift 2
  local out="${bin_dir}/${name}" stamp_file="${bin_dir}/.${name}.stamp" stamp
  stamp="$(printf '%s\n' "file=${name}" "version=${version}" "sha256=$(cat "$@" | sha256sum | cut -d' ' -f1)")"
  if up_to_date "${out}" "${stamp_file}" "${stamp}"; then
    echo "${name} ${version} up to date"
    return 0
  fi
  rm -f "${stamp_file}"
  local file
  for file in "$@"; do
    printf -- '---\n'
    cat "${file}"
  done >"${out}.tmp"
  chmod 0644 "${out}.tmp"
  mv -f "${out}.tmp" "${out}"
  printf '%s\n' "${stamp}" >"${stamp_file}"
  echo "installed ${name} ${version}"
}
