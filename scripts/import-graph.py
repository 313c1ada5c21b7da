#!/usr/bin/env python3
"""The import graph of a crate's src/ at file scale, and its circles.

Reads every .rs file under SRC (default host/src), collects the `crate::...` and `super::...`
paths its code names (`use` lines, brace groups and inline paths; comments, doc links and the
trailing `#[cfg(test)] mod tests` block left out unless --all), resolves each to the file that
defines the module, and prints:

  - every circle between rooms (a room is a top-level module: a folder such as controller/, or
    a file such as host.rs): strongly connected components of the room graph;
  - every circle between files, leaving out the arrows between a folder's mod.rs and the files
    in that folder (mod.rs declares and re-exports them, they use its shared types);
  - with --edges, every arrow `from -> to` first.

Exit status: 0 when there is no circle, 1 when there is one (so `make` or CI can use it as a
check), 2 on bad usage.

Usage: scripts/import-graph.py [--all] [--edges] [SRC]
"""

import os
import re
import sys


def module_path(src, path):
    """The module path of a file: host/src/a/b.rs -> ["a", "b"]; a/mod.rs -> ["a"]."""
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel[-1] == "mod" or (len(rel) == 1 and rel[0] in ("lib", "main")):
        rel = rel[:-1]
    return rel


def file_of(src, parts):
    """The file defining the longest prefix of `parts` that is a module, or None."""
    for n in range(len(parts), 0, -1):
        base = os.path.join(src, *parts[:n])
        for candidate in (base + ".rs", os.path.join(base, "mod.rs")):
            if os.path.isfile(candidate):
                return candidate
    return None


def code_of(text, keep_tests):
    """The file's code: comments blanked, the trailing test module cut off unless asked."""
    if not keep_tests:
        m = re.search(r"^#\[cfg\(test\)\]\s*\n\s*mod \w+\s*\{", text, re.M)
        if m:
            text = text[: m.start()]
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    return re.sub(r"//[^\n]*", "", text)


def expand_group(prefix, body):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (prefix already split off)."""
    out, depth, item = [], 0, ""
    for ch in body + ",":
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            item = item.strip()
            if item:
                m = re.match(r"([\w:]*?)::\{(.*)\}$", item, re.S)
                if m:
                    out += expand_group(prefix + m.group(1).split("::"), m.group(2))
                elif item != "self":
                    out.append(prefix + item.split(" as ")[0].strip().split("::"))
                else:
                    out.append(prefix)
            item = ""
        else:
            item += ch
    return out


def paths_in(code):
    """Every `crate::`, `super::` and `self::` path the code names, and every path through a
    child module the file declares (`mod x;` then `x::Y`), as lists of segments."""
    children = re.findall(r"^\s*(?:pub(?:\([\w:]+\))?\s+)?mod\s+(\w+)\s*;", code, re.M)
    heads = ["crate", "super", "self"] + children
    head = r"(?<![\w:])(?:" + "|".join(heads) + r")"
    paths = []
    for m in re.finditer(r"(" + head + r"(?:::(?:super|\w+))*)::\{", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        paths += expand_group(m.group(1).split("::"), code[m.end() : i - 1])
    for m in re.finditer(head + r"(?:::(?:super|\w+))+", code):
        paths.append(m.group(0).split("::"))
    return paths


def resolve(src, here, parts):
    """A path as seen from the file whose module path is `here`, made absolute."""
    if parts[0] == "crate":
        return parts[1:]
    if parts[0] == "self":
        return list(here) + parts[1:]
    if parts[0] != "super":
        return list(here) + parts
    base = list(here)
    while parts and parts[0] == "super":
        base = base[:-1]
        parts = parts[1:]
    return base + parts


def graph(src, keep_tests):
    edges = {}
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(root, name)
            here = module_path(src, path)
            with open(path, encoding="utf-8") as f:
                code = code_of(f.read(), keep_tests)
            targets = set()
            for parts in paths_in(code):
                target = file_of(src, resolve(src, here, parts))
                if target and target != path:
                    targets.add(target)
            edges[path] = targets
    return edges


def components(edges):
    """Tarjan's strongly connected components, iteratively."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(edges.get(nxt, ())))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                out.append(sorted(comp))
    return out


def room_of(src, path):
    """The top-level room a file belongs to: `controller` for controller/apply.rs, `host` for
    host.rs."""
    first = os.path.relpath(path, src).split(os.sep)[0]
    return first[: -len(".rs")] if first.endswith(".rs") else first


def without_folder_links(src, edges):
    """The edges minus those between a folder's mod.rs and the files in that folder: mod.rs
    declares and re-exports its children and they use its shared types, which is how a Rust
    folder is built, not a circle a reader trips over."""
    out = {}
    for f, targets in edges.items():
        keep = set()
        for t in targets:
            for a, b in ((f, t), (t, f)):
                if os.path.basename(a) == "mod.rs" and b.startswith(os.path.dirname(a) + os.sep):
                    break
            else:
                keep.add(t)
        out[f] = keep
    return out


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    flags = {a for a in argv if a.startswith("--")}
    if flags - {"--all", "--edges"} or len(args) > 1:
        print(__doc__, file=sys.stderr)
        return 2
    src = args[0] if args else "host/src"
    edges = graph(src, "--all" in flags)
    rel = lambda p: os.path.relpath(p, src)
    if "--edges" in flags:
        for f in sorted(edges):
            for t in sorted(edges[f]):
                print(f"{rel(f)} -> {rel(t)}")
    rooms = {}
    for f, targets in edges.items():
        mine = rooms.setdefault(room_of(src, f), set())
        mine.update(room_of(src, t) for t in targets if room_of(src, t) != room_of(src, f))
    room_circles = [c for c in components(rooms) if len(c) > 1]
    file_circles = [c for c in components(without_folder_links(src, edges)) if len(c) > 1]
    arrows = sum(len(t) for t in edges.values())
    room_arrows = sum(len(t) for t in rooms.values())
    print(f"{len(edges)} files, {arrows} arrows; {len(rooms)} rooms, {room_arrows} arrows")
    for c in room_circles:
        print(f"circle of {len(c)} rooms: " + ", ".join(c))
    for c in file_circles:
        print(f"circle of {len(c)} files: " + ", ".join(rel(p) for p in c))
    if not room_circles and not file_circles:
        print("no circle")
    return 1 if room_circles or file_circles else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
