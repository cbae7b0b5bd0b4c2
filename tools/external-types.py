#!/usr/bin/env python3
"""Foreign crates in a crate's public API, read from its rustdoc JSON.

    python3 tools/external-types.py CRATE.json [--allow CRATE]... [--list]

The same check as tower-http's `cargo check-external-types`: every path in a
public signature (a function's arguments, return type and bounds, a public
field, a variant's fields, a type alias, a constant's type, a trait's
supertraits and associated items, an implemented trait and its methods, a
re-export) must start with the crate itself, `std`/`core`/`alloc`, or a crate
on the allow-list. A major release of a crate that appears in the public API
is a major release of this one, so the list is short on purpose.

Why not `cargo check-external-types` itself: it reads rustdoc's JSON, whose
format changes with the toolchain, and each of its releases reads one nightly's
format (0.5.0, the newest, reads an older format than this toolchain's stable
rustdoc writes under RUSTC_BOOTSTRAP=1; it fails with a parse error). This
script reads only the parts of the format that have been stable for years
(`index`, `paths`, `external_crates`, the type and generics trees), so it
moves with the toolchain.

Blanket and auto-trait impls (`Send`, `Sync`, `From<T> for T`) are left out,
as the tool does, and so is anything `#[doc(hidden)]` here or a foreign
crate's hidden `__private` items (pin-project-lite's generated `Unpin` impls
name one: no user ever writes it).

Exit status: 0 when every foreign path is allowed, 1 with one line per
unapproved (crate, path, where) otherwise. `--list` prints every foreign crate
found, allowed or not, with a count, and exits 0.
"""

import json
import sys

ALWAYS = {"std", "core", "alloc"}


