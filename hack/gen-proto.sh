#!/usr/bin/env bash
# Generate the Python code of the kubelet APIs gangslice speaks from proto/: PodResources v1 (the
# agent), and for the e2e tier's real node Device Plugin v1beta1 (the fake-GPU device plugin),
# DRA v1 and plugin registration v1 (the fake GPU DRA driver).
#
#   hack/gen-proto.sh            # regenerate the committed files in extender/
#   hack/gen-proto.sh OUT_DIR    # write them under OUT_DIR/extender/ instead
#
# Output: extender/agent/podresources_pb2.py, podresources_pb2_grpc.py, podresources_pb2.pyi and
# extender/testing/{deviceplugin,dra,pluginregistration}_pb2.py, _pb2_grpc.py, _pb2.pyi.
# Each proto is compiled under a virtual name (extender/agent/podresources.proto, ...), so the
# generated modules import each other as `extender.agent.podresources_pb2` without any
# editing after protoc. The output depends only on the proto and the grpcio-tools version,
# which is pinned here: regenerate with exactly this version (tests/unit/test_podresources_proto.py
# checks the committed files match).
set -euo pipefail

GRPCIO_TOOLS_VERSION="1.85.1"

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(cd "${1:-$root}" && pwd)"
if [[ -z "${PYTHON:-}" ]]; then
  if [[ -x "$root/.venv/bin/python" ]]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi

have="$("$PYTHON" -c 'from importlib.metadata import version; print(version("grpcio-tools"))' 2>/dev/null || true)"
if [[ "$have" != "$GRPCIO_TOOLS_VERSION" ]]; then
  echo "gen-proto: need grpcio-tools==$GRPCIO_TOOLS_VERSION for reproducible output, found '${have:-none}'" >&2
  echo "gen-proto: $PYTHON -m pip install grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
  exit 1
fi

cd "$root"
generate() { # virtual-name proto-file
  mkdir -p "$out/$(dirname "$1")"
  "$PYTHON" -m grpc_tools.protoc \
    "-I$1=$2" \
    "--python_out=$out" \
    "--grpc_python_out=$out" \
    "--pyi_out=$out" \
    "$1"
}
generate extender/agent/podresources.proto proto/podresources/v1/api.proto
generate extender/testing/deviceplugin.proto proto/deviceplugin/v1beta1/api.proto
generate extender/testing/dra.proto proto/dra/v1/api.proto
generate extender/testing/pluginregistration.proto proto/pluginregistration/v1/api.proto
