#!/usr/bin/env python3
"""Holds tide's sources to the arrows of src/layers.txt.

Every file under include/tide/<part>/ and src/<part>/ belongs to <part>. A
quoted #include names a part by its first folder ("tide/store/..." is
store's public header, "store/..." one of its private ones). A file may
include its own part, and the parts its part may use: a public header only
those its part uses in public (before the bar in layers.txt), a source
anything its part uses. A public header never includes a private one.

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


def check(root):
    layers = read_layers(root / "src" / "layers.txt")
    failures = []
    files = 0

    def scan(path, part, public):
        nonlocal files
        files += 1
        rel = path.relative_to(root)
        if part not in layers:
            failures.append(f"{rel}: in folder '{part}', which is no part of layers.txt")
            return
        allowed_public, allowed_private = layers[part]
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
                kind = "public headers" if public else "sources"
                failures.append(
                    f"{rel}:{line}: \"{name}\": {part}'s {kind} may not use "
                    f"{used} (src/layers.txt allows {sorted(allowed - {part})})")

    for path in sorted((root / "include" / "tide").rglob("*.h")):
        scan(path, path.relative_to(root / "include" / "tide").parts[0], True)
    for path in sorted((root / "src").rglob("*")):
        if path.suffix in (".h", ".cpp") and path.parent != root / "src":
            scan(path, path.relative_to(root / "src").parts[0], False)
    return files, failures


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else
                        pathlib.Path(__file__).resolve().parents[1])
    files, failures = check(root)
    for f in failures:
        print(f"FORBIDDEN {f}")
    bad = len({f.split(":", 1)[0] for f in failures})
    print(f"layers: {files} files checked against src/layers.txt")
    print(f"{files - bad} passed, {bad} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
