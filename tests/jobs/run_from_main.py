"""Calls hvdplus.run on a function defined here, in `__main__`, as a notebook or a driver
script does (cloudpickle sends it by value), and prints the returned list as JSON.

    run_from_main.py NRANKS [--sleep FOLDER]

With --sleep, each rank writes an empty file named by its process id into FOLDER and sleeps
a minute instead, for tests that interrupt the caller (tests/test_run_function.py).
"""

import argparse
import json

import hvdplus


def greet(sleep_in):
    import os
    import time

    import hvdplus as hvd
    hvd.init()
    if sleep_in:
        open(os.path.join(sleep_in, str(os.getpid())), "w").close()
        time.sleep(60)
    return {"rank": hvd.rank(), "greeting": f"hello from rank {hvd.rank()} of {hvd.size()}"}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("nranks", type=int)
    parser.add_argument("--sleep", metavar="FOLDER")
    arguments = parser.parse_args()
    print(json.dumps(hvdplus.run(greet, args=(arguments.sleep,), np=arguments.nranks)), flush=True)
