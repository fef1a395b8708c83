#!/usr/bin/env python3
"""The rooms of src/ (its folders; src/cuda's subfolders each a room) and which rooms each one
includes, read from the #include lines of the code itself.

  scripts/include_graph.py [--src DIR]           prints the floor plan: each room on its floor (1 +
                                                 the highest floor it includes; core is 0) with the
                                                 rooms it includes directly
  scripts/include_graph.py --check FILE          exits 1 when the plan between FILE's
                                                 "<!-- include-graph -->" and "<!-- /include-graph -->"
                                                 lines (a fenced block) differs from the code's, or when
                                                 two rooms include each other

docs/architecture.md carries it; tests/scripts/test_include_graph.py runs --check on it. Standard
library only.
"""
import argparse
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
EXTS = (".h", ".cpp", ".cu", ".cuh")
BEGIN, END = "<!-- include-graph -->", "<!-- /include-graph -->"


def room_of(rel):
    """'cuda/megakernel/ops.cuh' -> 'cuda/megakernel'; 'bench/gpu/x.cu' -> 'bench'; 'core/a.h' -> 'core'."""
    parts = rel.replace(os.sep, "/").split("/")
    if len(parts) < 2:
        return None
    if parts[0] == "cuda" and len(parts) > 2:
        return "cuda/" + parts[1]
    return parts[0]


def graph(src):
    """{room: set of rooms it includes}, every room of src a key."""
    edges = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(EXTS):
                continue
            path = os.path.join(dirpath, name)
            a = room_of(os.path.relpath(path, src))
            if a is None:
                continue
            edges.setdefault(a, set())
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
            for inc in INCLUDE.findall(text):
                target = os.path.normpath(os.path.join(dirpath, inc))
                if not os.path.exists(target):
                    target = os.path.join(src, inc)
                if not os.path.exists(target):
                    continue
                b = room_of(os.path.relpath(target, src))
                if b and b != a:
                    edges[a].add(b)
    return edges


def cycles(edges):
    """Pairs of rooms that reach each other (empty for a layered tree)."""
    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for b in edges.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen
    r = {a: reach(a) for a in edges}
    return sorted({tuple(sorted((a, b))) for a in edges for b in r[a] if b != a and a in r.get(b, ())})


def floors(edges):
    memo = {}

    def floor(a, stack=()):
        if a not in memo:
            below = [floor(b, stack + (a,)) for b in edges.get(a, ()) if b not in stack]
            memo[a] = 1 + max(below) if below else 0
        return memo[a]
    return {a: floor(a) for a in edges}


def plan(edges):
    """The floor plan as text lines: highest floor first, rooms by name; includes highest floor first."""
    fl = floors(edges)
    width = max(len(a) for a in edges)
    lines = [f"floor  {'room'.ljust(width)}  includes (directly; every arrow points to a lower floor)"]
    for a in sorted(edges, key=lambda r: (-fl[r], r)):
        inc = " ".join(sorted(edges[a], key=lambda r: (-fl[r], r)))
        lines.append(f"{fl[a]:>5}  {a.ljust(width)}  {('-> ' + inc) if inc else ''}".rstrip())
    return lines


def documented(path):
    """The lines of the fenced block between the markers in path, or None."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    m = re.search(re.escape(BEGIN) + r"\s*```[^\n]*\n(.*?)```\s*" + re.escape(END), text, re.S)
    return None if m is None else m.group(1).rstrip("\n").split("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    ap.add_argument("--check", metavar="FILE")
    a = ap.parse_args()
    edges = graph(a.src)
    problems = [f"{x} and {y} include each other" for x, y in cycles(edges)]
    want = plan(edges)
    if not a.check:
        print("\n".join(want))
        for p in problems:
            print(f"include_graph: {p}", file=sys.stderr)
        return 1 if problems else 0
    have = documented(a.check)
    if have is None:
        problems.append(f"{a.check}: no fenced block between {BEGIN} and {END}")
    elif have != want:
        problems.append(f"{a.check}: the include graph differs from the code's; scripts/include_graph.py prints it:\n"
                        + "\n".join(want))
    for p in problems:
        print(f"include_graph: {p}", file=sys.stderr)
    if not problems:
        print(f"include_graph: ok, {a.check} matches the code ({len(edges)} rooms)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
