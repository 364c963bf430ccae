#!/usr/bin/env bash
# Regenerate go.mod + go.sum of the e2e tools modules from hack/e2e/tools/versions.env.
# Maintainer tool: run it after bumping a version, then commit the changed go.mod/go.sum files.
# hack/e2e/build.sh never runs this; it builds from the committed files (-mod=readonly).
set -euo pipefail

TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=/dev/null
source "${TOOLS_DIR}/versions.env"
CACHE_ROOT="${GANGSLICE_CACHE:-$HOME/.cache/gangslice}"
export GOMODCACHE="${CACHE_ROOT}/go/mod" GOCACHE="${CACHE_ROOT}/go/build" GOTOOLCHAIN=local GOFLAGS=-mod=mod

log() { printf '%s pin: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# staging_replaces MODULE@VERSION STAGING_VERSION: print `-replace k8s.io/x=k8s.io/x@STAGING_VERSION` for every
# `k8s.io/x => ./staging/src/k8s.io/x` line in the go.mod of k8s.io/kubernetes (downloaded from the proxy).
staging_replaces() {
    local gomod
    gomod="$(go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    [[ -f "$gomod" ]] || { echo "cannot download go.mod of $1" >&2; return 1; }
    sed -n 's#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._/-]*\) => \./staging/src/k8s\.io/.*#\1#p' "$gomod" |
        sort -u | while read -r m; do printf -- '-replace=%s=%s@%s\n' "$m" "$m" "$2"; done
}

# copy_replaces MODULE@VERSION: print the module's own versioned replace lines as -replace flags, skipping
# directory replaces (./ or ../), which only work inside that repository.
copy_replaces() {
    local gomod
    gomod="$(go mod download -json "$1" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
    awk '/^replace \(/{inb=1; next} inb && /^\)/{inb=0; next}
         inb || /^replace /{ sub(/^replace /,""); if ($0 ~ /=>/) print }' "$gomod" |
        sed 's#//.*##' | awk 'NF>=4 && $2=="=>" && $3 !~ /^\.\.?\// {
            lhs=$1; rhs=$3"@"$4; printf "-replace=%s=%s\n", lhs, rhs }'
}

new_module() { # dir module-path
    rm -f "$1/go.mod" "$1/go.sum"
    mkdir -p "$1"
    (cd "$1" && go mod init "$2" >/dev/null 2>&1 && go mod edit -go=1.26.0)
}

k8s_staging() { echo "v0.${KUBERNETES_VERSION#v1.}"; }

# k8s_tools_module DIR CMD...: a tools module on k8s.io/kubernetes (its staging modules replaced by their
# tagged releases) whose tools are k8s.io/kubernetes/cmd/CMD.
k8s_tools_module() {
    local d="${TOOLS_DIR}/$1"; shift
    log "$(basename "$d") ${KUBERNETES_VERSION}"
    new_module "$d" "gangslice/hack/e2e/tools/$(basename "$d")"
    mapfile -t reps < <(staging_replaces "k8s.io/kubernetes@${KUBERNETES_VERSION}" "$(k8s_staging)")
    local tools=()
    for cmd in "$@"; do tools+=("-tool=k8s.io/kubernetes/cmd/${cmd}"); done
    (cd "$d" && go mod edit "${reps[@]}" -require="k8s.io/kubernetes@${KUBERNETES_VERSION}" "${tools[@]}" && go mod tidy)
}

pin_kubernetes() { k8s_tools_module kubernetes kube-apiserver kube-scheduler kubectl; }

# kube-controller-manager and the kubelet have tools modules of their own (same k8s.io/kubernetes pin): their
# extra dependencies stay out of the kubernetes module's go.sum, whose hash keys the apiserver/scheduler/kubectl
# builds.
pin_kube_controller_manager() { k8s_tools_module kube-controller-manager kube-controller-manager; }

pin_kueue() {
    local d="${TOOLS_DIR}/kueue"
    log "kueue ${KUEUE_VERSION} (k8s.io/kubernetes ${KUBERNETES_VERSION})"
    new_module "$d" gangslice/hack/e2e/tools/kueue
    mapfile -t reps < <(staging_replaces "k8s.io/kubernetes@${KUBERNETES_VERSION}" "$(k8s_staging)")
    (cd "$d" && go mod edit "${reps[@]}" -require="sigs.k8s.io/kueue@${KUEUE_VERSION}" \
        -require="k8s.io/kubernetes@${KUBERNETES_VERSION}" -tool=sigs.k8s.io/kueue/cmd/kueue && go mod tidy)
}

