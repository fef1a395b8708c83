#!/usr/bin/env python3
"""Summarises ncu's SASS source page of one kernel (scripts/gpu part `ncu`).

Input: the CSV of `ncu --import REP --page source --csv --print-source sass` (one row per SASS
instruction: address, source, executed counts, warp stall samples by reason).
Output: prints the stall reasons over the whole kernel, the code footprint (how many distinct
instructions ran, in bytes: what the instruction cache must hold) and the hottest instructions;
writes a compact CSV (offset from the first instruction, every numeric column) for offline
analysis against a local disassembly.

  ncu_source_summary.py SOURCE.csv OUT.csv.gz
"""
import csv
import gzip
import re
import sys


def number(s):
    s = s.replace(",", "").strip()
    try:
        return float(s)
    except ValueError:
        return None


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"#"') or l.startswith('"Address"') or "Address" in l), 0)
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    body = [r for r in rows[1:] if len(r) == len(header)]
    col = {h: i for i, h in enumerate(header)}
    addr_col = next((i for i, h in enumerate(header) if h.strip().lower() == "address"), None)
    src_col = next((i for i, h in enumerate(header) if h.strip().lower() == "source"), None)
    numeric = [i for i, h in enumerate(header) if i not in (addr_col, src_col) and any(number(r[i]) is not None for r in body[:50])]
    print("columns:", ", ".join(header))
    if addr_col is None or not body:
        print("no address column or no rows: nothing to summarise")
        return
    base = min(int(r[addr_col], 16) for r in body)
    exec_col = next((i for i in numeric if re.search(r"instructions executed", header[i], re.I) and "predicated" not in header[i].lower()), None)
    samp_cols = [i for i in numeric if re.search(r"stall|sampl", header[i], re.I)]
    with gzip.open(out, "wt", newline="") as g:
        w = csv.writer(g)
        w.writerow(["offset"] + [header[i] for i in numeric] + ["sass"])
        for r in body:
            w.writerow([int(r[addr_col], 16) - base] + [r[i] for i in numeric] + [r[src_col] if src_col is not None else ""])
    if exec_col is not None:
        ran = [r for r in body if (number(r[exec_col]) or 0) > 0]
        print(f"instructions: {len(body)} ({len(body) * 16 / 1024:.0f} KB of text); executed at least once: {len(ran)} "
              f"({len(ran) * 16 / 1024:.0f} KB)")
        for lo in (48, 48 * 8, 48 * 132):  # ran at least once per layer, per layer on 8 SMs, on every SM
            n = sum(1 for r in body if (number(r[exec_col]) or 0) >= lo)
            print(f"  executed >= {lo} times: {n} instructions ({n * 16 / 1024:.0f} KB)")
    totals = {header[i]: sum(number(r[i]) or 0 for r in body) for i in samp_cols}
    all_samples = max(totals.values()) if totals else 0
    print("stall samples:")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1])[:24]:
        print(f"  {k:60s} {v:12.0f} {100 * v / all_samples if all_samples else 0:6.1f} %")
    if samp_cols:
        key = max(samp_cols, key=lambda i: totals[header[i]])
        print(f"hottest instructions by {header[key]}:")
        for r in sorted(body, key=lambda r: -(number(r[key]) or 0))[:30]:
            e = r[exec_col] if exec_col is not None else "?"
            print(f"  +{int(r[addr_col], 16) - base:6x} {number(r[key]) or 0:9.0f} exec={e:>10s} {r[src_col] if src_col is not None else ''}")


if __name__ == "__main__":
    main()
