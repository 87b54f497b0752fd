"""One process of a job whose processes were given different flags: `python differing_flags_worker.py EXTRA ARGS...`.

`EXTRA` is a JSON list with one list of flags per process; this process
runs `keras-vit ARGS... EXTRA[index]`, its index read from the variables of
whichever launcher started it (torchrun's `RANK`, Keras'
`KERAS_DISTRIBUTION_PROCESS_ID`, `TF_CONFIG`'s task). torchrun starts every
process with the same command; this is how its processes get different ones.
"""

import json
import os
import sys


def index():
    if os.environ.get("RANK"):
        return int(os.environ["RANK"])
    if os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID"):
        return int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"])
    return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])


if __name__ == "__main__":
    extra = json.loads(sys.argv[1])
    from keras_vit.cli import main

    sys.exit(main([*sys.argv[2:], *extra[index()]]))