pin_volcano() {
    local d="${TOOLS_DIR}/volcano"
    log "volcano ${VOLCANO_VERSION} (volcano.sh/apis ${VOLCANO_APIS_VERSION})"
    new_module "$d" gangslice/hack/e2e/tools/volcano
    mapfile -t reps < <(copy_replaces "volcano.sh/volcano@${VOLCANO_VERSION}")
    (cd "$d" && go mod edit "${reps[@]}" -replace="volcano.sh/apis=volcano.sh/apis@${VOLCANO_APIS_VERSION}" \
        -require="volcano.sh/volcano@${VOLCANO_VERSION}" -tool=volcano.sh/volcano/cmd/scheduler && go mod tidy)
}

# The LeaderWorkerSet and JobSet controllers build against the dependency versions of their own release
# (their go.mod files pin k8s.io/* v0.36.x and controller-runtime v0.24.x; nothing is replaced).
pin_lws() {
    local d="${TOOLS_DIR}/lws"
    log "lws ${LWS_VERSION}"
    new_module "$d" gangslice/hack/e2e/tools/lws
    (cd "$d" && go mod edit -require="sigs.k8s.io/lws@${LWS_VERSION}" -tool=sigs.k8s.io/lws/cmd && go mod tidy)
}

pin_jobset() {
    local d="${TOOLS_DIR}/jobset"
    log "jobset ${JOBSET_VERSION}"
    new_module "$d" gangslice/hack/e2e/tools/jobset
    (cd "$d" && go mod edit -require="sigs.k8s.io/jobset@${JOBSET_VERSION}" -tool=sigs.k8s.io/jobset && go mod tidy)
}

# The real node (tests/e2e/test_real_node.py): the kubelet of the control plane's release; containerd v2 (daemon,
# ctr, the runc shim), runc and the CNI plugins a pod network needs (bridge, host-local, loopback), each at its
# release's own dependency versions (its own versioned replace lines copied).
pin_kubelet() { k8s_tools_module kubelet kubelet; }

# release_module DIR MODULE VERSION TOOL...: a tools module requiring MODULE@VERSION, its replace lines
# copied, whose tools are the packages TOOL... (paths below MODULE; "." for MODULE itself).
release_module() {
    local d="${TOOLS_DIR}/$1" module="$2" version="$3"; shift 3
    log "$(basename "$d") ${version}"
    new_module "$d" "gangslice/hack/e2e/tools/$(basename "$d")"
    mapfile -t reps < <(copy_replaces "${module}@${version}")
    local tools=()
    for pkg in "$@"; do
        if [[ "${pkg}" == . ]]; then tools+=("-tool=${module}"); else tools+=("-tool=${module}/${pkg}"); fi
    done
    (cd "$d" && go mod edit ${reps[@]+"${reps[@]}"} -require="${module}@${version}" "${tools[@]}" && go mod tidy)
}

pin_containerd() {
    release_module containerd github.com/containerd/containerd/v2 "${CONTAINERD_VERSION}" \
        cmd/containerd cmd/ctr cmd/containerd-shim-runc-v2
}

pin_runc() { release_module runc github.com/opencontainers/runc "${RUNC_VERSION}" .; }

pin_cni() {
    release_module cni github.com/containernetworking/plugins "${CNI_PLUGINS_VERSION}" \
        plugins/main/bridge plugins/main/loopback plugins/ipam/host-local
}

pin_etcd() {
    local d="${TOOLS_DIR}/etcd"
    log "etcd ${ETCD_VERSION}"
    new_module "$d" gangslice/hack/e2e/tools/etcd
    (cd "$d" && go mod edit -require="go.etcd.io/etcd/server/v3@${ETCD_VERSION}" -tool=go.etcd.io/etcd/server/v3 && go mod tidy)
}

pin_helm() {
    local d="${TOOLS_DIR}/helm"
    log "helm ${HELM_VERSION}"
    new_module "$d" gangslice/hack/e2e/tools/helm
    (cd "$d" && go mod edit -require="helm.sh/helm/v3@${HELM_VERSION}" -tool=helm.sh/helm/v3/cmd/helm && go mod tidy)
}

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(etcd kubernetes kube_controller_manager kueue volcano lws jobset helm kubelet containerd runc cni)
for t in "${targets[@]}"; do "pin_$t"; done
log "done"
