#!/usr/bin/env python3
"""The guides (docs/*.md) are read in two places: on the repository's web
view, where a link is a relative path (`costs.md`, `../examples/login.rs`),
and in rustdoc (`tower_pinned_window::guide`), where a guide is a module.
So every relative link in a guide is written reference-style
(`[text][costs.md#anchor]`), its definition at the bottom of the file
(`[costs.md#anchor]: costs.md#anchor`), and src/guide/links.md defines the
same labels for rustdoc (an intra-doc path, or a docs.rs address) ahead of
the guide's own text: CommonMark takes a label's first definition.

    python3 tools/guide-links.py          # rewrite docs/*.md and src/guide/links.md
    python3 tools/guide-links.py --check  # fail when either would change (CI)
"""
import pathlib, re, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LINKS = ROOT / "src" / "guide" / "links.md"
SOURCE = "https://docs.rs/crate/tower-pinned-window/latest/source/"
REPO = "https://github.com/tower-pinned-window/tower-pinned-window/blob/main/"
MARK = "<!-- Relative links, one definition each (tools/guide-links.py). -->"

INLINE = re.compile(r"\]\(((?:\.\./)?[A-Za-z0-9_./-]+\.(?:md|rs|sh|toml|lua)(?:#[A-Za-z0-9_-]+)?)\)")
REFERENCE = re.compile(r"\]\[((?:\.\./)?[A-Za-z0-9_./-]+\.(?:md|rs|sh|toml|lua)(?:#[A-Za-z0-9_-]+)?)\]")


def module(name):
    return name.removesuffix(".md").replace("-", "_")


def for_rustdoc(label):
    path, _, anchor = label.partition("#")
    anchor = f"#{anchor}" if anchor else ""
    if "/" not in path and path.endswith(".md"):
        return f"crate::guide::{module(path)}{anchor}"
    if path == "../README.md":
        return f"crate{anchor}"
    rel = path.removeprefix("../")
    if rel.startswith(("bench/", "soak/", "tools/", ".ci/")):
        return REPO + rel + anchor  # not in the package: the repository's copy
    return SOURCE + rel + anchor


def rewrite(text):
    body = text.split("\n" + MARK + "\n")[0].rstrip("\n")
    body = INLINE.sub(lambda m: f"][{m.group(1)}]", body)
    labels = sorted(set(REFERENCE.findall(body)))
    if not labels:
        return body + "\n", labels
    defs = "\n".join(f"[{label}]: {label}" for label in labels)
    return f"{body}\n\n{MARK}\n{defs}\n", labels


def main():
    check = "--check" in sys.argv
    changed, every = [], set()
    for md in sorted(DOCS.glob("*.md")):
        old = md.read_text()
        new, labels = rewrite(old)
        every.update(labels)
        if new != old:
            changed.append(md)
            if not check:
                md.write_text(new)
    header = ("<!-- The guides' relative links as rustdoc reads them; written by\n"
              "tools/guide-links.py from docs/*.md. Do not edit. -->\n")
    links = header + "".join(f"[{l}]: {for_rustdoc(l)}\n" for l in sorted(every))
    if not LINKS.exists() or LINKS.read_text() != links:
        changed.append(LINKS)
        if not check:
            LINKS.parent.mkdir(parents=True, exist_ok=True)
            LINKS.write_text(links)
    if check and changed:
        print("out of date (run python3 tools/guide-links.py):", *map(str, changed), sep="\n  ")
        sys.exit(1)
    for path in changed:
        print("wrote", path.relative_to(ROOT))


main()
