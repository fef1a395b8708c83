#!/usr/bin/env python3
"""The Poisson request rate of scripts/serve_bench's scenario e: Little's law, rate = RUNNING / latency,
the latency of an IN/OUT request predicted from scenario b's measured TTFT (scaled by input length)
and TPOT.

  scripts/serve_bench_rate.py B_JSON IN OUT [--running 8]

prints the rate (requests/s), or nothing when B_JSON is missing or unreadable. Standard library only.
"""
import argparse
import json


def e_rate(b, n_in, n_out, running=8):
    """Requests/s that keep `running` requests in flight, from scenario b's record; None without one."""
    try:
        latency = b["ttft"]["mean_ms"] / 1e3 * n_in / b["input_len"] + (n_out - 1) * b["tpot"]["mean_ms"] / 1e3
    except (KeyError, TypeError, ZeroDivisionError):
        return None
    return running / latency if latency > 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("b_json")
    ap.add_argument("n_in", type=int)
    ap.add_argument("n_out", type=int)
    ap.add_argument("--running", type=float, default=8)
    a = ap.parse_args()
    try:
        with open(a.b_json) as f:
            b = json.load(f)
    except (OSError, ValueError):
        b = None
    rate = e_rate(b, a.n_in, a.n_out, a.running) if b is not None else None
    print(f"{rate:.6g}" if rate else "")


if __name__ == "__main__":
    main()
