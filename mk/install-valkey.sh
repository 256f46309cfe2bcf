#!/usr/bin/env bash
# Installs Valkey (valkey-server, valkey-tools) with apt-get, unless
# valkey-server is already on PATH.
#
# Debian 12 (bookworm) has Valkey 8.0 only in its bookworm-backports suite.
# If apt does not list that suite yet, this adds it in its own file,
# /etc/apt/sources.list.d/bookworm-backports.sources, with the Debian mirror
# apt already uses. Backports have a low priority (100): apt takes nothing
# from them unless asked, so only this install uses the suite (`-t
# bookworm-backports`); the file stays so that `apt-get upgrade` brings
# Valkey's security fixes. Newer Debian releases have Valkey in their main
# suite and skip all of this.
#
# As root it runs the commands; otherwise it prints them and fails.
#
#   mk/install-valkey.sh
set -euo pipefail

command -v valkey-server >/dev/null 2>&1 && exit 0

codename=$( . /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
list=/etc/apt/sources.list.d/bookworm-backports.sources
commands=()
if [ "$codename" = bookworm ]; then
  if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
       /etc/apt/sources.list.d/*.sources; then
    # The mirror of the main bookworm suite, from deb822 or one-line sources.
    mirror=$(awk '/^URIs:/ {uri=$2} /^Suites:/ && / bookworm( |$)/ {print uri; exit}' \
               /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' \
                                   /etc/apt/sources.list 2>/dev/null || true)
    [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
    commands+=("printf '%s\\n' 'Types: deb' 'URIs: $mirror' 'Suites: bookworm-backports' 'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > $list")
  fi
  commands+=("apt-get update")
  commands+=("DEBIAN_FRONTEND=noninteractive apt-get install -y -t bookworm-backports valkey-server valkey-tools")
else
  commands+=("apt-get update")
  commands+=("DEBIAN_FRONTEND=noninteractive apt-get install -y valkey-server valkey-tools")
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "error: valkey-server is missing (a server every test suite runs against). As root, run:" >&2
  for c in "${commands[@]}"; do echo "  $c" >&2; done
  exit 1
fi
echo "==> installing Valkey (valkey-server, valkey-tools)"
for c in "${commands[@]}"; do
  echo "+ $c"
  sh -c "$c"
done
command -v valkey-server >/dev/null || { echo "error: valkey-server still not on PATH" >&2; exit 1; }
