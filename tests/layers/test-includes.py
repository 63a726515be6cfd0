#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test-includes.py: no include cycle among the modules of one directory (daemon/,
client-lib/, python/src/, any other).

A module is X.c with its X.h. Its edges are the quoted includes of both files that name
another header of the same directory. Following them from any module must never lead back to it: a
file's includes, followed, never lead back to it, counting a header and its .c as one
(so conn.c -> broker.h and broker.c -> conn.h is a cycle even though no header includes
itself). Exit 1 naming each cycle found; 0 otherwise.
With --own-headers DIR, also: every function a module's .c defines for other modules
(not static, not the public shmref_* API) is declared in that module's own header, so
the include graph is the call graph (one private header shared by every module hides
call cycles from the first check).
Usage: test-includes.py [--own-headers] DIR [DIR...]   (default: daemon/)
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


DEFINITION = re.compile(r'^(?!static\b)[A-Za-z_][\w \t\*]*?\b([a-z_]\w*)\s*\(([^;{}]*?)\)\s*\{', re.M | re.S)


def own_headers(root, mods):
    """Names of functions defined in X.c for other modules but not declared in X.h."""
    bad = []
    for stem, files in sorted(mods.items()):
        src = [f for f in files if f.endswith(".c")]
        if not src:
            continue
        with open(src[0], encoding="utf-8") as f:
            text = f.read()
        hdr = os.path.join(root, stem + ".h")
        decls = open(hdr, encoding="utf-8").read() if os.path.exists(hdr) else ""
        for m in DEFINITION.finditer(text):
            name = m.group(1)
            if name.startswith("shmref_") or name == "main":
                continue
            if not re.search(r"\b" + re.escape(name) + r"\s*\(", decls):
                bad.append(f"{stem}.c defines {name}() but {stem}.h does not declare it")
    return bad


def check(root, headers=False):
    mods = modules(root)
    if len(mods) < 5:
        print(f"test-includes: only {len(mods)} modules in {root}: wrong directory?")
        return 1
    graph = edges(mods)
    bad = 0
    for stem in sorted(graph):
        path = cycle_from(stem, graph)
        if path:
            print(f"include cycle in {root}: " + " -> ".join(path))
            bad += 1
    if headers:
        for line in own_headers(root, mods):
            print(line)
            bad += 1
    if bad:
        return 1
    print(f"test-includes: {len(mods)} modules in {root}, no include cycle"
          + (", each module's functions in its own header" if headers else ""))
    return 0


def main():
    args = sys.argv[1:]
    headers = "--own-headers" in args
    roots = [a for a in args if a != "--own-headers"]
    roots = roots or [os.path.join(os.path.dirname(__file__), "..", "..", "daemon")]
    bad = 0
    for root in roots:
        bad |= check(root, headers)
    return bad


if __name__ == "__main__":
    sys.exit(main())
