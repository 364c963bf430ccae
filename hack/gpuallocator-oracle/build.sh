#!/usr/bin/env bash
# Build the go-gpuallocator oracle (main.go here) that the conformance test compares gangslice's
# device-plugin prediction with: NVIDIA's best-effort policy, at the version pinned in go.mod.
#
# Usage: hack/gpuallocator-oracle/build.sh
#
# Output goes to a cache folder outside the repository, keyed by the pinned version:
#   ${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/gpuallocator-oracle/<version>/bin/gpuallocator-oracle
# It is rebuilt only when it is missing or its stamp (go.mod/go.sum/main.go hash, Go version) changed.
# The last line printed on stdout is
#   GANGSLICE_GPUALLOCATOR_ORACLE=<binary>
# Progress goes to stderr.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
STEP="startup"
log() { printf '%s [gpuallocator-oracle] %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
trap 'rc=$?; log "FAILED at step: ${STEP} (exit ${rc})"; exit ${rc}' ERR

STEP="check go toolchain"
GO_MIN_MINOR=23
if ! command -v go >/dev/null 2>&1; then
    die "'go' is not on PATH. The go-gpuallocator conformance test compiles NVIDIA's allocator from the Go module proxy and needs Go >= 1.${GO_MIN_MINOR}: install it from https://go.dev/dl/ (e.g. a linux-amd64 tarball into /usr/local/go and add /usr/local/go/bin to PATH), then rerun."
fi
GO_VERSION="$(GOTOOLCHAIN=local go env GOVERSION)"
go_minor="$(sed -E 's/^go1\.([0-9]+).*/\1/' <<<"${GO_VERSION}")"
if ! [[ "${go_minor}" =~ ^[0-9]+$ ]] || (( go_minor < GO_MIN_MINOR )); then
    die "found ${GO_VERSION} at $(command -v go); Go >= 1.${GO_MIN_MINOR} is required. Install a newer Go from https://go.dev/dl/."
fi

VERSION="$(sed -n -E 's/^(require)?[[:space:]]*github\.com\/NVIDIA\/go-gpuallocator (v[^ ]+).*/\2/p' "${SCRIPT_DIR}/go.mod")"
[[ -n "${VERSION}" ]] || die "go.mod in ${SCRIPT_DIR} does not require github.com/NVIDIA/go-gpuallocator"

CACHE_ROOT="${GANGSLICE_CACHE:-$HOME/.cache/gangslice}"
OUT_DIR="${CACHE_ROOT}/gpuallocator-oracle/go-gpuallocator-${VERSION}"
BIN="${OUT_DIR}/bin/gpuallocator-oracle"
mkdir -p "${OUT_DIR}/bin"

export GOCACHE="${CACHE_ROOT}/go/build"
export GOMODCACHE="${CACHE_ROOT}/go/mod"
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
# go-nvml's bindings are cgo (they dlopen libnvidia-ml at run time, which the oracle never calls).
export CGO_ENABLED=1
STEP="check C compiler"
CC_BIN="$(go env CC)"
command -v "${CC_BIN%% *}" >/dev/null 2>&1 || die "no C compiler '${CC_BIN}' on PATH: go-nvml, which go-gpuallocator imports, is built with cgo. Install one (Debian/Ubuntu: apt-get install gcc), then rerun."
export GOTOOLCHAIN=local
export GOWORK=off

if command -v flock >/dev/null 2>&1; then
    exec 9>"${OUT_DIR}/.lock"
    flock 9
fi

stamp="go-gpuallocator@${VERSION} go=${GO_VERSION} src=$(cat "${SCRIPT_DIR}/go.mod" "${SCRIPT_DIR}/go.sum" "${SCRIPT_DIR}/main.go" | sha256sum | cut -c1-16)"
if [[ -x "${BIN}" && -f "${OUT_DIR}/.stamp" && "$(cat "${OUT_DIR}/.stamp")" == "${stamp}" ]]; then
    log "up to date (${stamp})"
else
    STEP="download modules"
    if ! (cd "${SCRIPT_DIR}" && go mod download); then
        die "go mod download failed (go's error is above) with GOPROXY=$(go env GOPROXY): the proxy must be reachable and serve github.com/NVIDIA/go-gpuallocator@${VERSION}; otherwise set GOPROXY to one that does."
    fi
    STEP="go build"
    log "building against github.com/NVIDIA/go-gpuallocator@${VERSION}"
    rm -f "${OUT_DIR}/.stamp"
    (cd "${SCRIPT_DIR}" && nice -n 10 go build -o "${BIN}.tmp" .)
    mv -f "${BIN}.tmp" "${BIN}"
    printf '%s\n' "${stamp}" >"${OUT_DIR}/.stamp"
    log "built ${BIN}"
fi
STEP="finish"
echo "GANGSLICE_GPUALLOCATOR_ORACLE=${BIN}"
