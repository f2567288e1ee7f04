"""Runs one worker of tide.elastic's LocalElasticAgent (the agent starts
`python -u -m tide.elastic._worker PAYLOAD` for a function entrypoint).

PAYLOAD holds what multiprocessing's spawn passes a child (the launcher's
sys.path, argv, working directory and __main__ module), then the pickled
function and arguments. The function runs under @record; its return value is
written beside PAYLOAD as return_<LOCAL_RANK>.pkl for the launcher.

`python -m tide.elastic._worker --exec PROGRAM ARGS...` runs a program whose
arguments name ${local_rank}, as torch substitutes it.
"""
import multiprocessing.spawn
import os
import pickle
import sys
from string import Template


def _substitute(args, local_rank):
    return tuple(Template(a).safe_substitute(local_rank=local_rank) if isinstance(a, str)
                 else a for a in args)


def main(argv):
    local_rank = os.environ["LOCAL_RANK"]
    if argv[1:2] == ["--exec"]:
        command = list(_substitute(argv[2:], local_rank))
        os.execvp(command[0], command)
    payload = argv[1]
    with open(payload, "rb") as f:
        preparation, call = pickle.load(f)
    multiprocessing.spawn.prepare(preparation)
    fn, args = pickle.loads(call)
    from tide.elastic.multiprocessing.errors import record
    value = record(fn)(*_substitute(args, local_rank))
    out = os.path.join(os.path.dirname(payload), f"return_{local_rank}.pkl")
    with open(out + ".tmp", "wb") as f:
        pickle.dump(value, f)
    os.replace(out + ".tmp", out)


if __name__ == "__main__":
    main(sys.argv)
