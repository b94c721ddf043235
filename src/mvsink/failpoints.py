"""Named points where a test can freeze a replica, to kill it there with SIGKILL.

With ``MVSINK_FAILPOINT=<name>`` in the environment, the process that reaches ``hit(<name>)``
writes the file ``MVSINK_FAILPOINT_MARKER`` (when set) and then sleeps until it is killed. Without
that variable ``hit`` does nothing.
"""

from __future__ import annotations

import os
import time


def hit(name: str) -> None:
    if os.environ.get("MVSINK_FAILPOINT") != name:
        return
    marker = os.environ.get("MVSINK_FAILPOINT_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write(name)
    while True:
        time.sleep(3600)
