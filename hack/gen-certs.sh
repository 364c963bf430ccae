#!/usr/bin/env bash
# Generate the extender's certificates without cert-manager: a self-signed CA, a serving
# certificate for the Service gangslice-controller, written as the Secret the controller
# Deployment mounts (gangslice-tls: tls.crt, tls.key, ca.crt), and the client certificate
# kube-scheduler presents to the extender (mutual TLS: serve --tls-client-ca), written as the
# Secret the gangslice-scheduler Deployment mounts (gangslice-scheduler-client: tls.crt,
# tls.key, ca.crt), both from the same CA.
#
# Usage: hack/gen-certs.sh [options]
#   --out DIR               where keys, certificates and manifests go (default ./gangslice-certs)
#   --namespace NS          the controller's namespace (default gangslice-system)
#   --service NAME          the Service the certificate names (default gangslice-controller)
#   --secret NAME           the Secret to write (default gangslice-tls)
#   --client-secret NAME    the scheduler's client-certificate Secret (default gangslice-scheduler-client)
#   --client-name NAME      the client certificate's common name (default gangslice-scheduler)
#   --days N                validity of the serving certificate (default 365)
#   --ca-days N             validity of a new CA (default 3650)
#   --volcano-namespace NS  also write the ConfigMap gangslice-ca (ca.crt) in NS, for the
#                           Volcano scheduler to trust (see manifests/volcano/)
#   --apply                 kubectl apply the manifests (KUBECTL overrides the binary)
#
# Files in DIR: ca.key ca.crt tls.key tls.crt client.key client.crt, gangslice-tls.yaml and
# gangslice-scheduler-client.yaml (the Secrets) and, with --volcano-namespace,
# gangslice-ca-volcano.yaml. A CA already in DIR is reused, so running
# the script again renews the serving certificate and every client keeps trusting it. Keep
# ca.key out of version control. Needs openssl (1.1.1 or 3.x).
set -euo pipefail

OUT=./gangslice-certs
NAMESPACE=gangslice-system
SERVICE=gangslice-controller
SECRET=gangslice-tls
CLIENT_SECRET=gangslice-scheduler-client
CLIENT_NAME=gangslice-scheduler
DAYS=365
CA_DAYS=3650
VOLCANO_NAMESPACE=""
APPLY=false
KUBECTL="${KUBECTL:-kubectl}"

die() { echo "gen-certs.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) OUT="${2:?--out needs a folder}"; shift 2 ;;
        --namespace) NAMESPACE="${2:?--namespace needs a name}"; shift 2 ;;
        --service) SERVICE="${2:?--service needs a name}"; shift 2 ;;
        --secret) SECRET="${2:?--secret needs a name}"; shift 2 ;;
        --client-secret) CLIENT_SECRET="${2:?--client-secret needs a name}"; shift 2 ;;
        --client-name) CLIENT_NAME="${2:?--client-name needs a name}"; shift 2 ;;
        --days) DAYS="${2:?--days needs a number}"; shift 2 ;;
        --ca-days) CA_DAYS="${2:?--ca-days needs a number}"; shift 2 ;;
        --volcano-namespace) VOLCANO_NAMESPACE="${2:?--volcano-namespace needs a name}"; shift 2 ;;
        --apply) APPLY=true; shift ;;
        -h | --help) sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ "$DAYS" =~ ^[0-9]+$ && "$CA_DAYS" =~ ^[0-9]+$ ]] || die "--days and --ca-days take whole numbers"
command -v openssl >/dev/null || die "openssl is not on PATH"

umask 077
mkdir -p "$OUT"
cd "$OUT"

if [[ -s ca.key && -s ca.crt ]]; then
    echo "gen-certs.sh: reusing the CA in $OUT" >&2
else
    openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -keyout ca.key -out ca.crt -days "$CA_DAYS" -subj "/CN=gangslice-ca" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

HOST="${SERVICE}.${NAMESPACE}.svc"
cat > tls.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${SERVICE},DNS:${SERVICE}.${NAMESPACE},DNS:${HOST},DNS:${HOST}.cluster.local
EOF
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout tls.key -out tls.csr -subj "/CN=${HOST}" 2>/dev/null
openssl x509 -req -in tls.csr -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
    -days "$DAYS" -extfile tls.ext -out tls.crt 2>/dev/null
rm -f tls.csr tls.ext
openssl verify -CAfile ca.crt tls.crt >/dev/null || die "the new certificate does not verify against ca.crt"

cat > client.ext <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth
subjectAltName=DNS:${CLIENT_NAME}
EOF
openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout client.key -out client.csr -subj "/CN=${CLIENT_NAME}" 2>/dev/null
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
    -days "$DAYS" -extfile client.ext -out client.crt 2>/dev/null
rm -f client.csr client.ext
openssl verify -CAfile ca.crt client.crt >/dev/null || die "the client certificate does not verify against ca.crt"

b64() { base64 < "$1" | tr -d '\n'; }

cat > "${SECRET}.yaml" <<EOF
# Generated by hack/gen-certs.sh for https://${HOST}; holds a private key.
apiVersion: v1
kind: Secret
metadata:
  name: ${SECRET}
  namespace: ${NAMESPACE}
  labels:
    app.kubernetes.io/name: gangslice
type: kubernetes.io/tls
data:
  tls.crt: $(b64 tls.crt)
  tls.key: $(b64 tls.key)
  ca.crt: $(b64 ca.crt)
EOF
cat > "${CLIENT_SECRET}.yaml" <<EOF
# Generated by hack/gen-certs.sh: kube-scheduler's client certificate (CN ${CLIENT_NAME}) for
# the extender's mutual TLS; holds a private key.
apiVersion: v1
kind: Secret
metadata:
  name: ${CLIENT_SECRET}
  namespace: ${NAMESPACE}
  labels:
    app.kubernetes.io/name: gangslice
type: kubernetes.io/tls
data:
  tls.crt: $(b64 client.crt)
  tls.key: $(b64 client.key)
  ca.crt: $(b64 ca.crt)
EOF
MANIFESTS=("${SECRET}.yaml" "${CLIENT_SECRET}.yaml")

if [[ -n "$VOLCANO_NAMESPACE" ]]; then
    {
        echo "# Generated by hack/gen-certs.sh: the CA that signed https://${HOST}."
        echo "apiVersion: v1"
        echo "kind: ConfigMap"
        echo "metadata:"
        echo "  name: gangslice-ca"
        echo "  namespace: ${VOLCANO_NAMESPACE}"
        echo "  labels:"
        echo "    app.kubernetes.io/name: gangslice"
        echo "data:"
        echo "  ca.crt: |"
        sed 's/^/    /' ca.crt
    } > gangslice-ca-volcano.yaml
    MANIFESTS+=(gangslice-ca-volcano.yaml)
fi

for m in "${MANIFESTS[@]}"; do
    echo "$OUT/$m"
done
if $APPLY; then
    for m in "${MANIFESTS[@]}"; do
        "$KUBECTL" apply -f "$m"
    done
fi
