#!/usr/bin/env python3
"""Summarises bench/rpc/run.sh's JSON lines: a markdown table of medians across reps.

    summarize.py [FILE...]      (no FILE: stdin)

Reads the lines of rpc_bench (tide), torch_rpc_peer.py (torch, and torch's frontend on
tide's backend: tide-py) and phys, each tagged by
run.sh with "run" (phys, phys-poll, phys-1cpu, phys-2cpu, tide, tide-tcp, torch, tide-py), "rep"
and "setup" (local, netns); a line without "run" is placed by its "impl" (and
"transport":"tcp" for tide).
Prints one table per setup, columns

    metric | tide | tide (tcp) | torch | torch on TIDE | torch/tide | TensorPipe/TIDE | phys

(torch on TIDE: the same Python program as torch's column, backend=TIDE; TensorPipe/TIDE:
how many times faster that is than torch's own backend)

(columns with no figure are left out), notes on tide against the physical limits, and
then lines starting with RESULT: one per median and per ratio. Plain Python, no torch.
Lines that are not JSON objects are skipped with a warning on stderr.
"""

import fileinput
import json
import statistics
import sys

COLUMNS = (("tide", "tide"), ("tide-tcp", "tide (tcp)"), ("torch", "torch"),
           ("tide-py", "torch on TIDE"))
SETUPS = {"local": "one host (127.0.0.1)", "netns": "two network namespaces over a veth pair"}
MIB = 1 << 20


class Row:
    """One line of the table: which records, which fields, and which way is better."""

    def __init__(self, label, metric, kind, field=None, **match):
        self.label = label
        self.metric = metric
        self.kind = kind  # "us" (lower is better), "per_s" or "echo" (higher is better)
        self.field = field
        self.match = match

    def key(self):
        """metric=... [window=...|size_bytes=...] field=...: what a RESULT line is about."""
        parts = [f"metric={self.metric}"] + [f"{k}={v}" for k, v in self.match.items()]
        parts.append(f"field={self.field or 'bytes_each_way_per_s'}")
        return " ".join(parts)


ROWS = (
    Row("rpc_sync no-op, median RTT", "sync_rtt_us", "us", "median"),
    Row("rpc_sync no-op, p99 RTT", "sync_rtt_us", "us", "p99"),
    Row("rpc_async no-op, 64 outstanding", "async_calls_per_s", "per_s", "value", window=64),
    Row("rpc_async no-op, 256 outstanding", "async_calls_per_s", "per_s", "value", window=256),
    Row("echo 1 MiB tensor, each way (RTT)", "echo", "echo", size_bytes=MIB),
    Row("echo 64 MiB tensor, each way (RTT)", "echo", "echo", size_bytes=64 * MIB),
    Row("echo 1 MiB, a new tensor back (clone)", "echo_clone", "echo", size_bytes=MIB),
    Row("echo 64 MiB, a new tensor back (clone)", "echo_clone", "echo", size_bytes=64 * MIB),
    Row("remote() + to_here(), median", "remote_to_here_us", "us", "median"),
    Row("RRef proxy call (rpc_sync().get), median", "proxy_rtt_us", "us", "median"),
    Row("pass an RRef user -> user (fork + accept), median", "rref_pass_us", "us", "median"),
    Row("model-parallel step, remote() layer (B=16, D=64), median", "dist_autograd_step_us",
        "us", "median", variant="rref"),
    Row("model-parallel step, RemoteModule (B=16, D=64), median", "dist_autograd_step_us",
        "us", "median", variant="remotemod"),
)


def run_of(r):
    if "run" in r:
        return r["run"]
    if r.get("impl") == "tide" and r.get("transport") == "tcp":
        return "tide-tcp"
    return r.get("impl", "?")


def read_records(paths):
    records = []
    for line in fileinput.input(paths):
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
        except ValueError:
            r = None
        if not isinstance(r, dict):
            print(f"summarize.py: skipping a line that is not a JSON object: {line[:80]}",
                  file=sys.stderr)
            continue
        records.append(r)
    return records


def select(records, run, metric, match):
    return [r for r in records if run_of(r) == run and r.get("metric") == metric
            and all(r.get(k) == v for k, v in match.items())]


