"""Stands in for moai.train: writes its pid, then sleeps (to be killed with its process group)."""

import os
import sys
import time

with open(sys.argv[sys.argv.index("--config") + 1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(300)