def main(argv):
    args = argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    path, allow, list_all = args[0], set(ALWAYS), False
    rest = args[1:]
    while rest:
        flag = rest.pop(0)
        if flag == "--allow" and rest:
            allow.add(rest.pop(0).replace("-", "_"))
        elif flag == "--list":
            list_all = True
        else:
            print(f"unknown argument: {flag}", file=sys.stderr)
            return 2

    doc = json.load(open(path))
    index, paths, crates = doc["index"], doc["paths"], doc["external_crates"]
    found = {}  # (crate, path) -> set of places

    def crate_of(item_id):
        key = str(item_id)
        if key in paths:
            crate_id = paths[key]["crate_id"]
            name = "::".join(paths[key]["path"])
        elif key in index:
            crate_id = index[key]["crate_id"]
            name = index[key].get("name") or "?"
        else:
            return None, None
        if crate_id == 0:
            return None, None
        return crates[str(crate_id)]["name"], name

    def note(item_id, fallback, where):
        crate, name = crate_of(item_id)
        if crate is None and item_id is None and fallback:
            # A path rustdoc could not resolve to an id: judge it by its text.
            crate, name = fallback.split("::")[0], fallback
            if crate in ("crate", "self", "super", doc_crate):
                return
        # A foreign crate's `__private` items are its macros' insides
        # (pin-project-lite's `Unpin` impls name one), hidden from its docs
        # and never named by a user.
        if crate is not None and "__private" not in name:
            found.setdefault((crate, name), set()).add(where)

    doc_crate = index[str(doc["root"])]["name"]

    def path_ty(p, where):
        note(p.get("id"), p.get("path"), where)
        generic_args(p.get("args"), where)

    def generic_args(args, where):
        if not args:
            return
        if "angle_bracketed" in args:
            for arg in args["angle_bracketed"].get("args", []):
                if isinstance(arg, dict) and "type" in arg:
                    ty(arg["type"], where)
            for c in args["angle_bracketed"].get("constraints", []):
                generic_args(c.get("args"), where)
                binding = c.get("binding", {})
                if "equality" in binding and isinstance(binding["equality"], dict):
                    if "type" in binding["equality"]:
                        ty(binding["equality"]["type"], where)
                if "constraint" in binding:
                    bounds(binding["constraint"], where)
        elif "parenthesized" in args:
            for t in args["parenthesized"].get("inputs", []):
                ty(t, where)
            if args["parenthesized"].get("output"):
                ty(args["parenthesized"]["output"], where)

    def bounds(bs, where):
        for b in bs or []:
            if isinstance(b, dict) and "trait_bound" in b:
                path_ty(b["trait_bound"]["trait"], where)
                generics({"params": b["trait_bound"].get("generic_params", [])}, where)

    def ty(t, where):
        if not isinstance(t, dict):
            return
        (kind, v), = t.items()
        if kind == "resolved_path":
            path_ty(v, where)
        elif kind == "dyn_trait":
            for poly in v.get("traits", []):
                path_ty(poly["trait"], where)
        elif kind == "impl_trait":
            bounds(v, where)
        elif kind == "borrowed_ref" or kind == "raw_pointer":
            ty(v["type"], where)
        elif kind in ("slice",):
            ty(v, where)
        elif kind == "array":
            ty(v["type"], where)
        elif kind == "tuple":
            for x in v:
                ty(x, where)
        elif kind == "function_pointer":
            fn_sig(v["sig"], where)
        elif kind == "qualified_path":
            ty(v["self_type"], where)
            if v.get("trait"):
                path_ty(v["trait"], where)
            generic_args(v.get("args"), where)
        elif kind == "pat":
            ty(v["type"], where)

    def fn_sig(sig, where):
        for _, t in sig.get("inputs", []):
            ty(t, where)
        if sig.get("output"):
            ty(sig["output"], where)

    def generics(g, where):
        for p in (g or {}).get("params", []):
            k = p.get("kind", {})
            if "type" in k:
                bounds(k["type"].get("bounds"), where)
                if k["type"].get("default"):
                    ty(k["type"]["default"], where)
            elif "const" in k:
                ty(k["const"]["type"], where)
        for w in (g or {}).get("where_predicates", []):
            if "bound_predicate" in w:
                ty(w["bound_predicate"]["type"], where)
                bounds(w["bound_predicate"]["bounds"], where)
            elif "eq_predicate" in w:
                ty(w["eq_predicate"]["lhs"], where)
                rhs = w["eq_predicate"]["rhs"]
                if isinstance(rhs, dict) and "type" in rhs:
                    ty(rhs["type"], where)

    def hidden(item):
        return "hidden" in json.dumps(item.get("attrs", []))

    seen = set()

    def visit(item_id, where, in_trait_impl=False):
        key = str(item_id)
        if key in seen or key not in index:
            return
        seen.add(key)
        item = index[key]
        if item["crate_id"] != 0 or hidden(item):
            return
        if not in_trait_impl and item.get("visibility") not in ("public", "default"):
            return
        inner = item["inner"]
        (kind, v), = inner.items() if isinstance(inner, dict) else ((inner, None),)
        name = item.get("name") or ""
        here = f"{where}::{name}" if name else where
        if kind == "module":
            for child in v["items"]:
                visit(child, here)
        elif kind == "use":
            if v.get("id") is not None and str(v["id"]) in index and index[str(v["id"])]["crate_id"] == 0:
                visit(v["id"], where)
            elif v.get("id") is not None:
                note(v["id"], v.get("source"), f"{where} (re-export {v.get('source')})")
            else:
                note(None, v.get("source"), f"{where} (re-export {v.get('source')})")
        elif kind == "struct":
            generics(v.get("generics"), here)
            sk = v.get("kind", {})
            if isinstance(sk, dict):
                if "plain" in sk:
                    for f in sk["plain"].get("fields", []):
                        visit(f, here)
                elif "tuple" in sk:
                    for f in sk["tuple"]:
                        if f is not None:
                            visit(f, here)
            for i in v.get("impls", []):
                visit_impl(i, here)
        elif kind == "enum":
            generics(v.get("generics"), here)
            for var in v.get("variants", []):
                visit(var, here, in_trait_impl=True)
            for i in v.get("impls", []):
                visit_impl(i, here)
        elif kind == "variant":
            vk = v.get("kind", {})
            if isinstance(vk, dict):
                if "tuple" in vk:
                    for f in vk["tuple"]:
                        if f is not None:
                            visit(f, here, in_trait_impl=True)
                elif "struct" in vk:
                    for f in vk["struct"].get("fields", []):
                        visit(f, here, in_trait_impl=True)
        elif kind == "struct_field":
            ty(v, here)
        elif kind == "union":
            generics(v.get("generics"), here)
            for f in v.get("fields", []):
                visit(f, here)
            for i in v.get("impls", []):
                visit_impl(i, here)
        elif kind == "function":
            generics(v.get("generics"), here)
            fn_sig(v["sig"], here)
        elif kind == "trait":
            generics(v.get("generics"), here)
            bounds(v.get("bounds"), here)
            for child in v.get("items", []):
                visit(child, here, in_trait_impl=True)
        elif kind == "type_alias":
            generics(v.get("generics"), here)
            ty(v["type"], here)
        elif kind in ("constant", "static"):
            ty(v.get("type"), here)
        elif kind == "assoc_type":
            generics(v.get("generics"), here)
            bounds(v.get("bounds"), here)
            if v.get("type"):
                ty(v["type"], here)
        elif kind == "assoc_const":
            ty(v.get("type"), here)

    def visit_impl(impl_id, where):
        key = str(impl_id)
        if key in seen or key not in index:
            return
        seen.add(key)
        item = index[key]
        if hidden(item):
            return
        v = item["inner"]["impl"]
        if v.get("is_synthetic") or v.get("blanket_impl") is not None:
            return
        trait = v.get("trait")
        here = where
        if trait:
            here = f"{where} (impl {trait.get('path')})"
            path_ty(trait, here)
        generics(v.get("generics"), here)
        for child in v.get("items", []):
            visit(child, here, in_trait_impl=bool(trait))

    root = index[str(doc["root"])]
    seen.add(str(doc["root"]))
    for child in root["inner"]["module"]["items"]:
        visit(child, doc_crate)

    bad = {k: w for k, w in found.items() if k[0] not in allow}
    if list_all:
        by_crate = {}
        for (crate, _), places in found.items():
            by_crate[crate] = by_crate.get(crate, 0) + len(places)
        for crate in sorted(by_crate):
            mark = "allowed" if crate in allow else "NOT ALLOWED"
            print(f"{crate}: {by_crate[crate]} place(s) ({mark})")
        print(f"foreign crates in the public API: {len(by_crate)}, not allowed: "
              f"{len({c for c, _ in bad})}")
        return 0
    for (crate, name), places in sorted(bad.items()):
        for where in sorted(places):
            print(f"error: unapproved external type `{name}` (crate `{crate}`) in the public API, at {where}")
    if bad:
        crates_bad = sorted({c for c, _ in bad})
        print(f"\n{len(bad)} unapproved external path(s) from {len(crates_bad)} crate(s): "
              f"{', '.join(crates_bad)}", file=sys.stderr)
        return 1
    print(f"no unapproved external type in the public API of {doc_crate} "
          f"(allowed: {', '.join(sorted(allow - ALWAYS))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
