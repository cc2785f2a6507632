#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 60) with libFuzzer (nightly + cargo-fuzz),
# starting from the seeds of fuzz/seed.sh, and prints runs, coverage and crashes per target.
# Crashing inputs are left in fuzz/artifacts/<target>/ (reproduce: cargo +nightly fuzz run
# <target> fuzz/artifacts/<target>/<file>). Exits non-zero if any target crashed.
#   usage: fuzz/run.sh [SECONDS] [TARGET...]
# FUZZ_TARGET_DIR=DIR builds into DIR instead of fuzz/target (to share a build cache).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
"$here/seed.sh" >/dev/null
mkdir -p "$here/logs"
failed=0
summary=()
for t in "${targets[@]}"; do
  echo "==> $t (${secs}s)"
  log="$here/logs/$t.log"
  before=$(ls "$here/artifacts/$t" 2>/dev/null | wc -l)
  cargo +nightly fuzz run ${FUZZ_TARGET_DIR:+--target-dir "$FUZZ_TARGET_DIR"} "$t" "$here/corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 \
    >"$log" 2>&1
  rc=$?
  after=$(ls "$here/artifacts/$t" 2>/dev/null | wc -l)
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -oE '(#[0-9]+\s+(DONE|pulse|NEW|REDUCE).*cov: [0-9]+ ft: [0-9]+)' "$log" | tail -1 \
    | sed -E 's/.*cov: ([0-9]+) ft: ([0-9]+).*/cov \1, ft \2/')
  crashes=$((after - before))
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then failed=1; fi
  summary+=("$(printf '%-14s runs %-10s %-22s crashes %s (exit %s, log %s)' \
    "$t" "${runs:-?}" "${cov:-cov ?}" "$crashes" "$rc" "${log#"$PWD"/}")")
done
echo
printf '%s\n' "${summary[@]}"
exit $failed
