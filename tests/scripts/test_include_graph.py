#!/usr/bin/env python3
"""scripts/include_graph.py: the floor plan of a small tree written here (rooms, floors, the cuda
rooms apart, a loop reported), --check against a document, and docs/architecture.md against src/
itself (the document stays true to the code)."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "include_graph.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import include_graph as ig  # noqa: E402


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


class IncludeGraph(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.src = os.path.join(self.tmp.name, "src")
        write(os.path.join(self.src, "core/a.h"), "#pragma once\n")
        write(os.path.join(self.src, "model/m.h"), '#include "core/a.h"\n#include <vector>\n')
        write(os.path.join(self.src, "cuda/common/k.cuh"), '#include "core/a.h"\n')
        write(os.path.join(self.src, "cuda/gemm/g.cu"), '#include "cuda/common/k.cuh"\n#include "model/m.h"\n')
        write(os.path.join(self.src, "cli/main.cpp"), '#include "cuda/gemm/g.cu"\n#include "../core/a.h"\n')

    def tearDown(self):
        self.tmp.cleanup()

    def test_rooms_and_floors(self):
        edges = ig.graph(self.src)
        self.assertEqual(edges, {"core": set(), "model": {"core"}, "cuda/common": {"core"},
                                 "cuda/gemm": {"cuda/common", "model"}, "cli": {"cuda/gemm", "core"}})
        self.assertEqual(ig.floors(edges), {"core": 0, "model": 1, "cuda/common": 1, "cuda/gemm": 2, "cli": 3})
        self.assertEqual(ig.cycles(edges), [])
        lines = ig.plan(edges)
        self.assertEqual([ln.split()[:2] for ln in lines[1:]],
                         [["3", "cli"], ["2", "cuda/gemm"], ["1", "cuda/common"], ["1", "model"], ["0", "core"]])
        self.assertTrue(lines[1].endswith("-> cuda/gemm core"))

    def test_a_loop_is_reported(self):
        write(os.path.join(self.src, "core/b.h"), '#include "model/m.h"\n')
        self.assertEqual(ig.cycles(ig.graph(self.src)), [("core", "model")])
        r = subprocess.run([sys.executable, SCRIPT, "--src", self.src], capture_output=True, text=True)
        self.assertEqual(r.returncode, 1)
        self.assertIn("core and model include each other", r.stderr)

    def test_check_against_a_document(self):
        doc = os.path.join(self.tmp.name, "arch.md")
        plan = "\n".join(ig.plan(ig.graph(self.src)))
        write(doc, f"# x\n\n{ig.BEGIN}\n```\n{plan}\n```\n{ig.END}\n\ntext\n")
        ok = subprocess.run([sys.executable, SCRIPT, "--src", self.src, "--check", doc], capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        write(os.path.join(self.src, "model/n.h"), '#include "cuda/common/k.cuh"\n')  # a new arrow
        stale = subprocess.run([sys.executable, SCRIPT, "--src", self.src, "--check", doc], capture_output=True, text=True)
        self.assertEqual(stale.returncode, 1)
        self.assertIn("differs from the code", stale.stderr)
        write(doc, "# no block\n")
        missing = subprocess.run([sys.executable, SCRIPT, "--src", self.src, "--check", doc], capture_output=True, text=True)
        self.assertEqual(missing.returncode, 1)
        self.assertIn("no fenced block", missing.stderr)

    def test_architecture_md_matches_src(self):
        r = subprocess.run([sys.executable, SCRIPT, "--check", os.path.join(ROOT, "docs", "architecture.md")],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main()
