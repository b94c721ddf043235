"""Which view a log line is about: a context variable set around each view's work, read by a filter.

A job runs many views, each stepping on a thread of its own (:class:`~mvsink.step_loop.StepLoop`),
so their lines interleave; the modules a step goes through (write/, append/, correction/,
desired/, ...) log without knowing the view. :func:`about_view` sets the view for the code it
wraps; :class:`ViewFilter`, on a handler, gives every record a ``view`` attribute (``view NAME:
`` or empty, or empty where the message starts by naming the view), which the job's log format
puts before the message. So ``grep 'view v1'`` follows one view's life.

Invariants: the context is per thread (and per asyncio task): one view's step never labels
another's lines; outside :func:`about_view` records get an empty ``view``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re

_view: contextvars.ContextVar[str | None] = contextvars.ContextVar("mvsink_view", default=None)


@contextlib.contextmanager
def about_view(view_id: str):
    """Label the log lines of the code within with ``view_id``."""
    token = _view.set(view_id)
    try:
        yield
    finally:
        _view.reset(token)


class ViewFilter(logging.Filter):
    """Sets ``record.view`` to ``"view NAME: "`` within :func:`about_view`, unless the message
    starts by naming the view itself (``view NAME`` or ``view 'NAME'``), else ``""``; keeps
    every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        view = _view.get()
        record.view = ""
        if view is not None and not re.match(rf"view '?{re.escape(view)}\b", record.getMessage()):
            record.view = f"view {view}: "
        return True
