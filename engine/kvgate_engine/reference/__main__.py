"""``python -m kvgate_engine.reference <sglang.launch_server flags>``."""

import logging
import os
import sys

from kvgate_engine.reference.main import main

code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
# Everything is closed by now; skip the interpreter's teardown so a SIGTERM'd pod (and every
# test) exits at once.
os._exit(code)
