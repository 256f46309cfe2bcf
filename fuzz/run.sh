#!/usr/bin/env bash
# Runs tb's libFuzzer targets for SECONDS each, two at a time, starting from
# the committed corpus (fuzz/corpus/<target>), and prints how many inputs
# each tried and how many crashes it found. Exits non-zero on any crash,
# hang or sanitizer report; the failing input is in fuzz/artifacts/<target>/.
#
#   fuzz/run.sh SECONDS [TARGET...]     (default: every target)
#
# Only stable Rust is installed here: cargo-fuzz passes nightly-only flags
# (-Zsanitizer=address, -Cpasses=sancov-module, ...), which stable rustc
# accepts with RUSTC_BOOTSTRAP=1. AddressSanitizer works that way too.
# New inputs found go to fuzz/target/corpus-run/<target>, never into the
# committed corpus (run `cargo fuzz cmin` by hand to fold them in).

set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
export RUSTC_BOOTSTRAP=1

secs=${1:?usage: fuzz/run.sh SECONDS [TARGET...]}
shift
if [ $# -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi
jobs=${FUZZ_JOBS:-2}

cargo fuzz build --sanitizer address 2>&1 | grep -Ev '^\s+(Compiling|Downloaded|Downloading)' || true
mkdir -p target/fuzz-logs

# One target: fuzz for $secs seconds, write "<target> <inputs> <status>" to
# target/fuzz-logs/<target>.result.
run_one() {
  local t=$1 scratch=target/corpus-run/$1 log=target/fuzz-logs/$1.log status=ok
  rm -rf "$scratch"
  mkdir -p "$scratch" "corpus/$t"
  if ! cargo fuzz run --sanitizer address "$t" "$scratch" "corpus/$t" -- \
      -max_total_time="$secs" -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    status=CRASH
  fi
  local runs
  runs=$(sed -n 's/^stat::number_of_executed_units: *\([0-9]*\).*/\1/p' "$log" | tail -n1)
  echo "$t ${runs:-0} $status" >"target/fuzz-logs/$t.result"
}

pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}"
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p"; done

total=0
crashes=0
printf '%-16s %14s  %s\n' target inputs result
for t in "${targets[@]}"; do
  read -r name runs status <"target/fuzz-logs/$t.result"
  printf '%-16s %14s  %s\n' "$name" "$runs" "$status"
  total=$((total + runs))
  if [ "$status" != ok ]; then
    crashes=$((crashes + 1))
    echo "---- tail of fuzz/target/fuzz-logs/$t.log ----"
    tail -n 40 "target/fuzz-logs/$t.log"
  fi
done
echo "fuzz: ${#targets[@]} targets, ${secs} s each: $total inputs tried, crashes found: $crashes"
[ "$crashes" -eq 0 ]
