#!/usr/bin/env bash
# The one place that installs Debian packages: with apt-get when run as
# root; otherwise prints the exact command to run and fails. Does nothing
# when no package is given (callers pass the list of what is missing).
#
#   mk/apt.sh "WHAT IT IS FOR" [PACKAGE...]
set -euo pipefail
what=${1:?usage: mk/apt.sh "WHAT IT IS FOR" [PACKAGE...]}
shift
[ $# -gt 0 ] || exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "error: missing $* ($what). Install with:" >&2
  echo "  sudo apt-get install -y $*" >&2
  exit 1
fi
echo "==> installing $* ($what)"
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y "$@"
