"""Entry point: python -m baton_worker (see baton_worker.runtime.options for the flags)."""

import os
import sys

from .runtime.server import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# os._exit: skip interpreter teardown (torch/zmq threads) once the sockets are closed.
os._exit(code)
