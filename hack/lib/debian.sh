# Sourced by the build scripts that install a missing Debian package themselves.
#
# debian_install PKG...: apt-get install PKG... (no recommends; output on stderr), refreshing the
# package lists and trying once more when the first try fails. Fails without apt-get.
debian_install() {
    command -v apt-get >/dev/null || return 1
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$@" >&2 ||
        { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends "$@" >&2; }
}
