#!/bin/sh
# Install Graphviz's `dot` (Debian package graphviz), or say clearly how to.
set -u
if command -v dot >/dev/null 2>&1; then exit 0; fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
fi
if command -v apt-get >/dev/null 2>&1; then
    echo "introspect set-up: installing Graphviz (apt-get install graphviz) ..."
    if $SUDO apt-get update -qq >/dev/null && \
       DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq graphviz >/dev/null; then
        command -v dot >/dev/null 2>&1 && exit 0
    fi
fi
echo "introspect set-up: could not install Graphviz's 'dot'. Install it yourself" >&2
echo "  (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz)," >&2
echo "  then run the command again. Drawing needs it; tracing and diff do not." >&2
exit 1
