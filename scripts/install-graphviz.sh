#!/bin/sh
# Kept for anyone who calls it: the set-up now runs scripts/install-system-deps.sh.
exec sh "$(dirname "$0")/install-system-deps.sh"
