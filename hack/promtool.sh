#!/usr/bin/env bash
# Print the path of a promtool (Prometheus's rule checker), taken from Debian's package
# `prometheus` without installing it: `apt-get download` + `dpkg-deb -x`, cached under
#   ${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/promtool/<package version>/promtool
# A promtool already on PATH is used as it is. Fails loudly, saying what to install, when
# neither works (no apt, no network to the Debian mirror).
set -euo pipefail

die() { printf 'hack/promtool.sh: %s\n' "$*" >&2; exit 1; }

if command -v promtool >/dev/null 2>&1; then
    command -v promtool
    exit 0
fi
command -v apt-get >/dev/null 2>&1 && command -v dpkg-deb >/dev/null 2>&1 ||
    die "no promtool on PATH and no apt-get/dpkg-deb to fetch Debian's 'prometheus' package: install promtool (Prometheus 2.x, e.g. 'apt-get install prometheus' or a release from prometheus.io) and rerun"

version="$(apt-cache policy prometheus 2>/dev/null | sed -n 's/^ *Candidate: //p')"
[[ -n "${version}" && "${version}" != "(none)" ]] ||
    die "apt knows no package 'prometheus' (run 'apt-get update' as root, or install promtool yourself)"
cache="${GANGSLICE_CACHE:-$HOME/.cache/gangslice}/promtool/${version}"
if [[ ! -x "${cache}/promtool" ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "${work}"' EXIT
    (cd "${work}" && apt-get download -q "prometheus=${version}" >&2) ||
        die "apt-get download prometheus=${version} failed (is the Debian mirror reachable?)"
    dpkg-deb -x "${work}"/prometheus_*.deb "${work}/root"
    mkdir -p "${cache}"
    install -m 0755 "${work}/root/usr/bin/promtool" "${cache}/promtool.tmp"
    mv -f "${cache}/promtool.tmp" "${cache}/promtool"
fi
"${cache}/promtool" --version >/dev/null 2>&1 || die "${cache}/promtool does not run"
echo "${cache}/promtool"
