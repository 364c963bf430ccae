#!/usr/bin/env bash
# Build the upstream binaries used by the end-to-end tier (etcd, kube-apiserver, kube-scheduler, kubectl,
# kube-controller-manager, Kueue's manager, Volcano's scheduler, helm) from the pinned Go tools modules under hack/e2e/tools/.
#
# Usage: hack/e2e/build.sh [COMPONENT...]      (default: all of them)
#   COMPONENT is one of: etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kueue vc-scheduler helm
#
# Output goes to a cache folder outside the repository, keyed by the pinned versions:
#   ${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/e2e/<versions-key>/bin/<component>
# A binary is rebuilt only when it is missing or its stamp (versions, go.mod/go.sum hash, Go version)
# changed, so a second run builds nothing. The last line printed on stdout is
#   GANGSLICE_E2E_BIN=<bin dir>
# Progress goes to stderr. Environment knobs: GANGSLICE_CACHE, GANGSLICE_E2E_JOBS (go build -p, default 2),
# GANGSLICE_E2E_NICE (default 10).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS_DIR="${SCRIPT_DIR}/tools"
# shellcheck source=tools/versions.env
source "${TOOLS_DIR}/versions.env"

STEP="startup"
log() { printf '%s [e2e-build] %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
trap 'rc=$?; log "FAILED at step: ${STEP} (exit ${rc})"; exit ${rc}' ERR

ALL_COMPONENTS=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kueue vc-scheduler helm)
COMPONENTS=("$@")
[[ ${#COMPONENTS[@]} -gt 0 ]] || COMPONENTS=("${ALL_COMPONENTS[@]}")

# --- Go toolchain -----------------------------------------------------------------------------------------
STEP="check go toolchain"
GO_MIN_MINOR=26
if ! command -v go >/dev/null 2>&1; then
    die "'go' is not on PATH. The e2e tier compiles etcd/kube-apiserver/kube-scheduler/Kueue/Volcano from source and needs Go >= 1.${GO_MIN_MINOR}: install it from https://go.dev/dl/ (e.g. go1.26.x linux-amd64 tarball into /usr/local/go and add /usr/local/go/bin to PATH), then rerun."
fi
GO_VERSION="$(GOTOOLCHAIN=local go env GOVERSION)"   # e.g. go1.26.8
go_minor="$(sed -E 's/^go1\.([0-9]+).*/\1/' <<<"${GO_VERSION}")"
if ! [[ "${go_minor}" =~ ^[0-9]+$ ]] || (( go_minor < GO_MIN_MINOR )); then
    die "found ${GO_VERSION} at $(command -v go); Go >= 1.${GO_MIN_MINOR} is required (Kueue ${KUEUE_VERSION} declares go 1.26.0). Install a newer Go from https://go.dev/dl/."
fi

# --- Cache layout -----------------------------------------------------------------------------------------
CACHE_ROOT="${GANGSLICE_CACHE:-$HOME/.cache/gangslice}"
KEY="k8s-${KUBERNETES_VERSION}_kueue-${KUEUE_VERSION}_volcano-${VOLCANO_VERSION}_etcd-${ETCD_VERSION}"
OUT_DIR="${CACHE_ROOT}/e2e/${KEY}"
BIN_DIR="${OUT_DIR}/bin"
mkdir -p "${BIN_DIR}"

export GOCACHE="${CACHE_ROOT}/go/build"
export GOMODCACHE="${CACHE_ROOT}/go/mod"
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
export GOWORK=off
JOBS="${GANGSLICE_E2E_JOBS:-2}"
NICE="${GANGSLICE_E2E_NICE:-10}"

# Serialize concurrent runs on the same cache (e.g. two pytest sessions).
if command -v flock >/dev/null 2>&1; then
    exec 9>"${OUT_DIR}/.lock"
    if ! flock -n 9; then
        log "another build holds ${OUT_DIR}/.lock; waiting"
        flock 9
    fi
fi

# --- Components -------------------------------------------------------------------------------------------
# component -> "<tools module dir>|<main package>|<version>|<extra -X ldflags>"
k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
K8S_X="-X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor} -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"
# helm's default Kubernetes version for `helm template` and `helm lint` (its Makefile sets it the same way:
# the minor version of the k8s.io/client-go it is built with).
helm_k8s_minor="$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "${TOOLS_DIR}/helm/go.mod")"
HELM_X="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
for pkg in pkg/lint/rules pkg/chartutil; do
    HELM_X+=" -X helm.sh/helm/v3/${pkg}.k8sVersionMajor=1 -X helm.sh/helm/v3/${pkg}.k8sVersionMinor=${helm_k8s_minor}"
done
spec_of() {
    case "$1" in
        etcd)           echo "etcd|go.etcd.io/etcd/server/v3|${ETCD_VERSION}|" ;;
        kube-apiserver) echo "kubernetes|k8s.io/kubernetes/cmd/kube-apiserver|${KUBERNETES_VERSION}|${K8S_X}" ;;
        kube-scheduler) echo "kubernetes|k8s.io/kubernetes/cmd/kube-scheduler|${KUBERNETES_VERSION}|${K8S_X}" ;;
        kube-controller-manager) echo "kube-controller-manager|k8s.io/kubernetes/cmd/kube-controller-manager|${KUBERNETES_VERSION}|${K8S_X}" ;;
        kubectl)        echo "kubernetes|k8s.io/kubernetes/cmd/kubectl|${KUBERNETES_VERSION}|${K8S_X}" ;;
        kueue)          echo "kueue|sigs.k8s.io/kueue/cmd/kueue|${KUEUE_VERSION}|-X sigs.k8s.io/kueue/pkg/version.GitVersion=${KUEUE_VERSION}" ;;
        vc-scheduler)   echo "volcano|volcano.sh/volcano/cmd/scheduler|${VOLCANO_VERSION}|-X volcano.sh/volcano/pkg/version.Version=${VOLCANO_VERSION}" ;;
        helm)           echo "helm|helm.sh/helm/v3/cmd/helm|${HELM_VERSION}|${HELM_X}" ;;
        *) return 1 ;;
    esac
}

