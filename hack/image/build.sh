#!/usr/bin/env bash
# make image: the gangslice image as an OCI archive, with no container daemon and no registry.
#
#   hack/image/build.sh [ARCH]      ARCH: amd64 (default) or arm64
#
# Root filesystem from Debian packages (mmdebstrap, unpacked only) + the locked wheels from
# PyPI + the project's wheel (hack/image/rootfs.sh), assembled with buildah from scratch into
#   out/image/gangslice-<version>-<arch>.oci.tar        the image (oci-archive, one layer)
#   out/image/gangslice-<version>-<arch>.spdx.json      its software bill of materials (SPDX 2.3)
# The name and tag come from manifests/kustomization.yaml (`images:`), the recipe from
# hack/image/recipe.env. The Debian and the dependency steps are cached under
#   ${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/image/<version>/<arch>-<step>-<inputs hash>/
# so a rebuild after a code change only installs the wheel and assembles. Files are dated
# SOURCE_DATE_EPOCH (default: the last commit's time). GANGSLICE_WHEEL=<path> installs that
# wheel instead of building one (make release passes the wheel it publishes). Needs root,
# mmdebstrap and buildah (installed with apt-get when missing); arm64 needs no emulator
# (nothing runs in the rootfs).
# The last line on stdout is IMAGE_ARCHIVE=<path>.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HERE}/../.." && pwd)"
# shellcheck source=recipe.env
source "${HERE}/recipe.env"
# shellcheck source=../lib/debian.sh
source "${HERE}/../lib/debian.sh"
ARCH="${1:-amd64}"
PYTHON="${PYTHON:-${REPO}/.venv/bin/python}"
export PIP="${PYTHON} -m pip"

log() { printf '%s [image] %s\n' "$(date '+%H:%M:%S')" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

[[ "$(id -u)" == 0 ]] || die "needs root (mmdebstrap --mode=root, files owned by root in the layer)"
# The two build tools are Debian packages: installed here when missing (as root, with apt).
if ! command -v mmdebstrap >/dev/null || ! command -v buildah >/dev/null; then
    command -v apt-get >/dev/null || die "mmdebstrap and buildah are needed (Debian/Ubuntu packages); no apt-get here"
    log "installing mmdebstrap and buildah (apt-get)"
    debian_install mmdebstrap buildah || die "apt-get install mmdebstrap buildah failed (is a Debian mirror reachable?)"
fi
for tool in mmdebstrap buildah dpkg-deb; do
    command -v "${tool}" >/dev/null || die "${tool} is missing: apt-get install mmdebstrap buildah"
done
[[ -x "${PYTHON}" ]] || die "${PYTHON} missing: run make venv first (or set PYTHON)"
case "${ARCH}" in amd64|arm64) ;; *) die "ARCH ${ARCH}: amd64 or arm64" ;; esac

read -r IMAGE VERSION < <("${PYTHON}" - "${REPO}" <<'PY'
import sys, pathlib, yaml
repo = pathlib.Path(sys.argv[1])
k = yaml.safe_load((repo / "manifests" / "kustomization.yaml").read_text())
(image,) = [i for i in k["images"] if i["name"].endswith("/gangslice")]
print(image.get("newName", image["name"]), image["newTag"])
PY
)
REVISION="$(git -C "${REPO}" rev-parse HEAD 2>/dev/null || echo unknown)"
export SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "${REPO}" log -1 --format=%ct 2>/dev/null || date +%s)}"
CACHE="${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/image/${VERSION}"
OUT="${REPO}/out/image"
NAME="gangslice-${VERSION}-${ARCH}"
mkdir -p "${CACHE}" "${OUT}"
start=$(date +%s)

key() { cat "$@" | sha256sum | cut -c1-16; }
cached_step() { # step inputs... ; prints the cached dir, building it when missing
    local step="$1"; shift
    local dir="${CACHE}/${ARCH}-${step}-$(key "${HERE}/recipe.env" "${HERE}/rootfs.sh" "$@")"
    if [[ ! -f "${dir}/.done" ]]; then
        log "${step}: building into ${dir}"
        "${HERE}/rootfs.sh" "${step}" "${dir}.tmp" "${ARCH}"
        rm -rf "${CACHE}/${ARCH}-${step}-"*[!p]  # earlier inputs' results (not the .tmp being renamed)
        mv "${dir}.tmp" "${dir}" && touch "${dir}/.done"
    else
        log "${step}: cached (${dir})"
    fi
    echo "${dir}"
}
DEBIAN_DIR="$(cached_step debian)"
DEPS_DIR="$(cached_step deps "${HERE}/requirements.lock")"

