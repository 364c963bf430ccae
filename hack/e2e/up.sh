#!/usr/bin/env bash
# Bring up a throwaway control plane on loopback for poking at by hand:
#   etcd + kube-apiserver (RBAC, token-auth admin, own CA) + kube-scheduler.
# Binaries come from hack/e2e/build.sh (run here if GANGSLICE_E2E_BIN is unset). Everything lives in one
# temp folder (certs, kubeconfig, etcd data, logs) that is removed when you press Ctrl-C.
#
# Usage: hack/e2e/up.sh [--no-scheduler] [--keep] [--scheduler-config FILE]
#   --no-scheduler          start only etcd + kube-apiserver
#   --scheduler-config F    KubeSchedulerConfiguration to use (its clientConnection.kubeconfig must point at
#                           $WORKDIR/admin.kubeconfig; the default config is written for you)
#   --keep                  keep the temp folder after Ctrl-C
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WITH_SCHEDULER=1
KEEP=0
SCHED_CONFIG=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-scheduler) WITH_SCHEDULER=0 ;;
        --keep) KEEP=1 ;;
        --scheduler-config) SCHED_CONFIG="$(realpath "$2")"; shift ;;
        -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

log() { printf '%s [e2e-up] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
for tool in openssl curl python3; do
    command -v "$tool" >/dev/null || die "'$tool' not found on PATH (install it: apt-get install $tool)"
done

if [[ -z "${GANGSLICE_E2E_BIN:-}" ]]; then
    log "building/locating binaries with hack/e2e/build.sh"
    GANGSLICE_E2E_BIN="$("${SCRIPT_DIR}/build.sh" etcd kube-apiserver kube-scheduler kubectl | sed -n 's/^GANGSLICE_E2E_BIN=//p' | tail -1)"
fi
BIN="${GANGSLICE_E2E_BIN}"
for b in etcd kube-apiserver kube-scheduler; do
    [[ -x "${BIN}/${b}" ]] || die "${BIN}/${b} missing: run hack/e2e/build.sh"
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/gangslice-up.XXXXXX")"
mkdir -p "${WORK}/pki" "${WORK}/logs"
PIDS=()
NAMES=()

cleanup() {
    trap - INT TERM EXIT
    log "stopping"
    local i
    for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
        kill -TERM -- "-${PIDS[i]}" 2>/dev/null || true   # own process group (setsid), pgid == pid
    done
    for (( i=${#PIDS[@]}-1; i>=0; i-- )); do
        for _ in $(seq 50); do kill -0 "${PIDS[i]}" 2>/dev/null || break; sleep 0.2; done
        kill -KILL -- "-${PIDS[i]}" 2>/dev/null || true
    done
    if [[ ${KEEP} -eq 1 ]]; then log "kept ${WORK}"; else rm -rf "${WORK}"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start() { # name argv...
    local name="$1"; shift
    setsid "$@" >"${WORK}/logs/${name}.log" 2>&1 </dev/null &
    PIDS+=("$!"); NAMES+=("${name}")
    log "${name} started (pid $!, log ${WORK}/logs/${name}.log)"
}

wait_ready() { # name url curl-args...
    local name="$1" url="$2"; shift 2
    local pid="${PIDS[-1]}"
    for _ in $(seq 300); do
        if ! kill -0 "${pid}" 2>/dev/null; then
            tail -n 40 "${WORK}/logs/${name}.log" >&2; die "${name} exited"
        fi
        if curl -fsS --max-time 2 "$@" "${url}" >/dev/null 2>&1; then log "${name} ready"; return 0; fi
        sleep 0.3
    done
    tail -n 40 "${WORK}/logs/${name}.log" >&2; die "${name} not ready at ${url}"
}

# --- PKI: CA, apiserver serving cert, front-proxy client cert, service-account key pair, admin token --------
# No controller-manager or kubelet runs, hence: ServiceAccount admission off (no "default" SA gets created),
# TaintNodesByCondition off (nothing would remove the not-ready taint from new Nodes), endpoint reconciler off
# (the "kubernetes" Service may not point at a loopback address).
ossl() { openssl "$@" >/dev/null 2>&1 || die "openssl $*"; }
P="${WORK}/pki"
ossl req -x509 -newkey rsa:2048 -nodes -sha256 -days 7 -keyout "${P}/ca.key" -out "${P}/ca.crt" \
    -subj /CN=gangslice-e2e-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature,keyEncipherment extendedKeyUsage=serverAuth \
    'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:10.96.0.1' \
    >"${P}/apiserver.ext"
ossl req -newkey rsa:2048 -nodes -keyout "${P}/apiserver.key" -out "${P}/apiserver.csr" -subj /CN=kube-apiserver
ossl x509 -req -sha256 -days 7 -in "${P}/apiserver.csr" -CA "${P}/ca.crt" -CAkey "${P}/ca.key" -CAcreateserial \
    -out "${P}/apiserver.crt" -extfile "${P}/apiserver.ext"
printf '%s\n' basicConstraints=CA:FALSE keyUsage=critical,digitalSignature,keyEncipherment extendedKeyUsage=clientAuth \
    >"${P}/front-proxy-client.ext"
ossl req -newkey rsa:2048 -nodes -keyout "${P}/front-proxy-client.key" -out "${P}/front-proxy-client.csr" \
    -subj /CN=front-proxy-client
ossl x509 -req -sha256 -days 7 -in "${P}/front-proxy-client.csr" -CA "${P}/ca.crt" -CAkey "${P}/ca.key" \
    -CAcreateserial -out "${P}/front-proxy-client.crt" -extfile "${P}/front-proxy-client.ext"
ossl genrsa -out "${P}/sa.key" 2048
ossl rsa -in "${P}/sa.key" -pubout -out "${P}/sa.pub"
TOKEN="$(openssl rand -hex 24)"
printf '%s,gangslice-e2e-admin,gangslice-e2e-admin,"system:masters"\n' "${TOKEN}" >"${P}/tokens.csv"

# --- etcd ---------------------------------------------------------------------------------------------------
ETCD_PORT="$(free_port)"; PEER_PORT="$(free_port)"
ETCD="http://127.0.0.1:${ETCD_PORT}"; PEER="http://127.0.0.1:${PEER_PORT}"
start etcd "${BIN}/etcd" --name=e2e --data-dir="${WORK}/etcd" --listen-client-urls="${ETCD}" \
    --advertise-client-urls="${ETCD}" --listen-peer-urls="${PEER}" --initial-advertise-peer-urls="${PEER}" \
    --initial-cluster="e2e=${PEER}" --unsafe-no-fsync=true --log-level=warn
wait_ready etcd "${ETCD}/health"

# --- kube-apiserver -----------------------------------------------------------------------------------------
API_PORT="$(free_port)"
SERVER="https://127.0.0.1:${API_PORT}"
start kube-apiserver "${BIN}/kube-apiserver" --etcd-servers="${ETCD}" --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 --secure-port="${API_PORT}" --cert-dir="${WORK}/apiserver" \
    --tls-cert-file="${P}/apiserver.crt" --tls-private-key-file="${P}/apiserver.key" --client-ca-file="${P}/ca.crt" \
    --token-auth-file="${P}/tokens.csv" --authorization-mode=RBAC --service-cluster-ip-range=10.96.0.0/24 \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="${P}/sa.pub" --service-account-signing-key-file="${P}/sa.key" \
    --allow-privileged=true --profiling=false \
    --disable-admission-plugins=ServiceAccount,TaintNodesByCondition --endpoint-reconciler-type=none \
    --requestheader-client-ca-file="${P}/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="${P}/front-proxy-client.crt" --proxy-client-key-file="${P}/front-proxy-client.key"
wait_ready kube-apiserver "${SERVER}/readyz" --cacert "${P}/ca.crt" -H "Authorization: Bearer ${TOKEN}"

KUBECONFIG_FILE="${WORK}/admin.kubeconfig"
cat >"${KUBECONFIG_FILE}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gangslice-e2e
  cluster:
    server: ${SERVER}
    certificate-authority-data: $(base64 -w0 <"${P}/ca.crt")
users:
- name: gangslice-e2e-admin
  user:
    token: ${TOKEN}
contexts:
- name: gangslice-e2e
  context: {cluster: gangslice-e2e, user: gangslice-e2e-admin, namespace: default}
current-context: gangslice-e2e
EOF
chmod 600 "${KUBECONFIG_FILE}"

# --- kube-scheduler -----------------------------------------------------------------------------------------
if [[ ${WITH_SCHEDULER} -eq 1 ]]; then
    if [[ -z "${SCHED_CONFIG}" ]]; then
        SCHED_CONFIG="${WORK}/kube-scheduler.yaml"
        cat >"${SCHED_CONFIG}" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: ${KUBECONFIG_FILE}}
leaderElection: {leaderElect: false}
percentageOfNodesToScore: 100
EOF
    fi
    SCHED_PORT="$(free_port)"
    start kube-scheduler "${BIN}/kube-scheduler" --config="${SCHED_CONFIG}" --bind-address=127.0.0.1 \
        --secure-port="${SCHED_PORT}" --cert-dir="${WORK}/kube-scheduler" \
        --authentication-kubeconfig="${KUBECONFIG_FILE}" --authorization-kubeconfig="${KUBECONFIG_FILE}"
    wait_ready kube-scheduler "https://127.0.0.1:${SCHED_PORT}/healthz" -k
fi

cat >"${WORK}/env.sh" <<EOF
export KUBECONFIG=${KUBECONFIG_FILE}
export GANGSLICE_E2E_SERVER=${SERVER}
export GANGSLICE_E2E_TOKEN=${TOKEN}
export PATH=${BIN}:\$PATH
EOF

KUBECTL_NOTE="kubectl is ${BIN}/kubectl (env.sh puts ${BIN} first on PATH)"
[[ -x "${BIN}/kubectl" ]] || KUBECTL_NOTE="no kubectl in ${BIN}: build it with hack/e2e/build.sh kubectl, or use your own"
cat >&2 <<EOF

Control plane is up (Ctrl-C stops it and deletes ${WORK}).
  API server : ${SERVER}   (etcd ${ETCD})
  admin token: ${TOKEN}
  logs       : ${WORK}/logs/
In another shell:
  source ${WORK}/env.sh
  kubectl get --raw /readyz; kubectl get ns
(${KUBECTL_NOTE})
EOF

# Stay in the foreground; exit (and clean up) if any component dies.
while true; do
    for i in "${!PIDS[@]}"; do
        if ! kill -0 "${PIDS[i]}" 2>/dev/null; then
            log "${NAMES[i]} exited; last log lines:"; tail -n 30 "${WORK}/logs/${NAMES[i]}.log" >&2
            exit 1
        fi
    done
    sleep 1
done
