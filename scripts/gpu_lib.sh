# The helpers of scripts/gpu (sourced by it): the deadline, the summary, the tarballs, the GPU test
# binaries and compute-sanitizer. They read scripts/gpu's globals: root, build, out, logs, more, parts,
# deadline, status (which they set to 1 on a failure).
# Seconds to the deadline.
left() { echo $(( deadline - $(date +%s) )); }
# Runs "$@" under the time left (minus a margin for packing); false without running when too little is left.
bounded() {
  local l; l=$(( $(left) - 10 ))
  if [ "$l" -lt 20 ]; then echo "skipped (deadline): $*" >&2; return 124; fi
  timeout "$l" "$@"
}
has() { [[ " $parts " == *" $1 "* ]]; }
note() { echo "$*" | tee -a "$out/summary.txt"; }
# The tarballs, so whatever ran comes back even when a part fails (scripts/gpu traps EXIT with it).
pack() {
  tar -czf "$out/logs.tgz" -C "$build" logs 2>/dev/null
  if [ -n "$(ls -A "$more")" ]; then tar -czf "$out/more.tgz" -C "$build" more; fi
}
# Times "$@" (a bench) into $logs/NAME.log and notes "LABEL: N s"; a failure sets status.
timed() {  # timed NAME LABEL CMD...
  local name=$1 label=$2 t0; shift 2
  t0=$(date +%s)
  bounded "$@" >"$logs/$name.log" 2>&1 || status=1
  note "$label: $(( $(date +%s) - t0 )) s"
}
# The GPU test binaries (tests/cuda/<room>/test_*.cu and tests/*/test_*_gpu.cpp), built in $build.
gpu_tests() {
  local f n
  for f in "$root"/tests/cuda/*/test_*.cu "$root"/tests/*/test_*_gpu.cpp; do
    n=$(basename "$f"); n=${n%.*}
    if [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $n "* ]]; then continue; fi
    [ -x "$build/$n" ] && echo "$n"
  done
}
# Runs every GPU test binary once (env and gtest filter as given); notes failures and figures.
run_gpu_tests() {  # run_gpu_tests TAG [ENV...]
  local tag=$1 t log rc; shift
  for t in $(gpu_tests); do
    log=$logs/$tag-$t.log
    t0=$(date +%s)
    bounded env "$@" "$build/$t" --gtest_filter="${FILTER:-*}" >"$log" 2>&1; rc=$?
    if [ "$rc" -eq 0 ]; then
      note "$tag $t: ok ($(grep -E '^\[  PASSED  \]' "$log" | tail -1 | sed 's/\[  PASSED  \] //'); $(( $(date +%s) - t0 )) s)"
    else
      note "$tag $t: FAILED (rc $rc, $(( $(date +%s) - t0 )) s)"; status=1
      grep -E "^\[  FAILED  \]|Failure|skipped \(deadline\)" "$log" | head -12 | tee -a "$out/summary.txt"
    fi
    # Per-test figures (errors, routing audits, seeds) for the committed summary.
    grep -E "seed|max \|err\||routing decisions|routing bug|over the bound|prompt +[0-9]+ \(|cuda-(mk|ops)," "$log" \
      | head -40 >>"$out/summary.txt"
  done
}
# compute-sanitizer TOOL on one binary and filter, with a long wait bound (the tools are slow).
sanitize_one() {  # sanitize_one TOOL PROG FILTER
  local tool=$1 prog=$2 filter=$3 log rc
  log=$logs/sanitize-$prog-$tool-$(echo "$filter" | tr -c 'a-zA-Z0-9' '_').log
  t0=$(date +%s)
  bounded env MEGADECODE_WAIT_TIMEOUT_MS=120000 compute-sanitizer --tool "$tool" --error-exitcode 99 \
    ${SANITIZER_FLAGS:-} "$build/$prog" --gtest_filter="$filter" >"$log" 2>&1; rc=$?
  local dt=$(( $(date +%s) - t0 )) summary
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    note "compute-sanitizer $tool $prog $filter: clean ($dt s; $summary)"; return
  fi
  if [ "$tool" = racecheck ] && ! grep -qE "^\[  FAILED  \]|skipped \(deadline\)" "$log" && [ -n "$summary" ]; then
    # A pattern counts as known only when the probe showed it on its provably ordered code.
    read -r ring tables other < <(python3 "$root/scripts/racecheck_classes.py" "$log" \
      --probe-ring "${probe_ring:-0}" --probe-tables "${probe_tables:-0}")
    if [ "$other" -eq 0 ] && [ $(( ring + tables )) -gt 0 ]; then
      note "compute-sanitizer racecheck $prog $filter: clean but for $ring page-ring refill and $tables routing-table handoff report(s), the patterns shown on test_racecheck_probe ($dt s; $summary)"
      return
    fi
    note "compute-sanitizer racecheck $prog $filter: FAILED ($dt s; $ring page-ring refill, $tables routing-table and $other other report(s))"
  else
    note "compute-sanitizer $tool $prog $filter: FAILED (rc $rc, $dt s)"
  fi
  status=1
  # Each distinct hazard once, with its source line (-lineinfo builds).
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race reported|Barrier|Uninitialized|FAILED|skipped" "$log" \
    | sed 's/+0x[0-9a-f]*//' | sort | uniq -c | sort -rn | head -12 | tee -a "$out/summary.txt"
  grep -E "^=+ +(at|in|and) .*\.(cuh|cu|h):[0-9]+" "$log" | sed 's/^=* *//; s/+0x[0-9a-f]*//' | sort | uniq -c \
    | sort -rn | head -16 | tee -a "$out/summary.txt"
}
# racecheck on the probes: the tool's reports on the ordered page ring and on the routing tables
# handed over through mbarriers (probe_ring / probe_tables > 0 when they show).
race_probe() {
  local log=$logs/sanitize-probe-racecheck.log
  bounded compute-sanitizer --tool racecheck "$build/test_racecheck_probe" >"$log" 2>&1
  if ! grep -q "^\[  PASSED  \]" "$log"; then
    note "racecheck probe: its checks FAILED (see $log): nothing is classed as known"; status=1; probe_ring=0; probe_tables=0
    return
  fi
  read -r probe_ring probe_tables probe_other < <(python3 "$root/scripts/racecheck_classes.py" "$log")
  note "racecheck probe (every word checked, tests pass): $probe_ring page-ring refill, $probe_tables routing-table handoff, $probe_other other report(s)"
}
