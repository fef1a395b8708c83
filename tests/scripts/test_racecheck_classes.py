#!/usr/bin/env python3
"""scripts/racecheck_classes.py on racecheck logs written here: the page-ring refill and the
routing-table handoff are classed as known, every other hazard as other, a pattern the probe did not
show counts as other, and the command line prints the three counts."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)
import racecheck_classes as rc  # noqa: E402


def report(write_fn, read_fn, extra_reads=()):
    lines = [f"========= Error: Race reported between Write access at void {write_fn}(int)+0x1a0 in /src/a.cuh:10\n",
             f"=========     and Read access at void {read_fn}(int)+0x50 in /src/b.cuh:20 [4 hazards]\n"]
    lines += [f"=========     and Read access at {f}+0x10 in /src/c.cuh:30\n" for f in extra_reads]
    return lines


RING = report("issue_weights", "consume_page")
TABLES = report("compute_routing", "JobWalk::next")
OTHER = report("my_kernel", "my_kernel")
MIXED_TABLES = report("compute_routing", "JobWalk::next", extra_reads=["unrelated_read"])
SEP = ["=========\n", "[       OK ] Sanitize.Tiny (120 ms)\n"]


class RacecheckClasses(unittest.TestCase):
    def test_each_pattern(self):
        self.assertEqual(rc.classify(RING + SEP + TABLES + SEP + OTHER + SEP), (1, 1, 1))

    def test_reports_back_to_back(self):
        self.assertEqual(rc.classify(RING + TABLES + RING), (2, 1, 0))

    def test_a_foreign_side_makes_other(self):
        self.assertEqual(rc.classify(MIXED_TABLES), (0, 0, 1))
        self.assertEqual(rc.classify(report("issue_job", "x") + report("my_kernel", "x")), (1, 0, 1))

    def test_a_table_read_inlined_elsewhere_in_ops_or_gemm(self):
        # The function names another routine, the file the consumers' ops: still the tables' handoff.
        lines = ["========= Error: Race reported between Write access at void compute_routing(int)+0x1a0 in /src/routing.cuh:95\n",
                 "=========     and Read access at moe_combine(int)+0x50 in /src/cuda/megakernel/ops.cuh:288 [4 hazards]\n"]
        self.assertEqual(rc.classify(lines), (0, 1, 0))
        lines[1] = lines[1].replace("ops.cuh", "attention.cuh")
        self.assertEqual(rc.classify(lines), (0, 0, 1))

    def test_a_table_write_by_the_shared_top_k(self):
        # compute_routing's picks are written by cuda/common/moe.cuh write_picks, which the report names.
        lines = ["========= Error: Race reported between Read access at megadecode::cuda::mk::moe_combine(const "
                 "megadecode::cuda::MkParams &, int)+0x16cd0 in ops.cuh:288 =========     and Write access at "
                 "megadecode::cuda::write_picks(float, int, int, bool, int *, float *)+0x33260 in moe.cuh:75 [768 hazards]\n"]
        self.assertEqual(rc.classify(lines), (0, 1, 0))
        self.assertEqual(rc.classify([lines[0].replace("write_picks", "top_k_other")]), (0, 0, 1))

    def test_a_read_with_no_source_line(self):
        # The tool may place a read in the megakernel's body with no "in FILE:LINE" (the log of the
        # H100 quick run, 2026-12-07): against the routing tables' writers or a page refill it is the
        # known pattern; in any other kernel it is not.
        mk = "void megadecode::cuda::mk::megakernel<(int)1>(megadecode::cuda::MkParams, int)"
        tables = [f"========= Error: Race reported between Read access at {mk}+0x15160\n",
                  "=========     and Write access at [clone " + mk + "] megadecode::cuda::mk::compute_routing(const "
                  "megadecode::cuda::MkParams &, int, megadecode::cuda::mk::RouteSmem &)+0x33990 in routing.cuh:101 "
                  "[1056 hazards]\n"]
        ring = ["========= Error: Race reported between Write access at megadecode::cuda::ptx::bulk_g2s(void *, const "
                "void *, unsigned int, unsigned long *, unsigned long)+0x280e0 in ptx.cuh:86\n",
                f"=========     and Read access at {mk}+0x130d0 [1281664 hazards]\n",
                f"=========     and Read access at {mk}+0x13160 [95232 hazards]\n"]
        self.assertEqual(rc.classify(tables + SEP + ring + SEP), (1, 1, 0))
        other = [tables[0].replace("mk::megakernel<", "batched::step<"), tables[1]]
        self.assertEqual(rc.classify(other), (0, 0, 1))

    def test_no_reports(self):
        self.assertEqual(rc.classify(["========= RACECHECK SUMMARY: 0 hazards displayed\n"]), (0, 0, 0))

    def test_a_pattern_the_probe_did_not_show_is_other(self):
        lines = RING + SEP + TABLES + SEP
        self.assertEqual(rc.classify(lines, probe_ring=0, probe_tables=2), (0, 1, 1))
        self.assertEqual(rc.classify(lines, probe_ring=1, probe_tables=0), (1, 0, 1))
        self.assertEqual(rc.classify(lines, probe_ring=1, probe_tables=1), (1, 1, 0))

    def test_command_line(self):
        with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
            f.writelines(RING + SEP + OTHER)
        try:
            script = os.path.join(SCRIPTS, "racecheck_classes.py")
            out = subprocess.run([sys.executable, script, f.name], capture_output=True, text=True, check=True).stdout
            self.assertEqual(out.split(), ["1", "0", "1"])
            out = subprocess.run([sys.executable, script, f.name, "--probe-ring", "0", "--probe-tables", "0"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertEqual(out.split(), ["0", "0", "2"])
        finally:
            os.unlink(f.name)


if __name__ == "__main__":
    unittest.main()
