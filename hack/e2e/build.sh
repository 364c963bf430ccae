#!/usr/bin/env bash
# Build the upstream binaries used by the end-to-end tier (etcd, kube-apiserver, kube-scheduler, kubectl,
# kube-controller-manager, Kueue's manager, Volcano's scheduler, the LeaderWorkerSet and JobSet controllers,
# helm) from the pinned Go tools modules under hack/e2e/tools/.
#
# Usage: hack/e2e/build.sh [COMPONENT...]      (default: all of them)
#   COMPONENT is one of: etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kueue vc-scheduler
#                        lws jobset helm, and the real node's kubelet containerd ctr containerd-shim-runc-v2 runc
#                        bridge host-local loopback (CNI plugins) pause (the pods' sandbox process, tools/pause)
#
# Output goes to a cache folder outside the repository, keyed by the pinned versions:
#   ${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/e2e/<versions-key>/bin/<component>
# lws and jobset are built under a key of their own, <controllers-key> (lws-<v>_jobset-<v>), so pinning or
# bumping them leaves the binaries under <versions-key> valid; <versions-key>/bin/{lws,jobset} and
# <versions-key>/{crds,webhooks}/{lws,jobset} are symbolic links into <controllers-key>, so one bin dir
# (and the crds/ beside it) still holds everything. The real node's binaries (kubelet, containerd, ctr,
# containerd-shim-runc-v2, runc, and the CNI plugins bridge, host-local and loopback) are built under
# <node-key> (node-<k8s>_containerd-<v>_runc-<v>_cni-<v>) and linked into <versions-key>/bin the same way.
# runc is the one cgo build: it links libseccomp (libseccomp-dev, installed with apt-get when missing) and
# needs a C compiler.
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
# shellcheck source=../lib/debian.sh
source "${SCRIPT_DIR}/../lib/debian.sh"

STEP="startup"
log() { printf '%s [e2e-build] %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
trap 'rc=$?; log "FAILED at step: ${STEP} (exit ${rc})"; exit ${rc}' ERR

NODE_COMPONENTS=(kubelet containerd ctr containerd-shim-runc-v2 runc bridge host-local loopback pause)
# is_node_component COMP: whether COMP is one of the real node's binaries (built under <node-key>).
is_node_component() { [[ " ${NODE_COMPONENTS[*]} " == *" $1 "* ]]; }
ALL_COMPONENTS=(etcd kube-apiserver kube-scheduler kube-controller-manager kubectl kueue vc-scheduler lws jobset helm
                "${NODE_COMPONENTS[@]}")
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
# The LeaderWorkerSet and JobSet controllers: a key of their own (they share no tools module with the rest),
# so adding or bumping them never changes <versions-key> and never invalidates the kube-* binaries under it.
CTRL_KEY="lws-${LWS_VERSION}_jobset-${JOBSET_VERSION}"
CTRL_DIR="${CACHE_ROOT}/e2e/${CTRL_KEY}"
NODE_KEY="node-${KUBERNETES_VERSION}_containerd-${CONTAINERD_VERSION}_runc-${RUNC_VERSION}_cni-${CNI_PLUGINS_VERSION}"
NODE_DIR="${CACHE_ROOT}/e2e/${NODE_KEY}"

export GOCACHE="${CACHE_ROOT}/go/build"
export GOMODCACHE="${CACHE_ROOT}/go/mod"
export GOFLAGS="-trimpath -mod=readonly -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local
export GOWORK=off
JOBS="${GANGSLICE_E2E_JOBS:-2}"
NICE="${GANGSLICE_E2E_NICE:-10}"

# Serialize concurrent runs on the same cache (e.g. two pytest sessions): a run locks <versions-key> when it
# builds anything there and <controllers-key> when it builds lws or jobset, always in that order, so a run
# that builds only lws/jobset never makes a test session that checks the kube-* binaries wait for it (and a
# checkout with another <versions-key> may share <controllers-key>).
lock_dir() { # fd dir
    command -v flock >/dev/null 2>&1 || return 0
    eval "exec $1>\"$2/.lock\""
    if ! flock -n "$1"; then
        log "another build holds $2/.lock; waiting"
        flock "$1"
    fi
}
needs_out=0
needs_ctrl=0
needs_node=0
for comp in "${COMPONENTS[@]}"; do
    if [[ "${comp}" == lws || "${comp}" == jobset ]]; then needs_ctrl=1
    elif is_node_component "${comp}"; then needs_node=1
    else needs_out=1
    fi
done
if (( needs_out )); then lock_dir 9 "${OUT_DIR}"; fi
if (( needs_ctrl )); then mkdir -p "${CTRL_DIR}/bin" && lock_dir 8 "${CTRL_DIR}"; fi
if (( needs_node )); then mkdir -p "${NODE_DIR}/bin" && lock_dir 7 "${NODE_DIR}"; fi

# --- Components -------------------------------------------------------------------------------------------
# component -> "<tools module dir>|<main package>|<version>|<extra -X ldflags>"
k8s_minor="${KUBERNETES_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
K8S_X="-X k8s.io/component-base/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${k8s_minor} -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/client-go/pkg/version.gitVersion=${KUBERNETES_VERSION} -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=${k8s_minor}"
# helm's default Kubernetes version for `helm template` and `helm lint` (its Makefile sets it the same way:
# the minor version of the k8s.io/client-go it is built with).
helm_k8s_minor="$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "${TOOLS_DIR}/helm/go.mod")"
HELM_X="-X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}"
CONTAINERD_X="-X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}"
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
        lws)            echo "lws|sigs.k8s.io/lws/cmd|${LWS_VERSION}|-X sigs.k8s.io/lws/pkg/version.GitVersion=${LWS_VERSION}" ;;
        jobset)         echo "jobset|sigs.k8s.io/jobset|${JOBSET_VERSION}|-X sigs.k8s.io/jobset/pkg/version.GitVersion=${JOBSET_VERSION}" ;;
        helm)           echo "helm|helm.sh/helm/v3/cmd/helm|${HELM_VERSION}|${HELM_X}" ;;
        kubelet)        echo "kubelet|k8s.io/kubernetes/cmd/kubelet|${KUBERNETES_VERSION}|${K8S_X}" ;;
        containerd|ctr|containerd-shim-runc-v2)
                        echo "containerd|github.com/containerd/containerd/v2/cmd/$1|${CONTAINERD_VERSION}|${CONTAINERD_X}" ;;
        bridge|loopback) echo "cni|github.com/containernetworking/plugins/plugins/main/$1|${CNI_PLUGINS_VERSION}|" ;;
        host-local)     echo "cni|github.com/containernetworking/plugins/plugins/ipam/$1|${CNI_PLUGINS_VERSION}|" ;;
        pause)          echo "pause|gangslice/hack/e2e/tools/pause|${KUBERNETES_VERSION}|" ;;
        runc)           echo "runc|github.com/opencontainers/runc|${RUNC_VERSION}|-X main.version=${RUNC_VERSION#v}" ;;
        *) return 1 ;;
    esac
}

