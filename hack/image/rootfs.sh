#!/usr/bin/env bash
# Build the image's root filesystem in steps (hack/image/build.sh caches each; Containerfile's
# build stage runs them all). Needs root (mmdebstrap --mode=root), mmdebstrap, and a pip that
# can reach PyPI. Every step follows hack/image/recipe.env.
#
#   rootfs.sh debian DIR ARCH        Debian's Python 3.11 unpacked into DIR (no shell, no scripts run)
#   rootfs.sh deps   DIR ARCH        the locked dependencies (hack/image/requirements.lock) into DIR
#   rootfs.sh app    DIR ARCH WHEEL  gangslice's wheel, its entrypoint, users, bytecode into DIR
#
# ARCH is a Debian architecture: amd64 or arm64. SOURCE_DATE_EPOCH, when set, dates every file.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=recipe.env
source "${HERE}/recipe.env"
PIP="${PIP:-python3 -m pip}"

die() { printf 'hack/image/rootfs.sh: %s\n' "$*" >&2; exit 1; }

python_arch() { case "$1" in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) die "unknown ARCH $1 (amd64, arm64)" ;; esac; }

# pip flags that pick the wheels of CPython 3.11 on glibc 2.36 (Debian 12) for ARCH.
pip_platform() {
    local arch g
    arch="$(python_arch "$1")"
    printf -- '--only-binary=:all: --python-version=3.11 --implementation=cp --abi=cp311 --abi=abi3 --abi=none'
    for g in 2_5 2_12 2_17 2_24 2_26 2_27 2_28 2_31 2_34 2_35 2_36; do printf -- ' --platform=manylinux_%s_%s' "$g" "$arch"; done
    printf -- ' --platform=manylinux2014_%s --platform=linux_%s\n' "$arch" "$arch"
}

step_debian() { # DIR ARCH
    command -v mmdebstrap >/dev/null || die "mmdebstrap is missing: apt-get install mmdebstrap"
    rm -rf "$1"
    # The package list goes into the image (/usr/share/gangslice/debian-packages.tsv): the SBOM's source.
    # shellcheck disable=SC2086,SC2016
    mmdebstrap --quiet --variant=extract --mode=root --format=directory --architectures="$2" \
        --include="$(tr ' ' ',' <<<"${DEBIAN_PACKAGES}")" \
        --extract-hook='mkdir -p "$1/usr/share/gangslice" && for deb in "$1"/var/cache/apt/archives/*.deb; do
            dpkg-deb --show --showformat="\${Package}\t\${Version}\t\${Architecture}\n" "$deb"; done |
            sort >"$1/usr/share/gangslice/debian-packages.tsv"' \
        "${DEBIAN_SUITE}" "$1"
    [[ -x "$1/usr/bin/python3.11" ]] || die "no /usr/bin/python3.11 in $1"
}

# Bytecode now, so a read-only root filesystem costs no start-up time (the same CPython 3.11),
# and every file dated SOURCE_DATE_EPOCH.
compile_and_date() { # ROOT DIR-INSIDE...
    local root="$1"; shift
    if python3 -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        python3 -m compileall -q -j 0 --invalidation-mode unchecked-hash -s "${root}" -p / "$@" >/dev/null
    fi
    if [[ -n "${SOURCE_DATE_EPOCH:-}" ]]; then
        find "${root}" -newermt "@${SOURCE_DATE_EPOCH}" -exec touch --no-dereference --date="@${SOURCE_DATE_EPOCH}" {} +
    fi
}

step_deps() { # DIR ARCH
    rm -rf "$1"
    # shellcheck disable=SC2046
    ${PIP} install --quiet --no-deps --require-hashes --no-compile --target="$1${PYTHON_SITE}" \
        $(pip_platform "$2") -r "${HERE}/requirements.lock"
    rm -rf "$1${PYTHON_SITE}/bin"  # console scripts with the build machine's interpreter in their shebang
    compile_and_date "$1" "$1${PYTHON_SITE}"
}

step_app() { # DIR ARCH WHEEL
    local root="$1"
    # shellcheck disable=SC2046
    ${PIP} install --quiet --no-deps --no-compile --target="${root}${PYTHON_SITE}" $(pip_platform "$2") "$3"
    rm -rf "${root}${PYTHON_SITE}/bin"
    install -d -m 0755 "${root}/usr/local/bin"
    printf '#!/usr/bin/python3.11\nimport sys\n\nfrom extender.cli import main\n\nsys.exit(main())\n' \
        >"${root}/usr/local/bin/gangslice"
    chmod 0755 "${root}/usr/local/bin/gangslice"
    printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/usr/sbin/nologin\n' \
        "${IMAGE_USER}" "${IMAGE_USER}" >"${root}/etc/passwd"
    printf 'root:x:0:\nnonroot:x:%s:\n' "${IMAGE_USER}" >"${root}/etc/group"
    install -d -m 0755 -o "${IMAGE_USER}" -g "${IMAGE_USER}" "${root}/home/nonroot"
    install -d -m 1777 "${root}/tmp"
    compile_and_date "${root}" "${root}${PYTHON_SITE}/extender"
}

step="${1:-}"; shift || true
case "${step}" in
    debian) [[ $# -eq 2 ]] || die "usage: rootfs.sh debian DIR ARCH"; step_debian "$@" ;;
    deps)   [[ $# -eq 2 ]] || die "usage: rootfs.sh deps DIR ARCH"; step_deps "$@" ;;
    app)    [[ $# -eq 3 ]] || die "usage: rootfs.sh app DIR ARCH WHEEL"; step_app "$@" ;;
    *) die "usage: rootfs.sh debian|deps|app DIR ARCH [WHEEL]" ;;
esac
