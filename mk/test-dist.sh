#!/usr/bin/env bash
# `make test-dist`: what a user gets from a fresh clone of the current commit.
#
#  1. `make dist` in the clone: the tarball and its .sha256 check out, it
#     holds exactly the files mk/dist.sh lists, their SHA256SUMS check out,
#     and BUILDINFO says which glibc it needs (at most Debian 12's 2.36).
#  2. `make install PREFIX=<tmp>/opt/tb` in the clone: the module, the
#     exporter script and a redis.conf.example that loads the module from
#     there.
#  3. On every SERVER: the tarball's libtb.so loads (MODULE LIST shows the
#     crate's version; TB.CONSUME answers), and the installed
#     redis.conf.example starts a server with the module and its settings.
#  4. `make run PORT=...` serves the module, and refuses a taken port with
#     the name and pid of what holds it.
#
# Only committed files are in the clone (uncommitted changes are not
# tested). The clone's target/release starts as a copy of this checkout's,
# so that cargo reuses the compiled dependencies it finds up to date (the
# same Cargo.lock) instead of spending minutes on them; the clone's own code
# is always rebuilt from its sources. Every server gets a free loopback port
# and a start-up deadline, and is stopped by pid.
#
#   mk/test-dist.sh SERVER...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: mk/test-dist.sh SERVER..." >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deadline_s=20
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tb-dist-test.XXXXXX")
pids=()
run_port=

cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  # `make run`'s server is a child of make: stop it by its port.
  [ -z "$run_port" ] || redis-cli -p "$run_port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# Waits until PORT answers PING; fails (with LOG's tail) past the deadline
# or if PID exits.
wait_ping() {
  local port=$1 pid=$2 log=$3 end=$((SECONDS + deadline_s))
  until [ "$(redis-cli -p "$port" PING 2>/dev/null)" = PONG ]; do
    kill -0 "$pid" 2>/dev/null || { tail -n 20 "$log" >&2; fail "server pid $pid exited during start-up"; }
    [ $SECONDS -lt $end ] || { tail -n 20 "$log" >&2; fail "no PING answer on port $port within ${deadline_s}s"; }
    sleep 0.1
  done
}

# Stops PID (SIGTERM, then SIGKILL past the deadline) and reaps it.
stop() {
  local pid=$1 end=$((SECONDS + deadline_s))
  kill "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $end ] || { kill -9 "$pid" 2>/dev/null || true; break; }
    sleep 0.1
  done
  wait "$pid" 2>/dev/null || true
}

# FIELD of the tb module in MODULE LIST on PORT (Redis 8 lists its own
# modules too).
tb_module_field() {
  redis-cli -p "$1" MODULE LIST \
    | awk -v f="$2" 'prev == "name" {mod = $0} prev == f && mod == "tb" {print; exit} {prev = $0}'
}

expect() { # expect WHAT GOT WANT
  [ "$2" = "$3" ] || fail "$1: got '$2', want '$3'"
}

# --- 1. make dist from a fresh clone ---------------------------------------
commit=$(git -C "$root" rev-parse HEAD)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  echo "note: testing commit $commit; uncommitted changes are not in the clone"
fi
git clone --quiet --no-local "$root" "$tmp/src"
git -C "$tmp/src" checkout --quiet "$commit"
if [ -d "$root/target/release" ]; then
  mkdir -p "$tmp/src/target"
  cp -a "$root/target/release" "$tmp/src/target/release"
fi
make -C "$tmp/src" --no-print-directory dist >"$tmp/dist.log" 2>&1 \
  || { tail -n 30 "$tmp/dist.log" >&2; fail "make dist in a fresh clone"; }
