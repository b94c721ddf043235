"""Named points where a test can freeze a replica, to kill it there with SIGKILL, or to let it go on.

With ``MVSINK_FAILPOINT=<name>`` in the environment, the process that reaches ``hit(<name>)``
writes the file ``MVSINK_FAILPOINT_MARKER`` (when set) and then sleeps until it is killed. Without
that variable ``hit`` does nothing. Two more variables, both optional:

* ``MVSINK_FAILPOINT_ARMED_BY=<path>``: the point fires only once that file exists;
* ``MVSINK_FAILPOINT_RESUME=<path>``: instead of sleeping for good, the process waits until that
  file exists, then goes on from the point; the point fires once per process.
"""

from __future__ import annotations

import os
import time

_fired = False


def hit(name: str) -> None:
    global _fired
    if os.environ.get("MVSINK_FAILPOINT") != name:
        return
    armed_by = os.environ.get("MVSINK_FAILPOINT_ARMED_BY")
    if armed_by and not os.path.exists(armed_by):
        return
    resume = os.environ.get("MVSINK_FAILPOINT_RESUME")
    if resume and _fired:
        return
    _fired = True
    marker = os.environ.get("MVSINK_FAILPOINT_MARKER")
    if marker:
        with open(marker, "w") as f:
            f.write(name)
    while not (resume and os.path.exists(resume)):
        time.sleep(0.1 if resume else 3600)