# Where a component is built: lws and jobset under <controllers-key>, the rest under <versions-key>.
out_dir_of() {
    if [[ "$1" == lws || "$1" == jobset ]]; then echo "${CTRL_DIR}"
    elif is_node_component "$1"; then echo "${NODE_DIR}"
    else echo "${OUT_DIR}"
    fi
}

# link_into_out_dir PATH [FROM] (e.g. bin/lws): <versions-key>/PATH -> FROM/PATH (default <controllers-key>).
link_into_out_dir() {
    mkdir -p "$(dirname "${OUT_DIR}/$1")"
    ln -sfn "${2:-${CTRL_DIR}}/$1" "${OUT_DIR}/$1"
}

# runc's cgo build links libseccomp: its headers come from Debian's libseccomp-dev.
need_libseccomp() {
    [[ -f /usr/include/seccomp.h ]] && return 0
    command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]] ||
        die "runc needs libseccomp's headers (/usr/include/seccomp.h): install libseccomp-dev (Debian/Ubuntu) or libseccomp-devel"
    log "installing libseccomp-dev (apt-get)"
    debian_install libseccomp-dev || die "apt-get install libseccomp-dev failed (is a Debian mirror reachable?)"
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
    comp_dir="$(out_dir_of "${comp}")"
    comp_bin="${comp_dir}/bin"
    stamp_file="${comp_bin}/.${comp}.stamp"
    # A tools module's own Go files (only tools/pause has any) are part of what its stamp hashes.
    mapfile -t own_go < <(find "${mod}" -maxdepth 1 -name '*.go' | sort)
    stamp="${comp} ${pkg}@${version} go=${GO_VERSION} mod=$(hash_files "${mod}/go.mod" "${mod}/go.sum" ${own_go[@]+"${own_go[@]}"}) ldflags=$(sha256sum <<<"${xflags}" | cut -c1-8)"
    if [[ -x "${comp_bin}/${comp}" && -f "${stamp_file}" && "$(cat "${stamp_file}")" == "${stamp}" ]]; then
        [[ "${comp_dir}" == "${OUT_DIR}" ]] || link_into_out_dir "bin/${comp}" "${comp_dir}"
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
    cgo=0 tags=""
    if [[ "${comp}" == runc ]]; then
        need_libseccomp
        command -v gcc >/dev/null || die "runc is a cgo build: install a C compiler (gcc)"
        cgo=1 tags="seccomp"
    fi
    (cd "${mod}" && CGO_ENABLED="${cgo}" nice -n "${NICE}" go build -p "${JOBS}" -tags="${tags}" \
        -ldflags="-s -w ${xflags}" -o "${comp_bin}/.${comp}.tmp" "${pkg}")
    mv -f "${comp_bin}/.${comp}.tmp" "${comp_bin}/${comp}"
    printf '%s\n' "${stamp}" >"${stamp_file}"
    [[ "${comp_dir}" == "${OUT_DIR}" ]] || link_into_out_dir "bin/${comp}" "${comp_dir}"
    secs=$(( $(date +%s) - start ))
    printf '%s %s %ss %s\n' "$(date '+%Y-%m-%dT%H:%M:%S')" "${comp}" "${secs}" "${stamp}" >>"${comp_dir}/build-times.log"
    log "${comp}: built in ${secs}s -> ${comp_bin}/${comp}"
    built=$((built + 1))