grep -q "Compiling tb v[0-9.]* ($tmp/src)" "$tmp/dist.log" \
  || { cat "$tmp/dist.log" >&2; fail "make dist did not compile tb from the clone's sources"; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$tmp/src/Cargo.toml" | head -n1)
name="tb-$version-linux-$(uname -m)"
tarball="$tmp/src/target/dist/$name.tar.gz"
[ -f "$tarball" ] || fail "no $tarball"
(cd "$tmp/src/target/dist" && sha256sum --quiet -c "$name.tar.gz.sha256") || fail "tarball checksum"
mkdir "$tmp/x"
tar -xzf "$tarball" -C "$tmp/x"
expect "tarball contents" "$(cd "$tmp/x" && find . -type f | sort | tr '\n' ' ')" \
  "./$name/BUILDINFO ./$name/LICENSE ./$name/README.md ./$name/SHA256SUMS ./$name/libtb.so ./$name/redis.conf.example ./$name/tb-metrics.lua "
(cd "$tmp/x/$name" && sha256sum --quiet -c SHA256SUMS) || fail "SHA256SUMS inside the tarball"
buildinfo=$tmp/x/$name/BUILDINFO
grep -q "^version: $version$" "$buildinfo" || fail "BUILDINFO version: $(cat "$buildinfo")"
grep -q "^commit: $commit$" "$buildinfo" || fail "BUILDINFO commit: $(cat "$buildinfo")"
grep -q '^rustc: rustc [0-9]' "$buildinfo" || fail "BUILDINFO rustc: $(cat "$buildinfo")"
needs=$(sed -n 's/^needs: glibc \([0-9.]*\) or newer.*/\1/p' "$buildinfo")
[ -n "$needs" ] || fail "BUILDINFO says no glibc: $(cat "$buildinfo")"
[ "$(printf '%s\n2.36\n' "$needs" | sort -V | tail -n1)" = 2.36 ] \
  || fail "the module needs glibc $needs, newer than Debian 12's 2.36"
ok "make dist: $name.tar.gz (needs glibc $needs), sums and contents check out"

# --- 2. make install --------------------------------------------------------
prefix=$tmp/opt/tb
make -C "$tmp/src" --no-print-directory install PREFIX="$prefix" >"$tmp/install.log" 2>&1 \
  || { tail -n 30 "$tmp/install.log" >&2; fail "make install PREFIX=$prefix"; }
[ -x "$prefix/libtb.so" ] || fail "no $prefix/libtb.so"
grep -qx "loadmodule $prefix/libtb.so" "$prefix/redis.conf.example" || fail "installed config does not load $prefix/libtb.so"
cmp -s "$prefix/libtb.so" "$tmp/x/$name/libtb.so" || fail "installed module differs from the tarball's"
cmp -s "$prefix/tb-metrics.lua" "$tmp/x/$name/tb-metrics.lua" || fail "installed exporter script differs from the tarball's"
ok "make install PREFIX=$prefix"

# --- 3. both load on every server --------------------------------------------
ver_number=$(awk -F. '{print $1 * 10000 + $2 * 100 + $3}' <<<"$version")
for server in "$@"; do
  [ -x "$server" ] || fail "server $server not found (make test installs every server)"
  label=$("$server" --version | cut -d' ' -f1-3)

  port=$(free_port); dir=$tmp/run-$port; mkdir -p "$dir"
  "$server" --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --logfile "$dir/log" \
    --loadmodule "$tmp/x/$name/libtb.so" --enable-module-command yes >/dev/null 2>&1 &
  pid=$!; pids+=("$pid")
  wait_ping "$port" "$pid" "$dir/log"
  expect "$label: MODULE LIST ver" \
    "$(tb_module_field "$port" ver)" "$ver_number"
  expect "$label: TB.CONSUME" "$(redis-cli -p "$port" TB.CONSUME k 1 5 | head -n1)" 1
  stop "$pid"
  ok "$label loads the tarball's libtb.so (ver $ver_number)"

  port=$(free_port); dir=$tmp/run-$port; mkdir -p "$dir"
  "$server" "$prefix/redis.conf.example" --port "$port" --dir "$dir" --logfile "$dir/log" \
    --enable-module-command yes >/dev/null 2>&1 &
  pid=$!; pids+=("$pid")
  wait_ping "$port" "$pid" "$dir/log"
  expect "$label: module path" \
    "$(tb_module_field "$port" path)" "$prefix/libtb.so"
  expect "$label: tb.max-wait-ms from the config" \
    "$(redis-cli -p "$port" CONFIG GET tb.max-wait-ms | tail -n1)" 10000
  stop "$pid"
  ok "$label starts with the installed redis.conf.example"
done

# --- 4. make run --------------------------------------------------------------
server=$1
port=$(free_port); dir=$tmp/held; mkdir -p "$dir"
"$server" --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --logfile "$dir/log" >/dev/null 2>&1 &
holder=$!; pids+=("$holder")
wait_ping "$port" "$holder" "$dir/log"
if REDIS_SERVER=$server make -C "$tmp/src" --no-print-directory run PORT="$port" >"$tmp/run-taken.log" 2>&1; then
  fail "make run on a taken port succeeded"
fi
grep -q "port $port is already in use" "$tmp/run-taken.log" || fail "make run, taken port: $(cat "$tmp/run-taken.log")"
grep -q "(pid $holder)" "$tmp/run-taken.log" || fail "make run does not name pid $holder: $(cat "$tmp/run-taken.log")"
grep -q "make run PORT=" "$tmp/run-taken.log" || fail "make run does not suggest another port"
stop "$holder"
ok "make run PORT=$port refuses the taken port and names pid $holder"

port=$(free_port); run_port=$port
REDIS_SERVER=$server make -C "$tmp/src" --no-print-directory run PORT="$port" >"$tmp/run.log" 2>&1 &
runner=$!; pids+=("$runner")
wait_ping "$port" "$runner" "$tmp/run.log"
redis-cli -p "$port" INFO modules | grep -q "^module:name=tb,ver=$ver_number," \
  || fail "make run: no tb $ver_number in INFO modules"
redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
end=$((SECONDS + deadline_s))
while kill -0 "$runner" 2>/dev/null; do
  [ $SECONDS -lt $end ] || fail "make run did not exit after SHUTDOWN"
  sleep 0.1
done
run_port=
ok "make run PORT=$port serves the module"
echo "test-dist: all checks passed"
