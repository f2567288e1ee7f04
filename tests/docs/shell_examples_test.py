"""The shell examples of README.md and docs/*.md, as a reader pastes them.

(And the Python examples marked to run: run with `loader` and
`train_step` defined, outside any agent.)

Every ```sh block must parse (bash -n) and may not follow a line's
backslash with blanks or a comment (the backslash then escapes a blank, the
command ends there, and the next line runs as a command of its own). A block right after
an HTML comment `<!-- test: run -->` is also run, with bash -e, in a scratch
directory holding stand-ins for the scripts the docs name (train.py, a
worker that prints its rank; train.sh, the same in shell), tiderun and
tide-timeline on PATH. It must exit 0.

    shell_examples_test.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import subprocess
import sys
import tempfile

FENCE = re.compile(r"^```(sh|python)\s*$")
# What the Python examples leave to the reader.
PYTHON_PRELUDE = "loader = range(3)\ndef train_step(batch):\n    pass\n"
RUN_MARK = "<!-- test: run -->"
TRAIN_PY = 'import os\nprint(f"train.py: rank {os.environ[\'RANK\']} of {os.environ[\'WORLD_SIZE\']}")\n'
TRAIN_SH = '#!/bin/sh\necho "train.sh: rank $RANK of $WORLD_SIZE"\n'


def blocks(path):
    """(first line number, language, text, marked to run) of each block."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            marked = any(l.strip() == RUN_MARK for l in lines[max(0, i - 2):i])
            out.append((start + 1, fence.group(1),
                        "\n".join(lines[start:end]) + "\n", marked))
            i = end
        i += 1
    return out


def check(source, build):
    docs = [os.path.join(source, "README.md")] + sorted(
        os.path.join(source, "docs", f)
        for f in os.listdir(os.path.join(source, "docs"))
        if f.endswith(".md"))
    failures = []
    ran = 0
    for doc in docs:
        name = os.path.relpath(doc, source)
        for line, language, text, marked in blocks(doc):
            where = f"{name}:{line}"
            if language == "python":
                if marked:
                    ran += 1
                    run = subprocess.run(["/usr/bin/python3", "-c", PYTHON_PRELUDE + text],
                                         text=True, capture_output=True, timeout=60)
                    print(f"--- {where} (run)\n{text}{run.stdout}{run.stderr}")
                    if run.returncode != 0:
                        failures.append(f"{where}: exited {run.returncode}")
                continue
            for n, l in enumerate(text.split("\n")):
                if re.search(r"\\[ \t]+(#.*)?$", l):
                    failures.append(
                        f"{where}+{n}: a backslash followed by blanks or a "
                        f"comment continues nothing (the command ends "
                        f"there): {l.strip()}")
            syntax = subprocess.run(["bash", "-n"], input=text, text=True,
                                    capture_output=True)
            if syntax.returncode != 0:
                failures.append(f"{where}: bash -n: {syntax.stderr.strip()}")
                continue
            if not marked:
                continue
            ran += 1
            with tempfile.TemporaryDirectory(prefix="tide-docs-") as tmp:
                for f, body in (("train.py", TRAIN_PY), ("train.sh", TRAIN_SH)):
                    p = os.path.join(tmp, f)
                    with open(p, "w") as out:
                        out.write(body)
                    os.chmod(p, 0o755)
                env = dict(os.environ)
                env["PATH"] = os.path.join(build, "apps") + os.pathsep + env["PATH"]
                env["PYTHON_EXEC"] = "/usr/bin/python3"
                run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text],
                                     cwd=tmp, env=env, text=True,
                                     capture_output=True, timeout=120)
                print(f"--- {where} (run)\n{text}{run.stdout[-2000:]}{run.stderr[-2000:]}")
                if run.returncode != 0:
                    failures.append(f"{where}: exited {run.returncode}")
    print(f"{ran} block(s) run")
    if ran == 0:
        failures.append("no block is marked to run")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[1], sys.argv[2]))
