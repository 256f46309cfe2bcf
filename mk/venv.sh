#!/usr/bin/env bash
# Creates the Python virtual environment DIR with `python3 -m venv`, unless it
# exists. When the venv module is missing (Debian's python3-venv), installs it
# with apt-get as root, or prints the command to run and fails.
#
#   mk/venv.sh DIR
set -euo pipefail
dir=${1:?usage: mk/venv.sh DIR}
[ -x "$dir/bin/python" ] && exit 0
echo "==> creating $dir"
if python3 -m venv "$dir" >/dev/null 2>&1; then
  exit 0
fi
rm -rf "$dir"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: python3 -m venv failed; install python3-venv with:" >&2
  echo "  sudo apt-get install -y python3-venv" >&2
  exit 1
fi
echo "==> installing python3-venv"
apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y python3-venv
python3 -m venv "$dir"