def median_of(rs, field):
    xs = [r[field] for r in rs if isinstance(r.get(field), (int, float))]
    return (statistics.median(xs), len(xs)) if xs else (None, 0)


def fmt_us(us):
    if us >= 1000:
        return f"{us / 1000:.2f} ms"
    return f"{us:.1f} us" if us >= 10 else f"{us:.2f} us"


def fmt_rate(per_s):
    return f"{per_s / 1000:.1f}k/s" if per_s < 100e3 else f"{per_s / 1000:.0f}k/s"


def fmt_gbps(bytes_per_s):
    return f"{bytes_per_s / 1e9:.2f} GB/s"


def fmt_ms(ms):
    return f"{ms:.3f} ms" if ms < 1 else f"{ms:.1f} ms" if ms >= 100 else f"{ms:.2f} ms"


def fmt_ratio(x):
    return f"{x:.2f}x" if x < 1 else f"{x:.1f}x" if x < 10 else f"{x:.0f}x"


class Cell:
    """A row's medians for one column: the figure compared and the text shown."""

    def __init__(self, row, rs, reps):
        self.value = None
        self.text = ""
        if row.kind == "echo":
            self.value, n = median_of(rs, "bytes_each_way_per_s")
            rtt, _ = median_of(rs, "rtt_ms_median")
            if self.value is not None:
                self.text = fmt_gbps(self.value) + (f" ({fmt_ms(rtt)})" if rtt else "")
        else:
            self.value, n = median_of(rs, row.field)
            if self.value is not None:
                self.text = fmt_us(self.value) if row.kind == "us" else fmt_rate(self.value)
        if self.value is not None and n < reps:
            self.text += f" ({n}/{reps} reps)"


def speedup(row, tide, torch):
    """How many times faster tide is: torch's latency / tide's, tide's rate / torch's."""
    if not tide or not torch:
        return None
    return torch / tide if row.kind == "us" else tide / torch


def phys_median(records, run, metric, field):
    return median_of(select(records, run, metric, {}), field)[0]


# Where the two ends of phys's ping-pong ran.
PINGPONG_RUNS = (("phys", "as scheduled"), ("phys-poll", "both polling"),
                 ("phys-1cpu", "on one CPU"), ("phys-2cpu", "on two CPUs"))


def phys_cell(row, records):
    tcp = phys_median(records, "phys", "tcp_bytes_per_s", "value")
    mem = phys_median(records, "phys", "memcpy_bytes_per_s", "value")
    parts = []
    if row.metric == "sync_rtt_us":
        for run, where in PINGPONG_RUNS:
            us = phys_median(records, run, "tcp_pingpong_us", row.field)
            if us:
                parts.append(f"{fmt_us(us)} {where}")
        if parts:
            return "TCP ping-pong " + ", ".join(parts)
    elif row.kind == "echo" and tcp:
        parts.append(f"TCP one way {fmt_gbps(tcp)}")
        if row.match["size_bytes"] == 64 * MIB and mem:
            parts.append(f"memcpy {fmt_gbps(mem)}")
    return "; ".join(parts)


def describe_torch(records):
    rs = [r for r in records if run_of(r) == "torch"]
    if not rs:
        return None
    transports = sorted({r.get("transport", "TensorPipe's choice") for r in rs})
    channels = sorted({r.get("channel", "TensorPipe's choice") for r in rs})
    return f"torch's transport: {', '.join(transports)}; channel: {', '.join(channels)}"


def physical_notes(records):
    """tide against the physical limits, for each tide column that has figures."""
    notes = []
    pings = [(where, phys_median(records, run, "tcp_pingpong_us", "median"))
             for run, where in PINGPONG_RUNS]
    tcp = phys_median(records, "phys", "tcp_bytes_per_s", "value")
    mem = phys_median(records, "phys", "memcpy_bytes_per_s", "value")
    for run, title in COLUMNS[:2]:
        rtt = median_of(select(records, run, "sync_rtt_us", {}), "median")[0]
        bulk = median_of(select(records, run, "echo", {"size_bytes": 64 * MIB}),
                         "bytes_each_way_per_s")[0]
        parts = []
        ratios = [f"{fmt_ratio(rtt / us)} ({where})" for where, us in pings if rtt and us]
        if ratios:
            parts.append("rpc_sync RTT " + ", ".join(ratios) + " the TCP ping-pong's")
        limits = []
        if bulk and tcp:
            limits.append(f"{bulk / tcp:.0%} of one-way TCP")
        if bulk and mem:
            limits.append(f"{bulk / mem:.0%} of memcpy")
        if limits:
            parts.append("64 MiB echo at " + ", ".join(limits))
        if parts:
            notes.append(f"{title}: " + "; ".join(parts))
    return notes


