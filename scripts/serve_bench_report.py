#!/usr/bin/env python3
"""Merges the per-run JSON files of scripts/serve_bench (RAW_DIR/<backend>__<scenario>.json, written
by `megadecode bench serve --json`) into one JSON (one record per scenario and backend, the
decode-stall runs, the agent runs (scenario g), and the first / second backend ratios per scenario)
and a markdown table.
Several RAW_DIRs merge (e.g. one device call per backend); a later file wins a duplicate."""
import argparse
import json
import math
import pathlib
import sys

SCENARIO_ORDER = ["a", "b", "c", "d", "e", "f", "g", "stall"]


def load_runs(dirs):
    runs = {}
    for d in dirs:
        for path in sorted(pathlib.Path(d).glob("*__*.json")):
            backend, scenario = path.stem.split("__", 1)
            try:
                runs[(backend, scenario)] = json.loads(path.read_text())
            except (OSError, ValueError) as e:
                print(f"serve_bench_report: skipping {path}: {e}", file=sys.stderr)
    return runs


def scenario_record(backend, scenario, j):
    rate = j["request_rate"]
    e2el_s = j["e2el"]["mean_ms"] / 1e3
    return {
        "scenario": scenario,
        "backend": backend,
        "concurrency": j["concurrency"],
        "request_rate": rate,
        "input_len": j["input_len"],
        "output_len": j["output_len"],
        "num_prompts": j["num_prompts"],
        "completed": j["completed"],
        "failed": j["failed"],
        "duration_s": j["duration_s"],
        "ttft_ms_p50": j["ttft"]["median_ms"],
        "ttft_ms_mean": j["ttft"]["mean_ms"],
        "ttft_ms_p99": j["ttft"]["p99_ms"],
        "tpot_ms_mean": j["tpot"]["mean_ms"],
        "tpot_ms_p50": j["tpot"]["median_ms"],
        "itl_ms_p50": j["itl"]["median_ms"],
        "itl_ms_p99": j["itl"]["p99_ms"],
        "e2el_ms_mean": j["e2el"]["mean_ms"],
        "output_tok_s": j["output_token_throughput"],
        "request_s": j["request_throughput"],
        "decode_tok_s_per_request": j["decode_tok_s_per_request"]["mean"],
        # Little's law: requests in the system on average (scenario e aims at ~8).
        "mean_running": j["request_throughput"] * e2el_s,
    }


def stall_record(backend, j):
    r = {k: j.get(k) for k in ("background_streams", "input_len", "output_len", "long_prompt_len", "before_tokens",
                               "complete", "error", "long_ttft_ms", "itl_p99_ratio", "itl_max_ratio",
                               "itl_p99_during_over_p50_before")}
    r = {"scenario": "stall", "backend": backend, **r}
    for w in ("before", "during"):
        if w in j:
            r[w] = {"window_ms": j[w]["window_ms"], "samples": j[w]["samples"],
                    **{f"itl_ms_{k}": v for k, v in j[w]["itl_ms"].items()}}
    return r


def agent_record(backend, j):
    r = {k: j.get(k) for k in ("conversations", "turns", "prefix_len", "append_min", "append_max", "output_len",
                               "complete", "error", "duration_s", "prompt_tokens", "cached_tokens",
                               "prefix_cache_hit_rate", "output_tokens", "output_token_throughput")}
    r = {"scenario": "g", "backend": backend, **r}
    for k in ("ttft_ms", "ttft_later_turns_ms"):
        if k in j:
            r.update({f"{k}_{q}": v for q, v in j[k].items()})
    return r


def ratio(a, b):
    return a / b if b else None


def build(runs, backends, expected, args):
    records, stalls, agents, missing = [], [], [], []
    seen = {s for _, s in runs}
    for scenario in [s for s in SCENARIO_ORDER if s in seen | expected] + sorted((seen | expected) - set(SCENARIO_ORDER)):
        for backend in backends:
            j = runs.get((backend, scenario))
            if j is None:
                missing.append(f"{backend}/{scenario}")
                continue
            if scenario == "stall" or j.get("mode") == "decode_stall":
                stalls.append(stall_record(backend, j))
            elif j.get("mode") == "agent":
                agents.append(agent_record(backend, j))
            else:
                records.append(scenario_record(backend, scenario, j))
    ratios = []
    if len(backends) >= 2:
        num, den = backends[0], backends[1]
        by = {(r["backend"], r["scenario"]): r for r in records}
        for scenario in dict.fromkeys(r["scenario"] for r in records):
            a, b = by.get((num, scenario)), by.get((den, scenario))
            if a and b:
                ratios.append({"scenario": scenario, "numerator": num, "denominator": den,
                               "decode_tok_s_per_request": ratio(a["decode_tok_s_per_request"], b["decode_tok_s_per_request"]),
                               "output_tok_s": ratio(a["output_tok_s"], b["output_tok_s"]),
                               "ttft_ms_p50": ratio(a["ttft_ms_p50"], b["ttft_ms_p50"]),
                               "tpot_ms_mean": ratio(a["tpot_ms_mean"], b["tpot_ms_mean"])})
    return {"preset": args.preset, "command": args.command, "serve_flags": args.serve_flags, "backends": backends,
            "records": records, "decode_stall": stalls, "agent": agents, "ratios": ratios, "missing": missing}


