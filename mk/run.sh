#!/usr/bin/env bash
# `make run`: redis-server in the foreground on 127.0.0.1:PORT with the
# repository's redis.conf.example, loading MODULE (the fresh build) in place
# of the installed /opt/tb/libtb.so that the file names, data in ./data.
#
# When PORT is taken, says what holds it and what to do instead of letting
# redis-server fail with "Address already in use". The usual case: on Debian
# with systemd, `apt-get install redis-server` starts the stock server (which
# cannot run TB.* commands) on 6379.
#
#   mk/run.sh PORT MODULE
set -euo pipefail
port=${1:?usage: mk/run.sh PORT MODULE}
module=${2:?usage: mk/run.sh PORT MODULE}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
server=${REDIS_SERVER:-redis-server}

case $port in
  ''|*[!0-9]*) echo "error: PORT must be a number, got '$port'" >&2; exit 2 ;;
esac

# Something listening on 127.0.0.1:PORT or on every address?
taken() {
  if command -v ss >/dev/null 2>&1; then
    [ -n "$(ss -ltnH "sport = :$port")" ]
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
  fi
}

if taken; then
  {
    echo "error: port $port is already in use, so Redis with the module cannot listen there."
    if command -v ss >/dev/null 2>&1; then
      holders=$(ss -ltnpH "sport = :$port" | grep -o '"[^"]*",pid=[0-9]*' | sort -u \
                | sed 's/"\(.*\)",pid=\(.*\)/"\1" (pid \2)/' | paste -sd, - || true)
      echo "  It is held by: ${holders:-a process of another user (run: sudo ss -ltnp 'sport = :$port')}"
      if grep -q '"redis-server"\|"valkey-server"' <<<"$holders"; then
        if timeout 2 redis-cli -p "$port" COMMAND INFO tb.consume 2>/dev/null | grep -q '^tb.consume$'; then
          echo "  That server already has the tb module (an earlier 'make run'?): use it, or stop it."
        else
          echo "  That is a Redis (or Valkey) server without this module: 'redis-cli -p $port TB.CONSUME ...'"
          echo "  there answers \"ERR unknown command\". On Debian, 'apt-get install redis-server' starts"
          echo "  one on 6379 through systemd; stop it with: sudo systemctl disable --now redis-server"
        fi
      fi
    else
      echo "  See what holds it with: ss -ltnp 'sport = :$port' (Debian package iproute2)"
    fi
    echo "  Or run on another port: make run PORT=$((port + 1)), then redis-cli -p $((port + 1))"
  } >&2
  exit 1
fi

mkdir -p "$root/data"
# redis.conf.example names the installed module; load the fresh build instead.
sed "s|^loadmodule /opt/tb/libtb.so|loadmodule $module|" "$root/redis.conf.example" >"$root/data/redis.conf"
grep -q "^loadmodule $module" "$root/data/redis.conf" || {
  echo "error: redis.conf.example has no 'loadmodule /opt/tb/libtb.so' line to replace" >&2
  exit 1
}
echo "==> $server $root/data/redis.conf --port $port (data in $root/data; Ctrl-C stops it)"
exec "$server" "$root/data/redis.conf" --port "$port" --dir "$root/data"
