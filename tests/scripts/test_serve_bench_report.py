#!/usr/bin/env python3
"""scripts/serve_bench_report.py and scripts/serve_bench_rate.py on records written here: the merged
JSON (one record per scenario and backend, the stall run, first / second ratios, the missing runs),
its markdown table, a later folder winning a duplicate, and scenario e's rate from scenario b."""
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import serve_bench_rate  # noqa: E402


def run_record(tok_s, ttft=100.0, tpot=10.0, n_in=1000):
    dist = lambda m: {"mean_ms": m, "median_ms": m, "p99_ms": 2 * m}  # noqa: E731
    return {"request_rate": "inf", "concurrency": 4, "input_len": n_in, "output_len": 100, "num_prompts": 8,
            "completed": 8, "failed": 0, "duration_s": 2.0, "ttft": dist(ttft), "tpot": dist(tpot), "itl": dist(tpot),
            "e2el": dist(ttft + 99 * tpot), "output_token_throughput": tok_s, "request_throughput": 4.0,
            "decode_tok_s_per_request": {"mean": tok_s / 4}}


STALL = {"mode": "decode_stall", "background_streams": 4, "input_len": 64, "output_len": 256, "long_prompt_len": 8192,
         "before_tokens": 16, "complete": True, "long_ttft_ms": 300.0, "itl_p99_ratio": 1.5, "itl_max_ratio": 2.0,
         "itl_p99_during_over_p50_before": 1.8,
         "before": {"window_ms": 100, "samples": 50, "itl_ms": {"p50": 10.0, "p99": 12.0, "max": 13.0}},
         "during": {"window_ms": 300, "samples": 40, "itl_ms": {"p50": 11.0, "p99": 18.0, "max": 26.0}}}


class ServeBenchReport(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = pathlib.Path(self.tmp.name)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, folder, name, doc):
        (self.dir / folder).mkdir(exist_ok=True)
        (self.dir / folder / name).write_text(json.dumps(doc))

    def report(self, *folders, backends="x y", scenarios="a b stall"):
        out_json, out_md = self.dir / "out.json", self.dir / "out.md"
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "serve_bench_report.py"), *[str(self.dir / f) for f in folders],
                        "--backends", backends, "--scenarios", scenarios, "--preset", "tiny", "--command", "cmd",
                        "--json", str(out_json), "--md", str(out_md)], capture_output=True, text=True, check=True)
        return json.loads(out_json.read_text()), out_md.read_text()

    def test_merge_ratios_and_table(self):
        self.write("r1", "x__a.json", run_record(200.0))
        self.write("r1", "y__a.json", run_record(100.0))
        self.write("r1", "x__b.json", run_record(50.0))
        self.write("r2", "x__b.json", run_record(80.0))  # the later folder wins
        self.write("r2", "x__stall.json", STALL)
        out, md = self.report("r1", "r2")
        got = {(r["backend"], r["scenario"]): r["output_tok_s"] for r in out["records"]}
        self.assertEqual(got, {("x", "a"): 200.0, ("y", "a"): 100.0, ("x", "b"): 80.0})
        self.assertEqual([(q["scenario"], q["output_tok_s"]) for q in out["ratios"]], [("a", 2.0)])
        self.assertEqual([s["backend"] for s in out["decode_stall"]], ["x"])
        self.assertEqual(sorted(out["missing"]), ["y/b", "y/stall"])
        self.assertIn("| a | x | 1000 / 100 | 4 |", md)
        self.assertIn("| a | 2.00x |", md)
        self.assertIn("| x | 4 | 8192 | 300.0 | 10.0 / 12.0 / 13.0 | 11.0 / 18.0 / 26.0 | 1.50x | 1.80x |", md)
        self.assertIn("Missing runs:", md)

    def test_no_runs_fails(self):
        (self.dir / "empty").mkdir()
        r = subprocess.run([sys.executable, os.path.join(SCRIPTS, "serve_bench_report.py"), str(self.dir / "empty"),
                            "--backends", "x", "--json", str(self.dir / "o.json"), "--md", str(self.dir / "o.md")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)


class ServeBenchRate(unittest.TestCase):
    def test_littles_law(self):
        # 2000 in: TTFT 100 ms at 1000 -> 0.2 s; 199 more tokens at 10 ms -> 1.99 s; 8 / 2.19 s.
        self.assertAlmostEqual(serve_bench_rate.e_rate(run_record(1.0), 2000, 200), 8 / 2.19)
        self.assertAlmostEqual(serve_bench_rate.e_rate(run_record(1.0), 2000, 200, running=4), 4 / 2.19)

    def test_no_rate_without_b(self):
        self.assertIsNone(serve_bench_rate.e_rate({}, 2000, 200))
        self.assertIsNone(serve_bench_rate.e_rate(run_record(1.0, ttft=0.0, tpot=0.0), 2000, 200))
        self.assertIsNone(serve_bench_rate.e_rate(run_record(1.0, n_in=0), 2000, 200))

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = pathlib.Path(d) / "b.json"
            path.write_text(json.dumps(run_record(1.0)))
            script = os.path.join(SCRIPTS, "serve_bench_rate.py")
            out = subprocess.run([sys.executable, script, str(path), "2000", "200"], capture_output=True, text=True,
                                 check=True).stdout.strip()
            self.assertAlmostEqual(float(out), 8 / 2.19, places=5)
            out = subprocess.run([sys.executable, script, str(pathlib.Path(d) / "none.json"), "2000", "200"],
                                 capture_output=True, text=True, check=True).stdout.strip()
            self.assertEqual(out, "")


if __name__ == "__main__":
    unittest.main()
