"""`python -m ampft.benchmark.peer SPEC OUT`: one arm, in the process `runner` starts for it."""

import logging
import sys

from ampft.benchmark.peer.arms import main

logging.basicConfig(level=logging.WARNING)
main(*sys.argv[1:3])
