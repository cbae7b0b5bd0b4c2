#!/usr/bin/env python3
"""Imports only point down the tree: the check CI runs for the rule in
src/lib.rs.

The module order is read from one place, the comment in src/lib.rs that
opens with `// The modules, top to bottom` (one `//   name` line each, the
faces and middlewares first, the floor under them). For every file in src/
(its `#[cfg(test)] mod tests` left out, as tests stand outside the tree):

- a `crate::a::...` path in code (comments and doc links are not imports)
  from a file of top-level module `b` must name a module listed below `b`
  (or `b` itself); a path through the crate root's re-exports
  (`crate::Quota`) runs back up to the root, and fails too;
- no files import each other in a loop (a cycle), inside a folder too.

src/lib.rs itself is the root: it may name any module.

    python3 tools/imports.py          # check; lists each import that fails
    python3 tools/imports.py --list   # also print the order and each module's imports
"""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
LIB = SRC / "lib.rs"
OPENING = "// The modules, top to bottom"

PATH = re.compile(r"\bcrate::((?:[A-Za-z_][A-Za-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*)")
GROUP = re.compile(r"\bcrate::((?:[a-z_][a-z0-9_]*::)*)\{")


def order():
    """The module names, top to bottom, from the comment in src/lib.rs."""
    lines = LIB.read_text().splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith(OPENING))
    except StopIteration:
        sys.exit(f"src/lib.rs has no comment opening with {OPENING!r}")
    names = []
    for line in lines[start + 1 :]:
        match = re.match(r"^//   ([a-z_]+)(?:/|\.rs)?(?:\s|$)", line)
        if not line.startswith("//"):
            break
        if match:
            names.append(match.group(1))
    if not names:
        sys.exit("src/lib.rs: the module order lists no module")
    return names


def code(path):
    """The file's code: no comments, no string literals, no test module."""
    text = path.read_text()
    # The tests module is the file's last item, by the house's layout.
    cut = re.search(r"^#\[cfg\(test\)\]\s*\nmod tests \{", text, re.M)
    if cut:
        text = text[: cut.start()]
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return "\n".join(line.split("//", 1)[0] for line in text.splitlines())


def module_of(path):
    """The module path of a file: src/a/b.rs and src/a/b/mod.rs are a::b."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "mod":
        parts.pop()
    return [] if parts == ["lib"] else parts


def imports(path, text):
    """The module paths `text` names: `crate::...`, with grouped `{...}`
    imports opened, and `super::`/`self::` resolved."""
    found = [m.group(1).split("::") for m in PATH.finditer(text)]
    for m in GROUP.finditer(text):
        prefix = [p for p in m.group(1).split("::") if p]
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = re.sub(r"\{[^{}]*\}", "", text[m.end() : i - 1])
        for item in body.split(","):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                found.append(prefix + item.split("::"))
            elif item == "self":
                found.append(prefix)
    here = module_of(path)
    # Inside an inline `mod name { ... }`, `super` is the file's module.
    inline = []
    for m in re.finditer(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod [a-z_][a-z0-9_]* \{", text, re.M):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        inline.append((m.end(), i))
    for m in re.finditer(r"\b(super|self)::((?:[A-Za-z_][A-Za-z0-9_]*::)*[A-Za-z_][A-Za-z0-9_]*)", text):
        nested = any(a <= m.start() < b for a, b in inline)
        if m.group(1) == "super":
            base = here if nested else here[:-1]
        else:
            base = here + ["<inline>"] if nested else here
        found.append(base + m.group(2).split("::"))
    return [f for f in found if f]


def target(parts, files):
    """The file a module path lands in: its longest prefix that is a file."""
    for n in range(len(parts), -1, -1):
        if tuple(parts[:n]) in files:
            return tuple(parts[:n])
    return None


def main():
    listed = order()
    rank = {name: i for i, name in enumerate(listed)}
    paths = sorted(SRC.rglob("*.rs"))
    files = {tuple(module_of(p)): p for p in paths}
    tops = {parts[0] for parts in files if parts}
    failures = []
    for top in sorted(tops - set(listed)):
        failures.append(f"src/{top}: not in the module order of src/lib.rs")
    for name in listed:
        if name not in tops:
            failures.append(f"src/lib.rs: the module order lists {name}, which is not a module")
    graph = {}
    for path in paths:
        here = module_of(path)
        if path.name == "tests.rs" and len(here) > 1:
            continue  # a test module in a file of its own
        text = code(path)
        edges = set()
        for parts in imports(path, text):
            to = target(parts, files)
            if to is None or not here:
                continue
            if to == ():
                failures.append(f"{path.relative_to(ROOT)}: crate::{'::'.join(parts)} goes through the crate root (import from the defining module)")
                continue
            if to != tuple(here):
                edges.add(to)
            a, b = here[0], to[0]
            if a != b and a in rank and b in rank and rank[b] < rank[a]:
                failures.append(f"{path.relative_to(ROOT)}: imports crate::{'::'.join(parts)}, which is above it ({b} is listed before {a})")
        graph[tuple(here)] = edges
    failures += [f"a cycle: {' -> '.join('::'.join(f) or 'lib' for f in c)}" for c in cycles(graph)]
    if "--list" in sys.argv:
        for name in listed:
            uses = sorted({t[0] for f, ts in graph.items() if f and f[0] == name for t in ts if t[0] != name})
            print(f"{name}: {' '.join(uses)}")
    for failure in sorted(set(failures)):
        print(failure)
    if failures:
        print(f"\n{len(set(failures))} import(s) against the rule: imports only point down src/lib.rs's module order, in no cycle.", file=sys.stderr)
        sys.exit(1)
    print(f"imports: {sum(map(len, graph.values()))} between {len(graph)} files, all pointing down {len(listed)} modules, no cycle")


def cycles(graph):
    """Each strongly connected set of more than one file (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return found


if __name__ == "__main__":
    main()