WORK="$(mktemp -d "${CACHE}/build.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT
if [[ -n "${GANGSLICE_WHEEL:-}" ]]; then
    [[ -f "${GANGSLICE_WHEEL}" ]] || die "GANGSLICE_WHEEL=${GANGSLICE_WHEEL}: no such file"
    [[ "$(basename "${GANGSLICE_WHEEL}")" == "gangslice-${VERSION}-"*.whl ]] ||
        die "GANGSLICE_WHEEL=${GANGSLICE_WHEEL} is not gangslice ${VERSION}'s wheel"
    WHEEL="${GANGSLICE_WHEEL}"
else
    log "wheel"
    "${PYTHON}" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "${WORK}/dist" "${REPO}"
    WHEEL="$(ls "${WORK}"/dist/gangslice-*.whl)"
fi
ROOTFS="${WORK}/rootfs"
cp -a "${DEBIAN_DIR}" "${ROOTFS}" && rm -f "${ROOTFS}/.done"
cp -a "${DEPS_DIR}/." "${ROOTFS}/" && rm -f "${ROOTFS}/.done"
"${HERE}/rootfs.sh" app "${ROOTFS}" "${ARCH}" "${WHEEL}"
# What would differ between two builds of the same inputs, and nothing an image needs: pip notes
# where it found the wheel (PEP 610 direct_url.json, a temporary path of this build), and each
# RECORD lists the console scripts pip wrote to bin/ (which rootfs.sh removes) with hashes of
# their shebang, the path of the interpreter that ran pip.
rm -f "${ROOTFS}${PYTHON_SITE}"/gangslice-*.dist-info/direct_url.json
sed -i -e '/\/direct_url\.json,/d' -e '/^\.\.\/\.\.\/bin\//d' "${ROOTFS}${PYTHON_SITE}"/*.dist-info/RECORD

log "SBOM"
"${PYTHON}" "${HERE}/sbom.py" "${ROOTFS}" "${IMAGE}:${VERSION}" "${VERSION}" "${ARCH}" >"${OUT}/${NAME}.spdx.json"

log "assemble with buildah"
STORE=(--root "${WORK}/storage" --runroot "${WORK}/run" --storage-driver vfs)
created="$(date -u -d "@${SOURCE_DATE_EPOCH}" '+%Y-%m-%dT%H:%M:%SZ')"
ctr="$(buildah "${STORE[@]}" from --quiet scratch)"
buildah "${STORE[@]}" copy --quiet "${ctr}" "${ROOTFS}" / >/dev/null
labels=(
    "org.opencontainers.image.title=${IMAGE_TITLE}"
    "org.opencontainers.image.description=${IMAGE_DESCRIPTION}"
    "org.opencontainers.image.version=${VERSION}"
    "org.opencontainers.image.revision=${REVISION}"
    "org.opencontainers.image.source=${IMAGE_SOURCE}"
    "org.opencontainers.image.licenses=${IMAGE_LICENSES}"
    "org.opencontainers.image.created=${created}"
    "org.opencontainers.image.ref.name=${VERSION}"
)
config=(--arch "${ARCH}" --os linux --user "${IMAGE_USER}:${IMAGE_USER}" --workingdir /
    --entrypoint "${IMAGE_ENTRYPOINT}" --cmd "${IMAGE_CMD}")
for e in ${IMAGE_ENV}; do config+=(--env "${e}"); done
for l in "${labels[@]}"; do config+=(--label "${l}" --annotation "${l}"); done
buildah "${STORE[@]}" config "${config[@]}" "${ctr}"
rm -f "${OUT}/${NAME}.oci.tar"
buildah "${STORE[@]}" commit --quiet --format oci --disable-compression=false --timestamp "${SOURCE_DATE_EPOCH}" --omit-history \
    --identity-label=false --rm "${ctr}" "oci-archive:${OUT}/${NAME}.oci.tar:${IMAGE}:${VERSION}" >/dev/null
size="$(du -m "${OUT}/${NAME}.oci.tar" | cut -f1)"
log "done in $(( $(date +%s) - start ))s: ${OUT}/${NAME}.oci.tar (${size} MiB, ${IMAGE}:${VERSION}, ${ARCH})"
echo "IMAGE_ARCHIVE=${OUT}/${NAME}.oci.tar"