done

# --- CRDs of the pinned releases (complete sets; the managers need all of them) ---------------------------
# -> <versions-key>/crds/kueue/*.yaml   (config/components/crd/bases of sigs.k8s.io/kueue)
# -> <versions-key>/crds/volcano/*.yaml (config/crd/volcano/bases of volcano.sh/volcano; vc-scheduler waits
#    for every informer, including nodeinfo.volcano.sh Numatopology, before it opens a session)
# -> <controllers-key>/crds/lws/*.yaml  (config/crd/bases of sigs.k8s.io/lws: LeaderWorkerSet, and
#    DisaggregatedSet, whose controller the manager starts too)
# -> <controllers-key>/crds/jobset/*.yaml (config/components/crd/bases of sigs.k8s.io/jobset)
# and the webhook configurations that controller-gen wrote for Kueue and those two releases (the paths their webhook
# servers serve), which the e2e tier points at loopback:
# -> <versions-key>/webhooks/kueue/manifests.yaml     (config/components/webhook/manifests.yaml)
# -> <controllers-key>/webhooks/lws/manifests.yaml    (config/webhook/manifests.yaml)
# -> <controllers-key>/webhooks/jobset/manifests.yaml (config/components/webhook/manifests.yaml)
export_crds() { # name moddir module@version subdir [kind: crds|webhooks] [root: OUT_DIR]
    local name="$1" moddir="$2" modver="$3" sub="$4" kind="${5:-crds}" root="${6:-${OUT_DIR}}" dir src
    local dest="${root}/${kind}/${name}" stamp="${modver} ${sub}"
    if [[ -f "${dest}/.stamp" && "$(cat "${dest}/.stamp")" == "${stamp}" ]]; then
        log "${kind}/${name}: up to date (${modver})"
        return 0
    fi
    STEP="export ${kind} of ${modver}"
    local json
    if ! json="$(cd "${TOOLS_DIR}/${moddir}" && go mod download -json "${modver}")"; then
        printf '%s\n' "${json}" >&2   # go reports the error inside its JSON
        mod_download_failed "${moddir}"
    fi
    dir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' <<<"${json}")"
    src="${dir}/${sub}"
    [[ -e "${src}" ]] || die "no ${sub} in ${modver} (module dir '${dir}')"
    rm -rf "${dest}"
    mkdir -p "${dest}"
    if [[ -d "${src}" ]]; then
        install -m 0644 "${src}"/*.yaml "${dest}/"
    else
        install -m 0644 "${src}" "${dest}/"
    fi
    printf '%s\n' "${stamp}" >"${dest}/.stamp"
    log "${kind}/${name}: $(find "${dest}" -name '*.yaml' | wc -l) files from ${modver}/${sub}"
}
for comp in "${COMPONENTS[@]}"; do
    case "${comp}" in
        kueue)
            export_crds kueue kueue "sigs.k8s.io/kueue@${KUEUE_VERSION}" config/components/crd/bases
            export_crds kueue kueue "sigs.k8s.io/kueue@${KUEUE_VERSION}" config/components/webhook/manifests.yaml \
                webhooks
            ;;
        vc-scheduler) export_crds volcano volcano "volcano.sh/volcano@${VOLCANO_VERSION}" config/crd/volcano/bases ;;
        lws)
            export_crds lws lws "sigs.k8s.io/lws@${LWS_VERSION}" config/crd/bases crds "${CTRL_DIR}"
            export_crds lws lws "sigs.k8s.io/lws@${LWS_VERSION}" config/webhook/manifests.yaml webhooks "${CTRL_DIR}"
            link_into_out_dir crds/lws
            link_into_out_dir webhooks/lws
            ;;
        jobset)
            export_crds jobset jobset "sigs.k8s.io/jobset@${JOBSET_VERSION}" config/components/crd/bases crds "${CTRL_DIR}"
            export_crds jobset jobset "sigs.k8s.io/jobset@${JOBSET_VERSION}" config/components/webhook/manifests.yaml \
                webhooks "${CTRL_DIR}"
            link_into_out_dir crds/jobset
            link_into_out_dir webhooks/jobset
            ;;
    esac
done

STEP="finish"
log "done: ${built} built, total $(( $(date +%s) - total_start ))s"
echo "GANGSLICE_E2E_BIN=${BIN_DIR}"
