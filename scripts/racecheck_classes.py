#!/usr/bin/env python3
"""Classes compute-sanitizer racecheck reports (scripts/gpu's sanitize and quick parts).

  scripts/racecheck_classes.py LOG [--probe-ring N] [--probe-tables N]

prints "RING TABLES OTHER": how many of LOG's "Race reported between" reports are
  RING    a bulk copy refilling a page-ring slot against the generic reads of its previous contents
          (ordered through an mbarrier and fence.proxy.async, which the tool does not follow),
  TABLES  the consumers' reads of the routing tables against the loader warp's writes of them
          (an mbarrier one way, the step's counters the other),
  OTHER   every other hazard.
With --probe-ring / --probe-tables (the counts test_racecheck_probe's log gave), a pattern the probe
did not show (count 0) is not known: its reports count as OTHER. Standard library only.
"""
import argparse
import os
import re

BULK = r"bulk_g2s|issue_job|walk_pages|issue_weights|issue_activations|cp\.async\.bulk"
TABLE_W = r"compute_routing|routing\.cuh|write_picks|table_probe"  # the loader warp's routing-table writes
# (write_picks: the shared top-k of cuda/common/moe.cuh, inlined into compute_routing) and the probe's
TABLE_R = r"JobWalk|share_of|ops\.cuh|gemm\.cuh|table_probe"  # the consumers' reads of them
# A read the tool places in the megakernel's body with no source line (code it cannot attribute to
# an inlined routine): one of the consumers' reads, the only reads of what compute_routing writes.
MK_BODY = r"^void megadecode::cuda::mk::megakernel<"


def classify_report(text):
    """'ring', 'tables' or 'other' for one report (its lines joined)."""
    # Each side as "function file" (the function's name or its file may name the pattern: a consumer's
    # read of the tables inlined into another routine of ops.cuh or gemm.cuh names that routine).
    # A side the tool gives no source line reads "... at FUNCTION+0xOFFSET" with no " in FILE:LINE".
    sides = [(k, f"{fn} {os.path.basename(path)}" if path else fn)
             for k, fn, path in re.findall(
                 r"(Read|Write) access at (.*?\+0x[0-9a-f]+)(?: in (\S+?):\d+)?(?= \[|\s*=|\s*$)", text)]
    reads = [f for k, f in sides if k == "Read"]
    writes = [f for k, f in sides if k == "Write"]
    if writes and reads and all(re.search(BULK, f) for f in writes):
        return "ring"
    if (writes and reads and all(re.search(TABLE_W, f) for f in writes) and
            all(re.search(TABLE_R, f) or re.search(MK_BODY, f) for f in reads)):
        return "tables"
    return "other"


def reports(lines):
    """Each report's text: its "Race reported between" line and the "and ..." lines after it."""
    block = []
    for line in lines:
        if "Race reported between" in line:
            if block:
                yield " ".join(block)
            block = [line]
        elif block and re.search(r"^=+\s+and ", line):
            block.append(line)
        elif block:
            yield " ".join(block)
            block = []
    if block:
        yield " ".join(block)


def classify(lines, probe_ring=None, probe_tables=None):
    """(ring, tables, other) over the reports in lines; a pattern the probe did not show counts as other."""
    counts = {"ring": 0, "tables": 0, "other": 0}
    for text in reports(lines):
        counts[classify_report(text)] += 1
    ring, tables, other = counts["ring"], counts["tables"], counts["other"]
    if probe_ring is not None and probe_ring <= 0:
        other, ring = other + ring, 0
    if probe_tables is not None and probe_tables <= 0:
        other, tables = other + tables, 0
    return ring, tables, other


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--probe-ring", type=int)
    ap.add_argument("--probe-tables", type=int)
    a = ap.parse_args()
    with open(a.log, errors="replace") as f:
        print(*classify(f, a.probe_ring, a.probe_tables))


if __name__ == "__main__":
    main()
