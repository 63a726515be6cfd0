#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test-includes.py: no include cycle among daemon/ modules.

A module is X.c with its X.h. Its edges are the quoted includes of both files that name
another daemon/ header. Following them from any module must never lead back to it: a
file's includes, followed, never lead back to it, counting a header and its .c as one
(so conn.c -> broker.h and broker.c -> conn.h is a cycle even though no header includes
itself). Exit 1 naming each cycle found; 0 otherwise.
Usage: test-includes.py DAEMON_DIR
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def modules(root):
    mods = {}
    for name in sorted(os.listdir(root)):
        stem, ext = os.path.splitext(name)
        if ext in (".c", ".h"):
            mods.setdefault(stem, []).append(os.path.join(root, name))
    return mods


def edges(mods):
    out = {}
    for stem, files in mods.items():
        deps = set()
        for path in files:
            with open(path, encoding="utf-8") as f:
                for inc in INCLUDE.findall(f.read()):
                    dep = os.path.splitext(os.path.basename(inc))[0]
                    if dep != stem and dep in mods and inc.endswith(".h"):
                        deps.add(dep)
        out[stem] = deps
    return out


def cycle_from(start, graph):
    """A path start -> ... -> start, or None."""
    stack = [(start, [start])]
    seen = set()
    while stack:
        node, path = stack.pop()
        for dep in sorted(graph[node]):
            if dep == start:
                return path + [start]
            if dep not in seen:
                seen.add(dep)
                stack.append((dep, path + [dep]))
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..", "daemon")
    mods = modules(root)
    if len(mods) < 5:
        print(f"test-includes: only {len(mods)} modules in {root}: wrong directory?")
        return 1
    graph = edges(mods)
    bad = 0
    for stem in sorted(graph):
        path = cycle_from(stem, graph)
        if path:
            print("include cycle: " + " -> ".join(path))
            bad += 1
    if bad:
        return 1
    print(f"test-includes: {len(mods)} daemon modules, no include cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
