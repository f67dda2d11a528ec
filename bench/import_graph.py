#!/usr/bin/env python3
"""The import graph of the workspace's Rust files: which file uses which, its circles, and the
arrows that run back up between the rooms of a folder.

    python3 bench/import_graph.py                      # every crate: circles (files in a loop)
    python3 bench/import_graph.py executor/src/cuda    # one folder: circles and rooms' back-arrows

A file is a module (`foo.rs` or `foo/mod.rs`); an arrow is any path through `crate::`,
`super::` or `self::` in it (in `use` items, grouped imports expanded, or inline in code)
that names another module file of the same crate. A circle is a strongly connected set of two
or more files. A room of a folder is one of its direct children (a file or a sub-folder); an
arrow between rooms runs back up when it closes a loop between rooms (both rooms can reach
each other), so a folder whose rooms form no loop has none.
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CRATES = {"src": "src", "planner": "planner/src", "executor": "executor/src", "kernels": "kernels/src"}


def module_files(src):
    """{module path tuple: file} for one crate's `src`."""
    out = {}
    for dirpath, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out[tuple(parts)] = os.path.join(dirpath, name)
    return out


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return "\n".join(line.split("//")[0] for line in text.splitlines())


def expand(prefix, body):
    """Paths of a grouped import `prefix::{body}`."""
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        items.append(cur.strip())
    paths = []
    for item in items:
        m = re.match(r"^([\w:]*?)(?:::)?\{(.*)\}$", item, re.S)
        if m:
            head = prefix + ([p for p in m.group(1).split("::") if p])
            paths += expand(head, m.group(2))
        else:
            paths.append(prefix + [p for p in item.split(" as ")[0].split("::") if p])
    return paths


def paths_in(text):
    text = strip_comments(text)
    found = []
    for m in re.finditer(r"\buse\s+((?:crate|super|self)(?:::\w+)*)::\{", text):
        start = m.end()
        depth, i = 1, start
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        found += expand(m.group(1).split("::"), text[start : i - 1])
    for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text):
        found.append(m.group(1).split("::"))
    return found


def resolve(module, path, modules):
    """The module file a path names, from `module`."""
    if path[0] == "crate":
        base, rest = [], path[1:]
    else:
        base = list(module)
        rest = path
        while rest and rest[0] in ("super", "self"):
            if rest[0] == "super" and base:
                base = base[:-1]
            rest = rest[1:]
    best = None
    for n in range(len(rest), -1, -1):
        cand = tuple(base + rest[:n])
        if cand in modules:
            best = cand
            break
    return best


def graph(crate_src):
    modules = module_files(crate_src)
    edges = defaultdict(set)
    for mod, path in modules.items():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for p in paths_in(text):
            target = resolve(mod, p, modules)
            if target is not None and target != mod and target not in ancestors(mod):
                edges[mod].add(target)
    return modules, edges


def ancestors(mod):
    return {mod[:i] for i in range(len(mod))}


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def name(crate, mod):
    return f"{crate}::" + "::".join(mod)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else None
    total = 0
    for crate, src in CRATES.items():
        modules, edges = graph(os.path.join(ROOT, src))
        circles = sccs(list(modules), edges)
        if folder is None:
            for c in circles:
                print(f"circle: {{{', '.join(sorted(name(crate, m) for m in c))}}}")
            total += len(circles)
            continue
        rel = os.path.relpath(os.path.join(ROOT, folder), os.path.join(ROOT, src))
        if rel.startswith(".."):
            continue
        prefix = tuple(p for p in rel.split(os.sep) if p != ".")
        inside = [m for m in modules if m[: len(prefix)] == prefix and len(m) > len(prefix)]
        sub = {m: {t for t in edges[m] if t in inside} for m in inside}
        circles = sccs(inside, sub)
        for c in circles:
            print(f"circle: {{{', '.join(sorted(name(crate, m) for m in c))}}}")
        room = lambda m: m[len(prefix)]
        room_edges = defaultdict(set)
        why = defaultdict(list)
        for m, ts in sub.items():
            for t in ts:
                if room(m) != room(t):
                    room_edges[room(m)].add(room(t))
                    why[(room(m), room(t))].append((m, t))
        room_loops = sccs(sorted({room(m) for m in inside}), room_edges)
        back = 0
        for loop in room_loops:
            members = set(loop)
            for a in sorted(members):
                for b in sorted(room_edges[a] & members):
                    for m, t in why[(a, b)]:
                        back += 1
                        print(f"rooms in a loop: {name(crate, m)} -> {name(crate, t)}")
        print(f"{folder}: {len(inside)} files, {len(circles)} circles, "
              f"{len(room_loops)} loops between rooms ({back} arrows in them)")
        return
    print(f"whole workspace: {total} circles")


if __name__ == "__main__":
    main()
