#!/bin/sh
# The system packages introspect's set-up wants, through apt-get where possible:
#   graphviz  (required for drawings: the `dot` program)
#   chromium  (optional: the test that screenshots diff.html in a headless browser)
# Best effort: anything that cannot be installed is said clearly, with how to install it
# yourself; only a missing `dot` fails the set-up.
set -u
SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
UPDATED=""

apt_install() {  # apt_install PACKAGE: 0 when installed
    command -v apt-get >/dev/null 2>&1 || return 1
    if [ -z "$UPDATED" ]; then
        $SUDO apt-get update -qq >/dev/null 2>&1 || return 1
        UPDATED=1
    fi
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$1" \
        >/dev/null 2>&1
}

status=0
if ! command -v dot >/dev/null 2>&1; then
    echo "introspect set-up: installing Graphviz (apt-get install graphviz) ..."
    if ! apt_install graphviz || ! command -v dot >/dev/null 2>&1; then
        echo "introspect set-up: could not install Graphviz's 'dot'. Install it yourself" >&2
        echo "  (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz)," >&2
        echo "  then run the command again. Drawing needs it; tracing and diff do not." >&2
        status=1
    fi
fi
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    echo "introspect set-up: installing Chromium for the diff.html screenshot test ..."
    if ! apt_install chromium; then
        echo "introspect set-up: Chromium not installed (optional): the test that screenshots" >&2
        echo "  diff.html will be skipped. Debian/Ubuntu: apt-get install chromium." >&2
    fi
fi
exit $status
