#!/usr/bin/env python3
"""Holds tide's sources to the arrows of src/layers.txt.

Every file under include/tide/<part>/ and src/<part>/ belongs to <part>. A
quoted #include names a part by its first folder ("tide/store/..." is
store's public header, "store/..." one of its private ones). A file may
include its own part, and the parts its part may use: a public header only
those its part uses in public (before the bar in layers.txt), a source
anything its part uses. A public header never includes a private one.

The tests are held to the same picture: a file under tests/<part>/ tests
<part> and may include the headers of <part> and of every part below it
(what <part> uses, and what those use, down to common), public or private,
besides the tests' own helpers (tests/support/). So a transport test never
reaches for the rpc layer above it.

    layers_test.py [ROOT]
"""
import pathlib
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def read_layers(path):
    layers = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        part, _, uses = line.partition(":")
        public, _, private = uses.partition("|")
        layers[part.strip()] = (set(public.split()), set(private.split()))
    for part, (public, private) in layers.items():
        for used in public | private:
            if used not in layers:
                sys.exit(f"layers.txt: {part} uses {used}, which is no part")
    return layers


def below(layers, part):
    """The parts `part` uses, directly or through others."""
    seen, todo = set(), [part]
    while todo:
        public, private = layers[todo.pop()]
        for used in public | private:
            if used not in seen:
                seen.add(used)
                todo.append(used)
    return seen


def check(root):
    layers = read_layers(root / "src" / "layers.txt")
    failures = []
    files = 0

    def scan(path, part, public, test=False):
        nonlocal files
        files += 1
        rel = path.relative_to(root)
        if part not in layers:
            failures.append(f"{rel}: in folder '{part}', which is no part of layers.txt")
            return
        allowed_public, allowed_private = layers[part]
        if test:
            allowed = {part} | below(layers, part)
        else:
            allowed = {part} | allowed_public | (set() if public else allowed_private)
        text = path.read_text(errors="replace")
        for m in INCLUDE.finditer(text):
            name = m.group(1)
            line = text.count("\n", 0, m.start()) + 1
            pieces = name.split("/")
            if pieces[0] == "tide" and len(pieces) > 2:
                used, private_header = pieces[1], False
            elif len(pieces) > 1 and pieces[0] in layers:
                used, private_header = pieces[0], True
            else:
                continue  # a header of this folder, or not tide's
            if public and private_header:
                failures.append(
                    f"{rel}:{line}: public header includes private \"{name}\"")
            elif used not in allowed:
                kind = "tests" if test else "public headers" if public else "sources"
                failures.append(
                    f"{rel}:{line}: \"{name}\": {part}'s {kind} may not use "
                    f"{used} (src/layers.txt allows {sorted(allowed - {part})})")

    layer_names = set(layers)

    for path in sorted((root / "include" / "tide").rglob("*.h")):
        scan(path, path.relative_to(root / "include" / "tide").parts[0], True)
    for path in sorted((root / "src").rglob("*")):
        if path.suffix in (".h", ".cpp") and path.parent != root / "src":
            scan(path, path.relative_to(root / "src").parts[0], False)
    # tests/<part>/ for each part; other folders (apps, fuzz, interop,
    # support, ...) test programs or many parts at once.
    for path in sorted((root / "tests").rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        folder = path.relative_to(root / "tests").parts[0]
        if folder in layer_names and path.parent != root / "tests":
            scan(path, folder, False, test=True)
    return files, failures


def check_picture(root, layers):
    """docs/architecture.md's picture: one line a part, `part ─► uses`,
    which must list exactly what layers.txt says the part uses (common,
    which every part uses, aside)."""
    text = (root / "docs" / "architecture.md").read_text()
    block = text.split("```", 2)[1]
    drawn = {}
    for line in block.splitlines():
        m = re.match(r"\s*([a-z_]+)\s+─►\s+(.*)$", line)
        if m:
            drawn[m.group(1)] = {u.strip() for u in m.group(2).split(",")}
        elif re.match(r"\s*[a-z_]+(, [a-z_]+)+\s*$", line):
            for part in line.split(","):
                drawn[part.strip()] = set()
    failures = []
    for part, (public, private) in layers.items():
        if part == "common":
            continue
        want = (public | private) - {"common"}
        got = drawn.get(part)
        if got is None:
            failures.append(f"docs/architecture.md: the picture lacks {part}")
        elif got != want:
            failures.append(
                f"docs/architecture.md: the picture has {part} ─► "
                f"{sorted(got)}, src/layers.txt {sorted(want)}")
    return failures


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[1])
    files, failures = check(root)
    failures += check_picture(root, read_layers(root / "src" / "layers.txt"))
    for f in failures:
        print(f"FORBIDDEN {f}")
    bad = len({f.split(":", 1)[0] for f in failures})
    print(f"layers: {files} files checked against src/layers.txt")
    print(f"{files - bad} passed, {bad} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
