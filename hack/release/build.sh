#!/usr/bin/env bash
# make release: every artifact of the version in pyproject.toml, under out/release/:
#
#   gangslice-<v>-py3-none-any.whl        the wheel      } python -m build (the wheel built from the sdist)
#   gangslice-<v>.tar.gz                  the sdist      }
#   gangslice-<v>-amd64.oci.tar           the image for each platform (hack/image/build.sh with that
#   gangslice-<v>-arm64.oci.tar             wheel; oci-archive), arm64 for Grace trays
#   gangslice-<v>.oci.tar                 both under one OCI image index: the multi-arch image
#   gangslice-<v>-amd64.spdx.json         the SBOM of each image (SPDX 2.3)
#   gangslice-<v>-arm64.spdx.json
#   gangslice-<v>.tgz                     the Helm chart (helm package), appVersion <v>, the image
#                                           pinned to the digest of the multi-arch index
#   SHA256SUMS                            of all the above (sha256sum -c SHA256SUMS)
#
# The same inputs (the commit, its SOURCE_DATE_EPOCH, the Debian mirror's packages, the locked
# wheels, the build tools' versions) give the same bytes: hack/release/assemble.py writes the
# archives in a fixed order with fixed dates (docs/install.md, "From a release"). The image
# steps are cached as `make image` caches them. Needs what `make image` needs (root, mmdebstrap,
# buildah), the `build` package in PYTHON's environment, and helm: $HELM, else
# $GANGSLICE_E2E_BIN/helm, else the one hack/e2e/build.sh builds (Go). GANGSLICE_RELEASE_TAG,
# when set (.github/workflows/release.yaml), must be v<version>. The last lines on stdout are
# IMAGE_DIGEST=<digest of the index> and RELEASE_DIR=<path>.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HERE}/../.." && pwd)"
PYTHON="${PYTHON:-${REPO}/.venv/bin/python}"
ASSEMBLE=("${PYTHON}" "${HERE}/assemble.py")
ARCHES=(amd64 arm64)

log() { printf '%s [release] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[[ -x "${PYTHON}" ]] || die "${PYTHON} missing: run make venv first (or set PYTHON)"
"${PYTHON}" -c 'import build' 2>/dev/null || die "no 'build' package in ${PYTHON}'s environment: pip install -e '.[test]'"

# The one version: pyproject.toml's. The package, the image tag and the chart must say the same.
VERSION="$("${PYTHON}" - "${REPO}" <<'PY'
import pathlib, re, sys, tomllib, yaml
repo = pathlib.Path(sys.argv[1])
version = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["version"]
init = re.search(r'^__version__ = "(.*)"$', (repo / "extender" / "__init__.py").read_text(), re.M)
k = yaml.safe_load((repo / "manifests" / "kustomization.yaml").read_text())
chart = yaml.safe_load((repo / "charts" / "gangslice" / "Chart.yaml").read_text())
found = {
    "extender/__init__.py __version__": init.group(1) if init else None,
    "manifests/kustomization.yaml image tag": [i["newTag"] for i in k["images"] if i["name"].endswith("/gangslice")][0],
    "charts/gangslice/Chart.yaml version": chart["version"],
    "charts/gangslice/Chart.yaml appVersion": chart["appVersion"],
}
wrong = [f"{where} is {v}" for where, v in found.items() if v != version]
if wrong:
    sys.exit(f"pyproject.toml says {version}, but " + "; ".join(wrong) + " (hack/gen-chart.py writes the chart)")
print(version)
PY
)" || die "the versions disagree"
# The release workflow passes its tag: v<version> and nothing else.
if [[ -n "${GANGSLICE_RELEASE_TAG:-}" && "${GANGSLICE_RELEASE_TAG}" != "v${VERSION}" ]]; then
    die "tag ${GANGSLICE_RELEASE_TAG}, but pyproject.toml's version is ${VERSION} (tag v${VERSION})"
