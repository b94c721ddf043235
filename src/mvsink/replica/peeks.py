"""Pending peeks: each is answered exactly once, when its time is readable or it is canceled.

A peek at time `t` waits while `t >= upper` of its view's table (the view is not final at `t`
yet) and runs once `t < upper`; a `t` below the since is answered with an error at once. Peeks
run on a small pool of threads, each in its own Spark job group, so a long peek neither blocks
the command stream nor other peeks, and a canceled peek's jobs are cancelled too.

Invariants: a peek gets one :class:`PeekResponse` (rows, error or canceled) or, if the controller
reconnects first (:meth:`PendingPeeks.clear`), none; a cancel for a peek already answered is
ignored. An oversized or failing peek is an error response, never a crash of the replica.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from mvsink.target.read import view_upper
from mvsink.replica.peek import PeekError, PeekNotReady, PeekRequest, run_peek
from mvsink.replica.protocol import PEEK_CANCELED, PEEK_ERROR, Peek, PeekResponse

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    peek: Peek
    target: str
    generation: int
    running: bool = False


class PendingPeeks:
    def __init__(self, spark, send: Callable[[PeekResponse], None], poll_seconds: float = 0.5,
                 threads: int = 2):
        self.spark = spark
        self.send = send
        self.poll_seconds = poll_seconds
        self._pending: dict[str, _Pending] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="mvsink-peek")
        threading.Thread(target=self._watch, name="mvsink-peeks", daemon=True).start()

    def add(self, peek: Peek, target: str, since: int) -> None:
        if peek.time < since:
            self.send(PeekResponse(peek.uuid, PEEK_ERROR, error=(
                f"view {peek.view_id!r} is compacted to since {since}: time {peek.time} is no "
                f"longer readable")))
            return
        with self._lock:
            if peek.uuid in self._pending:
                self.send(PeekResponse(peek.uuid, PEEK_ERROR, error=f"peek {peek.uuid} is already pending"))
                return
            self._pending[peek.uuid] = _Pending(peek, target, self._generation)
        self._wake.set()

    def cancel(self, uuid: str) -> None:
        with self._lock:
            pending = self._pending.pop(uuid, None)
        if pending is None:
            return  # answered already (or never seen): nothing to do
        if pending.running:
            self.spark.sparkContext.cancelJobGroup(_job_group(uuid))
        self.send(PeekResponse(uuid, PEEK_CANCELED))

    def fail_view(self, view_id: str, message: str) -> None:
        """Answer every pending peek on ``view_id`` with an error (the view was dropped)."""
        with self._lock:
            doomed = [uuid for uuid, p in self._pending.items() if p.peek.view_id == view_id]
            for uuid in doomed:
                del self._pending[uuid]
        for uuid in doomed:
            self.send(PeekResponse(uuid, PEEK_ERROR, error=message))

    def clear(self) -> None:
        """Forget all pending peeks unanswered (the controller that asked is gone)."""
        with self._lock:
            self._generation += 1
            self._pending.clear()

    def wake(self) -> None:
        self._wake.set()

    def __len__(self) -> int:
        return len(self._pending)

    def _watch(self) -> None:
        while True:
            self._wake.wait(self.poll_seconds)
            self._wake.clear()
            with self._lock:
                waiting = [p for p in self._pending.values() if not p.running]
            uppers: dict[tuple[str, str], int] = {}
            for pending in waiting:
                key = (pending.target, pending.peek.view_id)
                try:
                    if key not in uppers:
                        uppers[key] = view_upper(*key)
                except Exception as exc:  # the table cannot be read now; keep waiting
                    log.warning("peek %s: cannot read the upper of %s: %s", pending.peek.uuid, key, exc)
                    continue
                if pending.peek.time < uppers[key]:
                    with self._lock:
                        if self._pending.get(pending.peek.uuid) is not pending:
                            continue
                        pending.running = True
                    self._pool.submit(self._run, pending)

    def _run(self, pending: _Pending) -> None:
        peek = pending.peek
        request = PeekRequest(view_id=peek.view_id, target=pending.target, time=peek.time,
                              filter=peek.filter,
                              columns=tuple(peek.columns) if peek.columns is not None else None,
                              limit=peek.limit, offset=peek.offset,
                              max_result_bytes=peek.max_result_bytes)
        self.spark.sparkContext.setJobGroup(_job_group(peek.uuid), f"peek {peek.uuid}",
                                            interruptOnCancel=True)
        try:
            response = PeekResponse.rows(peek.uuid, run_peek(self.spark, request))
        except PeekNotReady:
            with self._lock:
                pending.running = False
            return
        except PeekError as exc:
            response = PeekResponse(peek.uuid, PEEK_ERROR, error=str(exc))
        except Exception as exc:
            log.exception("peek %s failed", peek.uuid)
            response = PeekResponse(peek.uuid, PEEK_ERROR, error=f"peek failed: {exc}")
        finally:
            self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        with self._lock:
            current = self._pending.get(peek.uuid) is pending and pending.generation == self._generation
            if current:
                del self._pending[peek.uuid]
        if current:
            self.send(response)


def _job_group(uuid: str) -> str:
    return f"mvsink-peek-{uuid}"
