#!/usr/bin/env bash
# Build the fragmentation-aware scheduler image (scheduler/, scheduler/.ko.yaml) with ko into
# an OCI archive, with no registry and no Docker daemon (`make scheduler-image`):
#
#   .tools/images/gpu-binpack-scheduler-<Kubernetes version>.tar      the OCI archive
#   .tools/images/gpu-binpack-scheduler-<Kubernetes version>.digest   the image's digest
#
# (or in $GPU_CLUSTER_IMAGES_DIR). ko, crane and ko-base are built first as pinned tools
# (tools/build-tools.sh ko crane ko-base). ko reads its base image from a registry, so ko-base
# builds a minimal one (user 65532 "nonroot", /etc/passwd, /etc/group, nothing else) and serves
# it on 127.0.0.1 while ko runs. Every timestamp is fixed (ko's default, or SOURCE_DATE_EPOCH),
# so two builds of the same sources give the same digest. The image is rebuilt only when its
# stamp (the scheduler's sources, .ko.yaml, the tools, Go, the platforms) changed.
#
# SCHEDULER_IMAGE_PLATFORMS: ko's --platform, default linux/<this machine's GOARCH>; with more
# than one the archive holds an image index.
#
# Push the archive to a registry (docs/scheduler.md, "The image"):
#   skopeo copy oci-archive:<archive> docker://<registry>/<repo>:<tag>
#   or: tar -xf <archive> -C <dir> && crane push <dir> <registry>/<repo>:<tag>
set -euo pipefail

here="$(dirname "${BASH_SOURCE[0]}")"
if ! command -v go >/dev/null 2>&1; then
  echo "error: building the scheduler image needs Go >= 1.26 (ko compiles the scheduler with it)" >&2
  exit 1
fi
bash "${here}/build-tools.sh" ko crane ko-base

# shellcheck source=tools/build-lib.sh
source "${here}/build-lib.sh"

scheduler_dir="${repo_root}/scheduler"
out_dir="${GPU_CLUSTER_IMAGES_DIR:-${repo_root}/.tools/images}"
platforms="${SCHEDULER_IMAGE_PLATFORMS:-linux/$(go env GOARCH)}"
k8s_version="$(cd "${scheduler_dir}" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
out="${out_dir}/gpu-binpack-scheduler-${k8s_version}.tar"
digest_file="${out_dir}/gpu-binpack-scheduler-${k8s_version}.digest"
stamp_file="${out_dir}/.gpu-binpack-scheduler-${k8s_version}.tar.stamp"
mkdir -p "${out_dir}"

stamp="$(printf '%s\n' \
  "kubernetes=${k8s_version}" "platforms=${platforms}" "go=${go_version}" \
  "source-date-epoch=${SOURCE_DATE_EPOCH:-}" \
  "scheduler=$(module_hash "${scheduler_dir}")" \
  "ko.yaml=$(sha256sum <"${scheduler_dir}/.ko.yaml" | cut -d' ' -f1)" \
  "script=$(sha256sum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)" \
  "ko=$(sha256sum <"${bin_dir}/.ko.stamp" | cut -d' ' -f1)" \
  "ko-base=$(sha256sum <"${bin_dir}/.ko-base.stamp" | cut -d' ' -f1)")"

if up_to_date "${out}" "${stamp_file}" "${stamp}" && [[ -f "${digest_file}" ]]; then
  echo "gpu-binpack-scheduler image ${k8s_version} up to date: ${out}"
  echo "digest $(cat "${digest_file}")"
  exit 0
fi

echo "building the gpu-binpack-scheduler image ${k8s_version} (${platforms}) with ko ..."
start=${SECONDS}
rm -f "${stamp_file}" "${digest_file}"
# ko names its OCI layout output by its path, which must be a valid lower-case repository name:
# a folder under the git-ignored .tools, passed relative to scheduler/.
work_name=".tools/image-build.$$"
work="${repo_root}/${work_name}"
rm -rf "${work}"
mkdir -p "${work}"
trap 'rm -rf "${work}"' EXIT
# --push=false: the image goes only to the OCI layout. No SBOM: ko attaches it only when it
# pushes. KO_DOCKER_REPO only names the image inside ko; nothing is pushed there.
(
  cd "${scheduler_dir}"
  K8S_VERSION="${k8s_version}" KO_DOCKER_REPO=gpu-cluster.invalid/gpu-binpack-scheduler \
    nice -n 10 "${bin_dir}/ko-base" run -- "${bin_dir}/ko" build ./cmd/kube-scheduler \
    --bare --push=false --sbom=none --platform "${platforms}" --oci-layout-path "../${work_name}/layout"
) >"${work}/ko.out"
digest="$("${bin_dir}/ko-base" archive "${work}/layout" "${out}" "${k8s_version}")"
printf '%s\n' "${digest}" >"${digest_file}"
printf '%s\n' "${stamp}" >"${stamp_file}"
echo "built the gpu-binpack-scheduler image in $((SECONDS - start)) s: ${out} ($(du -h "${out}" | cut -f1))"
echo "digest ${digest}"
