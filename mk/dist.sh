#!/usr/bin/env bash
# `make dist`: the release tarball OUTDIR/NAME.tar.gz (and NAME.tar.gz.sha256)
# holding NAME/ with
#   libtb.so            the module (load it with `loadmodule /opt/tb/libtb.so`)
#   redis.conf.example  a configuration for it
#   tb-metrics.lua      the prometheus-redis-exporter script (docs/operations/metrics.md)
#   README.md LICENSE
#   BUILDINFO           version, commit, the Rust that built it, the glibc it
#                       was built against and the newest glibc symbol it needs
#   SHA256SUMS          of every file above (check: sha256sum -c SHA256SUMS)
#
# The archive is reproducible: sorted names, owner 0, every mtime the commit's
# time, gzip without a timestamp.
#
#   mk/dist.sh MODULE OUTDIR NAME
set -euo pipefail
module=${1:?usage: mk/dist.sh MODULE OUTDIR NAME}
outdir=${2:?usage: mk/dist.sh MODULE OUTDIR NAME}
name=${3:?usage: mk/dist.sh MODULE OUTDIR NAME}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

for tool in objdump sha256sum tar gzip; do
  command -v $tool >/dev/null || { echo "error: $tool is missing (Debian: binutils, coreutils, tar, gzip)" >&2; exit 1; }
done

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
dir=$stage/$name
mkdir -p "$dir"
install -m 0755 "$module" "$dir/libtb.so"
install -m 0644 "$root/redis.conf.example" "$root/README.md" "$root/LICENSE" \
  "$root/contrib/prometheus/tb-metrics.lua" "$dir/"

commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  commit="$commit (with uncommitted changes)"
fi
epoch=$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)
# The newest versioned glibc symbol the module links against: the oldest
# glibc that can load it.
needs=$(objdump -T "$dir/libtb.so" | grep -o 'GLIBC_[0-9.]*' | sort -u -V | tail -n1)
{
  echo "name: tb"
  echo "version: $(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)"
  echo "commit: $commit"
  echo "rustc: $(rustc --version)"
  echo "cargo: $(cargo --version)"
  echo "target: $(rustc -vV | sed -n 's/^host: //p')"
  echo "built on: $( . /etc/os-release && echo "$PRETTY_NAME"), glibc $(getconf GNU_LIBC_VERSION | awk '{print $2}')"
  echo "needs: glibc ${needs#GLIBC_} or newer (Debian 12 has 2.36)"
  echo "servers: Redis 7.0 or newer, Valkey 8.0 (docs/operations/install.md, \"Supported servers\")"
} >"$dir/BUILDINFO"
(cd "$dir" && sha256sum libtb.so redis.conf.example tb-metrics.lua README.md LICENSE BUILDINFO >SHA256SUMS)
find "$dir" -exec touch -h -d "@$epoch" {} +

mkdir -p "$outdir"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$stage" -cf - "$name" \
  | gzip -9 -n >"$outdir/$name.tar.gz"
(cd "$outdir" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "==> $outdir/$name.tar.gz"
cat "$dir/BUILDINFO"
