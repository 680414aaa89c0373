#!/usr/bin/env python3
"""Fails when two modules of a crate import each other, directly or round a longer circle.

    tests/module-cycles.py [ROOT]     check src/ and providers/src/ under ROOT
    tests/module-cycles.py --self-test

A circle between modules means neither can be read, tested or moved without the other: the
layering ARCHITECTURE.md describes (desired, observe, plan, act over one skeleton) holds only
while imports point one way. Each `.rs` file is one module, named by its path (`a/b.rs` and
`a/b/mod.rs` are `a::b`). A file imports a module when a path in it (in a `use` item, braces
expanded, or written inline) starting at `crate`, `self` or `super` reaches that module's file;
the path's deepest segment that is a module decides which. A module and the modules above it
(its ancestors) always reach each other in Rust (`use super::Context`, `mod child;`): those
arrows are left out, and every other arrow counts. Python's standard library only.
"""
import os
import re
import sys
import tempfile

sys.dont_write_bytecode = True

CRATES = ["src", "providers/src"]
COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
STRING = re.compile(r'r#*"(?:.|\n)*?"#*|"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])\'')
USE = re.compile(r"\buse\s+([^;]+);")
INLINE = re.compile(r"\b(?:crate|self|super)(?:\s*::\s*\w+)+")


def modules(root):
    """Module path (tuple) -> file, for the crate whose sources are under `root`."""
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".rs"):
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)
            parts = rel[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            found[tuple(parts)] = os.path.join(folder, name)
    return found


def expand(tree):
    """`a::{b, c::{d, e}}` as ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    start = tree.find("{")
    if start < 0:
        return [tree]
    depth, parts, begin = 0, [], start + 1
    for i in range(start, len(tree)):
        if tree[i] == "{":
            depth += 1
        elif tree[i] == "}":
            depth -= 1
            if depth == 0:
                parts.append(tree[begin:i])
                break
        elif tree[i] == "," and depth == 1:
            parts.append(tree[begin:i])
            begin = i + 1
    prefix = tree[:start]
    return [path for part in parts if part for path in expand(prefix + part)]


def code_of(path):
    with open(path, encoding="utf-8") as f:
        return COMMENT.sub(" ", STRING.sub('""', f.read()))


def paths_in(code):
    """Every module path the code names from crate, self or super."""
    found = []
    for use in USE.findall(code):
        found.extend(p.split(" as ")[0] for p in expand(use.replace(" as ", " as ")))
    found.extend(re.sub(r"\s+", "", m) for m in INLINE.findall(code))
    return [p for p in found if p.split("::")[0] in ("crate", "self", "super")]


def target(here, path, known):
    """The module `path` reaches from module `here`: its deepest segment that is a module."""
    segments = path.split("::")
    at = list(here)
    if segments[0] == "crate":
        at, segments = [], segments[1:]
    while segments and segments[0] in ("self", "super"):
        if segments.pop(0) == "super" and at:
            at.pop()
    reached = tuple(at)
    for segment in segments:
        if tuple(at + [segment]) not in known:
            break
        at.append(segment)
        reached = tuple(at)
    return reached


def is_above(a, b):
    return len(a) <= len(b) and b[: len(a)] == a


def arrows(root):
    known = modules(root)
    edges = {m: set() for m in known}
    for module, path in known.items():
        for used in paths_in(code_of(path)):
            to = target(module, used, known)
            if to in known and not is_above(to, module) and not is_above(module, to):
                edges[module].add(to)
    return edges


def circles(edges):
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def check(root):
    failed = []
    for crate in CRATES:
        base = os.path.join(root, crate)
        if not os.path.isdir(base):
            continue
        edges = arrows(base)
        for group in circles(edges):
            names = ["::".join(m) or "crate" for m in group]
            ties = [
                f"  {'::'.join(a)} -> {'::'.join(b)}" for a in group for b in sorted(edges[a]) if b in group
            ]
            failed.append(f"{crate}: modules that import each other: {', '.join(names)}\n" + "\n".join(ties))
    return failed


def self_test():
    with tempfile.TemporaryDirectory() as root:
        def write(rel, text):
            path = os.path.join(root, "src", rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

        write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n")
        write("a/mod.rs", "pub mod inner;\nuse inner::X;\npub struct Context;\n")
        write("a/inner.rs", "use super::Context; // a parent is not a circle\n")
        write("b.rs", "use crate::c::{self as other, Y};\n/* use crate::a; */\n")
        write("c.rs", 'pub struct Y;\nconst S: &str = "crate::b";\n')
        assert check(root) == [], check(root)
        write("c.rs", "pub struct Y;\nfn f() { super::b::g(); }\n")
        failed = check(root)
        assert len(failed) == 1 and "b, c" in failed[0], failed
        write("c.rs", "pub struct Y;\nuse crate::{a::{Context, inner::Z}};\n")
        write("a/inner.rs", "use crate::b;\n")
        failed = check(root)
        assert len(failed) == 1 and "a::inner, b, c" in failed[0], failed
    print("module-cycles: self-test passed")


def main():
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        return
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    failed = check(root)
    for f in failed:
        print(f, file=sys.stderr)
    if failed:
        sys.exit(1)
    print("module-cycles: no two modules import each other")


if __name__ == "__main__":
    main()
