"""Entry point: python -m baton_worker (see baton_worker.options for the flags)."""

import os
import sys

from .server import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# os._exit: skip interpreter teardown (torch/zmq threads) once the sockets are closed.
os._exit(code)
