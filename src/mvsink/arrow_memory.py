"""The memory pool of the Arrow work mvsink does in its own (driver) process.

A step reads, cancels and rewrites files with Arrow in the driver (a rewrite's changes,
:mod:`mvsink.desired.log_changes`; a join's terms and the groups' state,
:mod:`mvsink.desired.in_process`; the view's touched files rewritten, :mod:`mvsink.write.rewrite`),
allocating and freeing hundreds of MB per step. pyarrow's default pool (mimalloc) commits its
arenas eagerly; on the 2-core VM mvsink is measured on, its first use of that memory was slow,
and again in later steps (1.5-2.1 s for the 1M rows of one rewrite's cancel pass, against 0.3 s
with the system allocator or with mimalloc's eager commit off; ``benchmarks/HISTORY.md``). So
mvsink makes the system allocator pyarrow's default pool once per process, unless
``ARROW_DEFAULT_MEMORY_POOL`` chose one (``mimalloc``, ``jemalloc`` or ``system``: pyarrow's own
setting, which mvsink leaves as it is). Arrays already allocated keep their pool.
"""

from __future__ import annotations

import logging
import os

import pyarrow as pa

log = logging.getLogger(__name__)

#: pyarrow's setting of its default pool, read when pyarrow is loaded.
POOL_SETTING = "ARROW_DEFAULT_MEMORY_POOL"


def use_system_allocator() -> None:
    """Make the system allocator pyarrow's default pool, unless :data:`POOL_SETTING` is set."""
    if os.environ.get(POOL_SETTING) or pa.default_memory_pool().backend_name == "system":
        return
    pa.set_memory_pool(pa.system_memory_pool())
    log.info("Arrow's default memory pool is now the system allocator (set %s to choose another)", POOL_SETTING)
