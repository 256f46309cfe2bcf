#!/usr/bin/env bash
# Creates the Python virtual environment DIR with `python3 -m venv`, unless it
# exists. When the venv module is missing (Debian's python3-venv), installs it
# (mk/apt.sh: apt-get as root, else prints the command to run and fails).
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
"$(dirname "$0")/apt.sh" "python3 -m venv failed" python3-venv
python3 -m venv "$dir"
