"""docs/torchrun-parity.md against tiderun itself.

For each row of the flags table: every spelling is an option of
`tiderun --help`, with the row's PET_ variable as its environment name;
for each row of either table with arguments or variables to run with: a
one-node job given them runs to success. The behaviours are tested with
real jobs in torchrun_parity_test.cpp and the other tiderun tests.

    torchrun_parity_test.py SOURCE_DIR TIDERUN
"""
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Leaves a mark where the job runs, whatever the output flags say.
WORKER = '#!/bin/sh\necho "worker $RANK of $WORLD_SIZE"\ntouch "ran.$RANK"\n'


def cells(line):
    """The cells of a markdown table row; `\\|` is a pipe inside a cell."""
    parts = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [p.strip().replace("\\|", "|") for p in parts]


def ticks(cell):
    return re.findall(r"`([^`]*)`", cell)


def tables(path):
    """{section title: [row cells, ...]} of the doc's tables."""
    out = {}
    section = None
    for line in open(path, encoding="utf-8"):
        if line.startswith("## "):
            section = line[3:].strip()
        elif line.startswith("| `") and section:
            out.setdefault(section, []).append(cells(line))
    return out


def help_options(tiderun):
    """{option spelling: the whole help line that declares it}."""
    text = subprocess.run([tiderun, "--help"], capture_output=True,
                          text=True, check=True).stdout
    options = {}
    for line in text.splitlines():
        m = re.match(r"^  (-\S+)", line)
        if m:
            for name in m.group(1).split(","):
                options[name] = line
    return options


def run_job(tiderun, args, env_vars, tmp):
    worker = os.path.join(tmp, "worker.sh")
    with open(worker, "w") as f:
        f.write(WORKER)
    os.chmod(worker, 0o755)
    env = dict(os.environ, TMPDIR=tmp, PYTHON_EXEC="/usr/bin/python3")
    env.update(env_vars)
    return subprocess.run([tiderun] + args + [worker], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


def main(source, tiderun):
    doc = os.path.join(source, "docs", "torchrun-parity.md")
    t = tables(doc)
    flags, variables = t.get("Flags", []), t.get("Variables", [])
    failures = []
    if len(flags) < 30 or len(variables) < 8:
        failures.append(f"{doc}: {len(flags)} flag rows and "
                        f"{len(variables)} variable rows; the tables are "
                        f"incomplete")
    options = help_options(tiderun)
    jobs = []
    for row in flags:
        names, var, run_with = ticks(row[0]), ticks(row[1]), row[2]
        for name in names:
            line = options.get(name)
            if line is None:
                failures.append(f"{name}: not an option of tiderun --help")
            elif var and f"(Env:{var[0]})" not in line:
                failures.append(f"{name}: tiderun --help names no {var[0]}: {line.strip()}")
        if run_with != "—":
            jobs.append((names[0], shlex.split(" ".join(ticks(run_with))), {}))
    for row in variables:
        if row[2] != "—":
            assignment = ticks(row[2])[0]
            name, value = assignment.split("=", 1)
            jobs.append((name, ["--nproc-per-node=2"], {name: value}))
    for what, args, env_vars in jobs:
        with tempfile.TemporaryDirectory(prefix="tide-parity-") as tmp:
            r = run_job(tiderun, args, env_vars, tmp)
            shown = " ".join(args + [f"{k}={v}" for k, v in env_vars.items()])
            if r.returncode != 0 or not os.path.exists(os.path.join(tmp, "ran.0")):
                failures.append(f"{what}: a job with {shown} exited "
                                f"{r.returncode}:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
            else:
                print(f"ok  {what}: {shown}")
    print(f"{len(flags)} flags, {len(variables)} variables, {len(jobs)} jobs run")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
