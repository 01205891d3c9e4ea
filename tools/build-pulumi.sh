#!/usr/bin/env bash
# Build the Pulumi CLI and the plugins the stack runs with, from pinned modules
# fetched through the Go module proxy (same conventions as build-tools.sh):
#
#   pulumi                          github.com/pulumi/pulumi/pkg/v3/cmd/pulumi  v3.274.1  (tools/go/pulumi)
#   pulumi-language-python-exec     sdk/v3 python/cmd/ script                   v3.272.0  (tools/go/pulumi-python)
#   pulumi-resource-pulumi-python   sdk/v3 python/dist/ launcher                v3.272.0  (tools/go/pulumi-python)
#   pulumi-resource-kubernetes      github.com/pulumi/pulumi-kubernetes/provider/v4 at its one
#                                   served pseudo-version, labelled 4.25.0      (tools/go/pulumi-kubernetes)
#
# requirements.txt pins pulumi 3.272.0, pulumi-kubernetes 4.25.0, pulumi-command 1.2.1 and
# pulumi-tls 5.6.2. The module proxy refuses ("403 Forbidden: This module version is not
# available") the modules below, so they are not built; asking for one fails with that
# reason (tools/plugins/bin has stand-ins for the two providers, tools/README.md):
#
#   pulumi-language-python      github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 (any version)
#   pulumi-resource-command     github.com/pulumi/pulumi-command/provider (any version or commit)
#   pulumi-resource-tls         github.com/pulumi/pulumi-tls/provider/v5 (any version)
#
# Binaries go to <repo>/.tools/bin (git-ignored), or to $GPU_CLUSTER_TOOLS_BIN.
# A tool is rebuilt only when its stamp (.tools/bin/.<tool>.stamp) changes or
# the output is missing, so a second run is a no-op.
#
# Usage: tools/build-pulumi.sh [tool...]   (default: the four above)
set -euo pipefail

# shellcheck source=tools/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

# Pulumi CLI release built (newer than the SDK of requirements.txt, which the engine accepts).
pulumi_cli_version=v3.274.1
# Pulumi Python SDK release whose scripts are installed (= requirements.txt).
pulumi_python_version=v3.272.0

# install_script <tool> <version> <module dir> <module path> <file in module>
# Copies a script shipped in a pinned module's zip (checked against go.sum).
install_script() {
  local tool="$1" version="$2" dir="$3" module="$4" file="$5"
  local out="${bin_dir}/${tool}" stamp_file="${bin_dir}/.${tool}.stamp"
  local start=${SECONDS} mod_dir src stamp
  mod_dir="$(module_dir "${dir}" "${module}")"
  src="${mod_dir}/${file}"
  if [[ ! -f "${src}" ]]; then
    echo "error: ${tool}: ${file} not found in ${module} (${mod_dir})" >&2
    exit 1
  fi
  stamp="$(printf '%s\n' "tool=${tool}" "version=${version}" "module=${module}" \
    "file=${file}" "sha256=$(sha256sum "${src}" | cut -d' ' -f1)")"

  if up_to_date "${out}" "${stamp_file}" "${stamp}"; then
    echo "${tool} ${version} up to date"
    return 0
  fi
  echo "installing ${tool} ${version} ..."
  rm -f "${stamp_file}"
  install -m 0755 "${src}" "${out}"
  printf '%s\n' "${stamp}" >"${stamp_file}"
  echo "installed ${tool} in $((SECONDS - start)) s"
}

# The kubernetes provider: the module is served at one pseudo-version (a commit of 2026-01-15),
# whose schema is the one the pulumi-kubernetes 4.24.0-4.25.0 SDKs were generated from; 4.25.0
# is the newest of them (tools/README.md). The label is the plugin's version, which the engine
# compares with the SDK's in requirements.txt.
kubernetes_provider_module=github.com/pulumi/pulumi-kubernetes/provider/v4
kubernetes_provider_version=4.25.0

# Copies the schema (its version set to the release) and the Terraform mapping from the
# provider module's zip (checked against go.sum) into the wrapper's main package, which embeds
# them. They are build inputs only: git-ignored, rewritten on every build.
stage_kubernetes_schema() {
  local mod_dir main_dir="${go_dir}/pulumi-kubernetes/cmd/pulumi-resource-kubernetes"
  mod_dir="$(module_dir "${go_dir}/pulumi-kubernetes" "${kubernetes_provider_module}")"
  python3 - "${mod_dir}/cmd/pulumi-resource-kubernetes" "${main_dir}" "${kubernetes_provider_version}" <<'PY'
import json, pathlib, sys
source, target, version = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), sys.argv[3]
schema = json.loads((source / "schema.json").read_text())
schema["version"] = version
(target / "schema.json").write_text(json.dumps(schema, separators=(",", ":")))
mapping = json.loads((source / "terraform-mapping.json").read_text())
(target / "terraform-mapping.json").write_text(json.dumps(mapping, separators=(",", ":")))
PY
}

build_kubernetes_provider() {
  stage_kubernetes_schema
  build pulumi-resource-kubernetes "v${kubernetes_provider_version}" "${go_dir}/pulumi-kubernetes" \
    ./cmd/pulumi-resource-kubernetes \
    "-s -w -X ${kubernetes_provider_module}/pkg/version.Version=${kubernetes_provider_version}"
}

build_pulumi() {
  build pulumi "${pulumi_cli_version}" "${go_dir}/pulumi" \
    github.com/pulumi/pulumi/pkg/v3/cmd/pulumi \
    "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=${pulumi_cli_version}"
}

install_language_python_exec() {
  install_script pulumi-language-python-exec "${pulumi_python_version}" "${go_dir}/pulumi-python" \
    github.com/pulumi/pulumi/sdk/v3 python/cmd/pulumi-language-python-exec
}

install_resource_pulumi_python() {
  install_script pulumi-resource-pulumi-python "${pulumi_python_version}" "${go_dir}/pulumi-python" \
    github.com/pulumi/pulumi/sdk/v3 python/dist/pulumi-resource-pulumi-python
}

unavailable() {
  echo "error: $1 cannot be built here: the Go module proxy answers" \
    "'403 Forbidden: This module version is not available' for $2" \
    "(see tools/README.md, 'Pulumi CLI and plugins')" >&2
  exit 3
}

tools=("$@")
if [[ ${#tools[@]} -eq 0 ]]; then
  tools=(pulumi pulumi-language-python-exec pulumi-resource-pulumi-python pulumi-resource-kubernetes)
fi

for tool in "${tools[@]}"; do
  case "${tool}" in
    pulumi) build_pulumi ;;
    pulumi-language-python-exec) install_language_python_exec ;;
    pulumi-resource-pulumi-python) install_resource_pulumi_python ;;
    pulumi-language-python)
      unavailable "${tool}" "github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3 (every version and commit)" ;;
    pulumi-resource-kubernetes) build_kubernetes_provider ;;
    pulumi-resource-command)
      unavailable "${tool}" "github.com/pulumi/pulumi-command/provider (every version and commit)" ;;
    pulumi-resource-tls)
      unavailable "${tool}" "github.com/pulumi/pulumi-tls/provider/v5 (every version, v5.6.2 included)" ;;
    *)
      echo "unknown tool: ${tool} (known: pulumi pulumi-language-python-exec pulumi-resource-pulumi-python pulumi-resource-kubernetes)" >&2
      exit 2 ;;
  esac
done
echo "pulumi tools in ${bin_dir}"