hash_files() { cat "$@" | sha256sum | cut -c1-16; }

# A module download that fails is nearly always the module proxy: name the GOPROXY in use and what to check.
mod_download_failed() { # <tools module dir>
    local proxy first check
    proxy="$(go env GOPROXY)"
    first="${proxy%%[,|]*}"
    case "${first}" in
        off) check="GOPROXY=off forbids downloads and ${GOMODCACHE} lacks a module: set GOPROXY to a proxy this machine can reach" ;;
        direct) check="'direct' fetches from each module's origin (github.com, go.googlesource.com, ...): they must be reachable, or set GOPROXY to a proxy this machine can reach" ;;
        *) check="the proxy ${first} must be reachable from this machine (try: curl -sSI ${first}/k8s.io/kubernetes/@v/${KUBERNETES_VERSION}.info) and serve the versions pinned in hack/e2e/tools/versions.env; otherwise set GOPROXY to one that is" ;;
    esac
    die "go mod download failed in hack/e2e/tools/$1 (go's error is above) with GOPROXY=${proxy}. Check: ${check}. Modules already in ${GOMODCACHE} are not downloaded again."
}

log "Go ${GO_VERSION}; cache ${CACHE_ROOT}; output ${BIN_DIR}"
total_start=$(date +%s)
built=0
for comp in "${COMPONENTS[@]}"; do
    STEP="resolve component '${comp}'"
    spec="$(spec_of "${comp}")" || die "unknown component '${comp}' (known: ${ALL_COMPONENTS[*]})"
    IFS='|' read -r moddir pkg version xflags <<<"${spec}"
    mod="${TOOLS_DIR}/${moddir}"
    [[ -f "${mod}/go.mod" && -f "${mod}/go.sum" ]] || die "missing ${mod}/go.mod or go.sum (run hack/e2e/tools/pin.sh)"
    stamp_file="${BIN_DIR}/.${comp}.stamp"
    stamp="${comp} ${pkg}@${version} go=${GO_VERSION} mod=$(hash_files "${mod}/go.mod" "${mod}/go.sum") ldflags=$(sha256sum <<<"${xflags}" | cut -c1-8)"
    if [[ -x "${BIN_DIR}/${comp}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
        log "${comp}: up to date (${pkg}@${version})"
        continue
    fi
    STEP="download modules for ${comp} (${moddir})"
    log "${comp}: downloading modules of hack/e2e/tools/${moddir}"
    (cd "${mod}" && go mod download) || mod_download_failed "${moddir}"
    STEP="go build ${comp} (${pkg}@${version})"
    log "${comp}: building ${pkg}@${version} (nice ${NICE}, -p ${JOBS})"
    start=$(date +%s)
    rm -f "${stamp_file}"
    (cd "${mod}" && nice -n "${NICE}" go build -p "${JOBS}" -ldflags="-s -w ${xflags}" \
        -o "${BIN_DIR}/.${comp}.tmp" "${pkg}")
    mv -f "${BIN_DIR}/.${comp}.tmp" "${BIN_DIR}/${comp}"
    printf '%s\n' "${stamp}" >"${stamp_file}"
    secs=$(( $(date +%s) - start ))
    printf '%s %s %ss %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "${comp}" "${secs}" "${stamp}" >>"${OUT_DIR}/build-times.log"
    log "${comp}: built in ${secs}s -> ${BIN_DIR}/${comp}"
    built=$((built + 1))
done

# --- CRDs of the pinned Kueue/Volcano releases (complete sets; the managers need all of them) --------------
# -> <versions-key>/crds/kueue/*.yaml   (config/components/crd/bases of sigs.k8s.io/kueue)
# -> <versions-key>/crds/volcano/*.yaml (config/crd/volcano/bases of volcano.sh/volcano; vc-scheduler waits
#    for every informer, including nodeinfo.volcano.sh Numatopology, before it opens a session)
export_crds() { # name moddir module@version subdir
    local name="$1" moddir="$2" modver="$3" sub="$4" dest="${OUT_DIR}/crds/$1" dir
    local stamp="${modver} ${sub}"
    if [[ -f "${dest}/.stamp" && "$(cat "${dest}/.stamp")" == "${stamp}" ]]; then
        log "crds/${name}: up to date (${modver})"
        return 0
    fi
    STEP="export CRDs of ${modver}"
    local json
    if ! json="$(cd "${TOOLS_DIR}/${moddir}" && go mod download -json "${modver}")"; then
        printf '%s\n' "${json}" >&2   # go reports the error inside its JSON
        mod_download_failed "${moddir}"
    fi
    dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"${json}")"
    [[ -d "${dir}/${sub}" ]] || die "no ${sub} in ${modver} (module dir '${dir}')"
    rm -rf "${dest}"
    mkdir -p "${dest}"
    install -m 0644 "${dir}/${sub}"/*.yaml "${dest}/"
    printf '%s\n' "${stamp}" >"${dest}/.stamp"
    log "crds/${name}: $(find "${dest}" -name '*.yaml' | wc -l) files from ${modver}/${sub}"
}
for comp in "${COMPONENTS[@]}"; do
    case "${comp}" in
        kueue) export_crds kueue kueue "sigs.k8s.io/kueue@${KUEUE_VERSION}" config/components/crd/bases ;;
        vc-scheduler) export_crds volcano volcano "volcano.sh/volcano@${VOLCANO_VERSION}" config/crd/volcano/bases ;;
    esac
done

STEP="finish"
log "done: ${built} built, total $(( $(date +%s) - total_start ))s"
echo "GANGSLICE_E2E_BIN=${BIN_DIR}"
