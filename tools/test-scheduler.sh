#!/usr/bin/env bash
# Unit tests of the GpuFragmentation plugin (scheduler/, a Go module of the product), in the
# tools' Go environment (module proxy, checksums, go.mod/go.sum as committed): gofmt, go test.
set -euo pipefail

# shellcheck source=tools/build-lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/build-lib.sh"

cd "${repo_root}/scheduler"
echo "==> gofmt (scheduler/)"
unformatted="$(gofmt -l .)"
if [[ -n "${unformatted}" ]]; then
  echo "not gofmt-formatted (run: gofmt -w scheduler):" >&2
  echo "${unformatted}" >&2
  exit 1
fi
echo "==> go test (scheduler/)"
# -trimpath, as the tools build: the compiled Kubernetes packages are reused from that build.
nice -n 10 go test -trimpath ./...
