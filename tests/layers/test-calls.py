#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test-calls.py: no call cycle among the modules of a library, read from its compiled
object files, so no header can hide one (test-includes.py reads includes: a function
declared in a header everybody includes escapes it).

A module is one object file (client-lib/session.c -> session.c.o -> module "session"). Its
edges are its undefined symbols, each resolved to the module that defines it (nm): a call,
or a reference to a function or an object (an ops struct) of another module. Symbols no
module defines (libc, msgpack, proto/, sanitizer runtimes) are not edges. Following the
edges from any module must never lead back to it: every strongly connected component of
more than one module is printed with one cycle through it and the symbols on each edge.
Exit 1 if there is one, 0 otherwise (2: bad usage, no objects, nm failed).
Usage: test-calls.py [--nm NM] OBJ [OBJ...]   (an argument may hold several, ';'-separated,
as CMake's $<TARGET_OBJECTS:...> gives them)
"""
import os
import subprocess
import sys


def module_of(path):
    name = os.path.basename(path)
    for ext in (".o", ".obj"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    return os.path.splitext(name)[0]


def symbols(nm, path):
    """(defined, undefined): sets of the global symbol names of one object file."""
    out = subprocess.run([nm, "-P", "-g", path], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        name, kind = fields[0], fields[1]
        if kind in ("U", "w", "v"):
            undefined.add(name)
        else:
            defined.add(name)
    return defined, undefined


def graph_of(nm, objects):
    """{module: {module it refers to: sorted symbols}}"""
    defs, undefs, owner = {}, {}, {}
    for path in objects:
        mod = module_of(path)
        if mod in defs:
            raise SystemExit(f"test-calls: two object files of module {mod}")
        defs[mod], undefs[mod] = symbols(nm, path)
        for sym in defs[mod]:
            owner[sym] = mod
    graph = {}
    for mod in sorted(defs):
        edges = {}
        for sym in undefs[mod]:
            dep = owner.get(sym)
            if dep and dep != mod:
                edges.setdefault(dep, []).append(sym)
        graph[mod] = {dep: sorted(syms) for dep, syms in edges.items()}
    return graph


def tarjan(graph):
    """Tarjan's strongly connected components, each a sorted list, callees first."""
    index, low, on_stack, stack, comps = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def components(graph):
    """The strongly connected components in a stable (sorted) order."""
    return sorted(tarjan(graph))


def cycle_in(comp, graph):
    """A shortest path comp[0] -> ... -> comp[0] inside comp (breadth first)."""
    start, members = comp[0], set(comp)
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return [start]


def main():
    args = sys.argv[1:]
    nm = "nm"
    if len(args) >= 2 and args[0] == "--nm":
        nm, args = args[1] or "nm", args[2:]
    objects = [o for a in args for o in a.split(";") if o]
    if len(objects) < 5:
        print(f"test-calls: only {len(objects)} object files: wrong arguments? {__doc__}")
        return 2
    missing = [o for o in objects if not os.path.exists(o)]
    if missing:
        print("test-calls: missing object files (not built?): " + " ".join(missing))
        return 2
    try:
        graph = graph_of(nm, objects)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"test-calls: {nm}: {e}")
        return 2
    bad = 0
    for comp in components(graph):
        if len(comp) < 2:
            continue
        bad += 1
        path = cycle_in(comp, graph)
        print(f"call cycle among {len(comp)} modules: {' '.join(comp)}")
        print("  for example: " + " -> ".join(path))
        for a, b in zip(path, path[1:]):
            syms = graph[a][b]
            more = f" (+{len(syms) - 4} more)" if len(syms) > 4 else ""
            print(f"    {a} -> {b}: {' '.join(syms[:4])}{more}")
        for a in comp:
            for b in sorted(graph[a]):
                if b in comp:
                    print(f"  edge {a} -> {b}: {' '.join(graph[a][b])}")
    if bad:
        return 1
    # Tarjan gives the components callees first: the lowest layer is printed first.
    print(f"test-calls: {len(graph)} modules, no call cycle (lowest first; what each calls):")
    for (mod,) in tarjan(graph):
        deps = sorted(graph[mod])
        print(f"  {mod:12} -> {' '.join(deps) if deps else '(no module)'}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