def fmt(v, digits=1):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if isinstance(v, str):
        return v
    return f"{v:.{digits}f}"


def markdown(out):
    lines = [f"Serving benchmark, preset `{out['preset']}`, backends {', '.join(out['backends'])}.",
             f"Command: `{out['command']}` (server flags `{out['serve_flags'].strip()}`)", ""]
    if out["records"]:
        lines += ["| scenario | backend | in / out | conc. | rate/s | done | TTFT p50 ms | TPOT mean ms | ITL p99 ms "
                  "| output tok/s | decode tok/s per req. | mean running |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in out["records"]:
            rate = r["request_rate"] if isinstance(r["request_rate"], str) else fmt(r["request_rate"], 2)
            out_len = "paired" if r["output_len"] == -1 else r["output_len"]  # PAIRED_WITH: a constrained run's lengths
            lines.append(f"| {r['scenario']} | {r['backend']} | {r['input_len']} / {out_len} | {r['concurrency']} "
                         f"| {rate} | {r['completed']}/{r['num_prompts']} | {fmt(r['ttft_ms_p50'])} | {fmt(r['tpot_ms_mean'], 2)} "
                         f"| {fmt(r['itl_ms_p99'], 2)} | {fmt(r['output_tok_s'])} | {fmt(r['decode_tok_s_per_request'])} "
                         f"| {fmt(r['mean_running'])} |")
        lines.append("")
    if out["ratios"]:
        num, den = out["ratios"][0]["numerator"], out["ratios"][0]["denominator"]
        lines += [f"| scenario | {num} / {den}: decode tok/s per request | output tok/s | TTFT p50 (lower is better) |",
                  "|---|---|---|---|"]
        for q in out["ratios"]:
            lines.append(f"| {q['scenario']} | {fmt(q['decode_tok_s_per_request'], 2)}x | {fmt(q['output_tok_s'], 2)}x "
                         f"| {fmt(q['ttft_ms_p50'], 2)}x |")
        lines.append("")
    if out["decode_stall"]:
        lines += ["Decode stall: stream inter-token latency (ms, p50 / p99 / max) before a long prompt arrives and "
                  "from its arrival to its first token.", "",
                  "| backend | streams | long prompt | long TTFT ms | before | during | p99 during / before "
                  "| p99 during / p50 before |",
                  "|---|---|---|---|---|---|---|---|"]
        for s in out["decode_stall"]:
            if not s.get("complete"):
                lines.append(f"| {s['backend']} | {s['background_streams']} | {s['long_prompt_len']} | incomplete: "
                             f"{s.get('error', '')} | | | | |")
                continue
            w = {k: " / ".join(fmt(s[k][f"itl_ms_{q}"], 1) for q in ("p50", "p99", "max")) for k in ("before", "during")}
            lines.append(f"| {s['backend']} | {s['background_streams']} | {s['long_prompt_len']} | {fmt(s['long_ttft_ms'])} "
                         f"| {w['before']} | {w['during']} | {fmt(s['itl_p99_ratio'], 2)}x "
                         f"| {fmt(s.get('itl_p99_during_over_p50_before'), 2)}x |")
        lines.append("")
    if out.get("agent"):
        lines += ["Agent (scenario g): conversations re-sending their history every turn over a shared prefix; "
                  "TTFT ms over every turn and over the turns after each conversation's first.", "",
                  "| backend | conversations x turns | prefix | +tokens a turn / out | TTFT p50 / p99 | later turns "
                  "p50 / p99 | prefix-cache hit rate | output tok/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for a in out["agent"]:
            if not a.get("complete"):
                lines.append(f"| {a['backend']} | {a['conversations']} x {a['turns']} | {a['prefix_len']} | incomplete: "
                             f"{a.get('error', '')} | | | | |")
                continue
            lines.append(f"| {a['backend']} | {a['conversations']} x {a['turns']} | {a['prefix_len']} "
                         f"| {a['append_min']}-{a['append_max']} / {a['output_len']} "
                         f"| {fmt(a.get('ttft_ms_p50'))} / {fmt(a.get('ttft_ms_p99'))} "
                         f"| {fmt(a.get('ttft_later_turns_ms_p50'))} / {fmt(a.get('ttft_later_turns_ms_p99'))} "
                         f"| {fmt(100 * a['prefix_cache_hit_rate'])} % | {fmt(a['output_token_throughput'])} |")
        lines.append("")
    if out["missing"]:
        lines += [f"Missing runs: {', '.join(out['missing'])}.", ""]
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("raw_dirs", nargs="+")
    p.add_argument("--backends", required=True, help="space-separated; ratios are first / second")
    p.add_argument("--scenarios", default="", help="space-separated; those absent are listed as missing")
    p.add_argument("--preset", default="")
    p.add_argument("--command", default="")
    p.add_argument("--serve-flags", default="")
    p.add_argument("--json", required=True)
    p.add_argument("--md", required=True)
    args = p.parse_args()
    runs = load_runs(args.raw_dirs)
    if not runs:
        print(f"serve_bench_report: no <backend>__<scenario>.json in {' '.join(args.raw_dirs)}", file=sys.stderr)
        return 1
    out = build(runs, args.backends.split(), set(args.scenarios.split()), args)
    pathlib.Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    text = markdown(out)
    pathlib.Path(args.md).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
