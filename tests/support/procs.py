"""Helpers of the Python tests that watch processes: wait for a condition
(bounded), whether a pid still runs, a process's descendants."""
import os
import time

DEADLINE = 60  # seconds any awaited condition gets before a test fails


def wait_until(condition, what, deadline=DEADLINE):
    """Polls condition until it holds; AssertionError after `deadline` s."""
    end = time.monotonic() + deadline
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {deadline} s")
        time.sleep(0.02)


def alive(pid):
    """Whether pid runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def children(pid):
    """pid's children, then theirs, from /proc."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        tasks = f"/proc/{p}/task"
        for task in os.listdir(tasks) if os.path.isdir(tasks) else []:
            try:
                with open(f"{tasks}/{task}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                continue
            out += kids
            todo += kids
    return out