fi
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "${REPO}" log -1 --format=%ct 2>/dev/null || date +%s)}"
OUT="${REPO}/out/release"
WORK="$(mktemp -d)"
trap 'rm -rf "${WORK}"' EXIT
rm -rf "${OUT}" && mkdir -p "${OUT}"
start=$(date +%s)
log "gangslice ${VERSION}, dated ${SOURCE_DATE_EPOCH} ($(date -u -d "@${SOURCE_DATE_EPOCH}" '+%F %T') UTC)"

log "wheel and sdist (python -m build)"
# --no-isolation: the setuptools of this environment, as the image's wheel (no download at
# build time, the same setuptools from build to build).
"${PYTHON}" -m build --no-isolation --outdir "${WORK}/dist" "${REPO}" >"${WORK}/build.log" 2>&1 ||
    { tail -30 "${WORK}/build.log" >&2; die "python -m build"; }
WHEEL="${OUT}/gangslice-${VERSION}-py3-none-any.whl"
cp "${WORK}/dist/gangslice-${VERSION}-py3-none-any.whl" "${WHEEL}"
"${ASSEMBLE[@]}" tgz "${WORK}/dist/gangslice-${VERSION}.tar.gz" "${OUT}/gangslice-${VERSION}.tar.gz"

images=()
for arch in "${ARCHES[@]}"; do
    log "image ${arch} (hack/image/build.sh)"
    archive="$(GANGSLICE_WHEEL="${WHEEL}" PYTHON="${PYTHON}" "${REPO}/hack/image/build.sh" "${arch}" | tail -1)"
    archive="${archive#IMAGE_ARCHIVE=}"
    images+=("${OUT}/gangslice-${VERSION}-${arch}.oci.tar")
    "${ASSEMBLE[@]}" oci-repack "${archive}" "${images[-1]}"
    cp "${archive%.oci.tar}.spdx.json" "${OUT}/"
done
log "multi-arch index"
DIGEST="$("${ASSEMBLE[@]}" oci-index "${OUT}/gangslice-${VERSION}.oci.tar" "${images[@]}")"

log "chart (helm package), image ${DIGEST}"
HELM="${HELM:-}"
if [[ -z "${HELM}" && -x "${GANGSLICE_E2E_BIN:-/nonexistent}/helm" ]]; then
    HELM="${GANGSLICE_E2E_BIN}/helm"
elif [[ -z "${HELM}" ]]; then
    bin="$("${REPO}/hack/e2e/build.sh" helm | tail -1)" || die "hack/e2e/build.sh helm (set HELM to a helm v3 instead)"
    HELM="${bin#GANGSLICE_E2E_BIN=}/helm"
fi
for dir in CACHE CONFIG DATA; do export "HELM_${dir}_HOME=${WORK}/helm/${dir,,}"; done
cp -r "${REPO}/charts/gangslice" "${WORK}/gangslice"
"${ASSEMBLE[@]}" chart-values "${WORK}/gangslice/values.yaml" "${DIGEST}"
"${HELM}" package "${WORK}/gangslice" --version "${VERSION}" --app-version "${VERSION}" \
    --destination "${WORK}" >/dev/null
"${HELM}" lint --strict "${WORK}/gangslice-${VERSION}.tgz" >"${WORK}/lint.log" 2>&1 ||
    { cat "${WORK}/lint.log" >&2; die "helm lint of the packaged chart"; }
"${ASSEMBLE[@]}" tgz "${WORK}/gangslice-${VERSION}.tgz" "${OUT}/gangslice-${VERSION}.tgz"

export LC_ALL=C  # the order of the names below
(cd "${OUT}" && sha256sum -- * >"${WORK}/SHA256SUMS") && mv "${WORK}/SHA256SUMS" "${OUT}/"
log "done in $(( $(date +%s) - start ))s: ${OUT}"
ls -l "${OUT}" >&2
echo "IMAGE_DIGEST=${DIGEST}"
echo "RELEASE_DIR=${OUT}"
