#!/usr/bin/python3
"""Prints the worker's environment as JSON, for tiderun's interop tests.

Run by a launcher as ``python3 -u print_env.py [OUT_DIR]``. Prints one line,
``ENV <json object of os.environ>``, and when OUT_DIR is given also writes
the same object to OUT_DIR/env_<RANK>.json (written to a temporary name,
then renamed, so a reader never sees half a file). The file is what tests
read: two workers printing to one console may interleave their lines.
"""

import json
import os
import sys


def main():
    env = dict(os.environ)
    text = json.dumps(env, sort_keys=True)
    print("ENV " + text, flush=True)
    if len(sys.argv) > 1:
        rank = env.get("RANK", "norank")
        path = os.path.join(sys.argv[1], f"env_{rank}.json")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.rename(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