def summarize(records, out):
    results = []
    setups = sorted({r.get("setup", "local") for r in records},
                    key=lambda s: (s not in SETUPS, s))
    for setup in setups:
        rs = [r for r in records if r.get("setup", "local") == setup]
        reps = len({r.get("rep") for r in rs})
        table = []
        for row in ROWS:
            cells = {run: Cell(row, select(rs, run, row.metric, row.match), reps)
                     for run, _ in COLUMNS}
            ratio = speedup(row, cells["tide"].value, cells["torch"].value)
            py_ratio = speedup(row, cells["tide-py"].value, cells["torch"].value)
            table.append((row, cells, ratio, py_ratio, phys_cell(row, rs)))
            for run, cell in cells.items():
                if cell.value is not None:
                    results.append(f"RESULT rpc setup={setup} run={run} {row.key()} "
                                   f"median={cell.value:.6g}")
            if ratio is not None:
                results.append(f"RESULT rpc setup={setup} ratio=torch/tide {row.key()} "
                               f"value={ratio:.3g}")
            if py_ratio is not None:
                results.append(f"RESULT rpc setup={setup} ratio=tensorpipe/tide-py {row.key()} "
                               f"value={py_ratio:.3g}")
        shown = [(run, title) for run, title in COLUMNS
                 if any(cells[run].value is not None for _, cells, _, _, _ in table)]
        show_ratio = any(ratio is not None for _, _, ratio, _, _ in table)
        show_py_ratio = any(r is not None for _, _, _, r, _ in table)
        show_phys = any(phys for _, _, _, _, phys in table)
        header = ["metric"] + [title for _, title in shown]
        header += ["torch/tide"] if show_ratio else []
        header += ["TensorPipe/TIDE"] if show_py_ratio else []
        header += ["phys"] if show_phys else []
        print(f"### {SETUPS.get(setup, setup)}: medians over {reps} rep{'s' if reps != 1 else ''}\n", file=out)
        print("| " + " | ".join(header) + " |", file=out)
        print("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|", file=out)
        for row, cells, ratio, py_ratio, phys in table:
            line = [row.label] + [cells[run].text for run, _ in shown]
            line += [fmt_ratio(ratio) if ratio is not None else ""] if show_ratio else []
            line += [fmt_ratio(py_ratio) if py_ratio is not None else ""] if show_py_ratio else []
            line += [phys] if show_phys else []
            print("| " + " | ".join(line) + " |", file=out)
        print(file=out)
        if show_ratio:
            print("- torch/tide: how many times faster tide is (torch's latency / tide's, "
                  "tide's calls/s or bytes/s / torch's).", file=out)
        if show_py_ratio:
            print("- torch on TIDE: the same Python program as torch's column, on tide's "
                  "backend (backend=TIDE); TensorPipe/TIDE: how many times faster that is.",
                  file=out)
        torch = describe_torch(rs)
        if torch:
            print(f"- {torch}.", file=out)
        for note in physical_notes(rs):
            print(f"- {note}.", file=out)
        checks = [r for r in rs if r.get("metric") == "dist_autograd_check"]
        if checks:
            bad = sorted({run_of(r) for r in checks if not r.get("ok")})
            print("- Model-parallel step: the remote layer's update after one step "
                  + (f"DIFFERS from the local computation in {', '.join(bad)}"
                     if bad else "equals the local computation's") + f" ({len(checks)} checks).",
                  file=out)
            results.append(f"RESULT rpc setup={setup} metric=dist_autograd_check "
                           f"ok={'false' if bad else 'true'} n={len(checks)}")
        print(file=out)
    for line in results:
        print(line, file=out)


def main():
    records = read_records(sys.argv[1:])
    if not records:
        print("summarize.py: no JSON lines to summarise", file=sys.stderr)
        return 1
    summarize(records, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
