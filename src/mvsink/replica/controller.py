"""The controller: a Python client that drives one replica over the protocol.

A :class:`Controller` keeps its own command history (what it wants the replica to run). On
:meth:`Controller.connect` it opens the stream and replays that history, then
``InitializationComplete``: the replica reconciles, so views it already runs as asked keep running.
A controller without a history of its own (a command line, a new operator process) can *adopt* the
replica's (the ``History`` call) and so change nothing by connecting.

Responses are read by a background thread into: the latest frontier per view (and the full
sequence, to check they only advance), the latest ``Status``, peek and plan results by uuid, and
errors.

:func:`cutover` is the blue/green cutover between two replicas: of every view the new replica
runs, since allowing writes promotes them all (:func:`views_to_cut_over`); with a bound on the
new replica's plans it refuses, changing nothing, when a first commit would write more.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid as uuidlib

import grpc
import pyarrow as pa

from mvsink.replica.history import CommandHistory
from mvsink.replica.protocol import (PEEK_CANCELED, PEEK_ROWS, AllowCompaction, AllowWrites, CancelPeek,
                                     CreateDataflow, CreateInstance, CreateTimely, Error, FrontierUpper,
                                     InitializationComplete, Peek, PeekResponse, Plan, PlanResponse,
                                     Schedule, Status, UpdateConfiguration, decode, decode_response,
                                     encode)
from mvsink.replica.server import CHANNEL_OPTIONS, HISTORY_METHOD, STREAM_METHOD
from mvsink.view import shared_spec, spec_from_yaml

log = logging.getLogger(__name__)


class ControllerError(RuntimeError):
    """The replica refused a command, failed a peek, or did not answer in time."""


class PeekCanceled(ControllerError):
    pass


class PlanTooLarge(ControllerError):
    """A cutover refused because the new replica's first commit would write more than allowed."""


class Controller:
    def __init__(self, address: str, history: CommandHistory | None = None, timeout: float = 60.0):
        self.address = address
        self.timeout = timeout
        self.history = history
        self.channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._outbox: queue.Queue | None = None
        self._cond = threading.Condition()
        self.frontiers: dict[str, int | None] = {}
        #: Every response received on the current connection, in order.
        self.responses: list = []
        self.status_: Status | None = None
        self.errors: list[Error] = []
        self._peeks: dict[str, PeekResponse] = {}
        self._closed = True

    # -- connection ----------------------------------------------------------------------------

    def fetch_history(self) -> CommandHistory:
        """The replica's own reduced command history."""
        call = self.channel.unary_unary(HISTORY_METHOD)
        try:
            data = call(b"", timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as exc:
            raise ControllerError(
                f"replica {self.address} is not reachable ({exc.code().name} after {self.timeout:g}s): it is "
                f"not running, or still starting (Spark takes a while; the job logs 'listening on' when "
                f"ready); try again, or give a longer --timeout") from None
        return CommandHistory(decode(json.dumps(c).encode()) for c in json.loads(data))

    def connect(self, orphan_grace_seconds: float = 3600.0) -> "Controller":
        """Open the stream and replay the history (adopting the replica's if this has none)."""
        if self.history is None:
            self.history = self.fetch_history()
        if not any(isinstance(c, CreateTimely) for c in self.history):
            self.history = CommandHistory([CreateTimely(), CreateInstance(orphan_grace_seconds),
                                           *self.history])
        self.history.reduce()
        self.close()
        with self._cond:
            self.frontiers, self.responses, self.status_, self.errors = {}, [], None, []
            self._peeks = {}
        outbox: queue.Queue = queue.Queue()
        self._outbox, self._closed = outbox, False
        responses = self.channel.stream_stream(STREAM_METHOD)(iter(outbox.get, None),
                                                             wait_for_ready=True)
        threading.Thread(target=self._read, args=(responses,), daemon=True).start()
        for command in self.history:
            outbox.put(encode(command))
        outbox.put(encode(InitializationComplete()))
        self.wait_status(lambda s: s.stage in ("read-only", "read-write"), "initialization")
        return self

    def close(self, timeout: float = 60.0) -> None:
        """End the stream after the replica has handled every command sent (it then hangs up)."""
        if self._outbox is not None:
            self._outbox.put(None)
            self._outbox = None
            try:
                self._wait(lambda: False, "the replica to handle the last commands", timeout)
            except ControllerError:
                pass  # closed (the normal end) or timed out: either way the stream is done
        self._closed = True

    def __enter__(self) -> "Controller":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.channel.close()

    def _read(self, responses) -> None:
        try:
            for data in responses:
                response = decode_response(data)
                with self._cond:
                    self.responses.append(response)
                    if isinstance(response, FrontierUpper):
                        self.frontiers[response.view_id] = response.upper
                    elif isinstance(response, Status):
                        self.status_ = response
                    elif isinstance(response, (PeekResponse, PlanResponse)):
                        self._peeks[response.uuid] = response
                    elif isinstance(response, Error):
                        log.warning("replica %s refused %s: %s", self.address, response.command,
                                    response.message)
                        self.errors.append(response)
                    self._cond.notify_all()
        except grpc.RpcError as exc:
            if not self._closed:
                log.warning("stream to %s ended: %s", self.address, exc.details())
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _wait(self, predicate, what: str, timeout: float | None = None):
        deadline = time.monotonic() + (timeout or self.timeout)
        with self._cond:
            while True:
                value = predicate()
                if value:
                    return value
                if self._closed:
                    raise ControllerError(f"{self.address}: connection closed while waiting for {what}")
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ControllerError(f"{self.address}: timed out waiting for {what}")
                self._cond.wait(remaining)

    def send(self, command, record: bool = True) -> int:
        """Send one command (and keep it in the history, unless a peek).

        Returns how many refusals had arrived before it, for :meth:`_raise_refused`.
        """
        if self._outbox is None:
            raise ControllerError("not connected: call connect() first")
        errors_before = len(self.errors)
        self._outbox.put(encode(command))
        if record:
            self.history.push(command)
        return errors_before

    def _raise_refused(self, errors_before: int, *commands: str) -> None:
        refused = [e for e in self.errors[errors_before:] if e.command in commands]
        if refused:
            raise ControllerError(f"{refused[0].command} refused: {refused[0].message}")

    def _send_and_wait(self, commands: list, done, what: str) -> None:
        """Send ``commands`` and wait until ``done(status)`` holds or one of them is refused."""
        errors_before = len(self.errors)
        for command in commands:
            self.send(command)
        names = {type(c).__name__ for c in commands}

        def settled():
            self._raise_refused(errors_before, *names)
            return self.status_ is not None and done(self.status_)
        self._wait(settled, what)

    # -- commands ------------------------------------------------------------------------------

    def create_view(self, spec: dict | str, schedule: bool = True) -> str:
        """Create (and schedule) a view from a specification or a YAML file; returns its id."""
        if isinstance(spec, str):
            spec = view_spec(spec)
        view_id = spec["view_id"]
        commands = [CreateDataflow(spec)] + ([Schedule(view_id)] if schedule else [])
        self._send_and_wait(commands, lambda s: view_id in s.views and s.views[view_id]["scheduled"] == schedule,
                            f"view {view_id} to be created")
        return view_id

    def allow_writes(self) -> None:
        self._send_and_wait([AllowWrites()], lambda s: not s.read_only, "read-write")

    def compact(self, view_id: str, since: int) -> None:
        """Allow the view to compact to ``since``; the replica compacts its table at the next step."""
        self._send_and_wait([AllowCompaction(view_id, since)],
                            lambda s: view_id in s.views and s.views[view_id]["since"] >= since,
                            f"the since of {view_id} to reach {since}")

    def drop(self, view_id: str) -> None:
        """Drop the view at the replica (its query stops); waits for the empty frontier."""
        self._send_and_wait([AllowCompaction(view_id, None)],
                            lambda s: view_id not in s.views and view_id in self.frontiers
                            and self.frontiers[view_id] is None, f"view {view_id} to be dropped")

    def update_configuration(self, **params) -> None:
        expected = {k: v.upper() if k == "log_level" and isinstance(v, str) else v for k, v in params.items()}
        self._send_and_wait([UpdateConfiguration(params)],
                            lambda s: all(s.config.get(k) == v for k, v in expected.items()),
                            f"settings {params}")

    def peek_async(self, view_id: str, time: int, *, filter: str | None = None,
                   columns: list[str] | None = None, limit: int | None = None, offset: int = 0,
                   max_result_bytes: int = 64 * 1024 * 1024) -> str:
        peek_id = uuidlib.uuid4().hex
        self.send(Peek(peek_id, view_id, time, filter, columns, limit, offset, max_result_bytes),
                  record=False)
        return peek_id

    def peek_response(self, peek_id: str, timeout: float | None = None) -> PeekResponse:
        return self._wait(lambda: self._peeks.get(peek_id), f"peek {peek_id}", timeout)

    def peek(self, view_id: str, time: int, timeout: float | None = None, **options) -> pa.Table:
        """The view's rows at ``time`` (waits until the time is final); raises on an error answer."""
        response = self.peek_response(self.peek_async(view_id, time, **options), timeout)
        if response.status == PEEK_ROWS:
            return response.table()
        if response.status == PEEK_CANCELED:
            raise PeekCanceled(f"peek {response.uuid} was canceled")
        raise ControllerError(f"peek of {view_id} at {time} failed: {response.error}")

    def plan(self, view_id: str, limit: int | None = None, max_result_bytes: int = 64 * 1024 * 1024,
             timeout: float | None = None) -> PlanResponse:
        """What the view's next commit at the replica would write if it could write now (see
        :mod:`mvsink.replica.plan`); waits for the view to hydrate; raises on an error answer."""
        status = self.status()
        if view_id in status.views:
            self.wait_status(lambda s: s.views.get(view_id, {}).get("hydrated", True),
                             f"view {view_id} to hydrate", timeout)
        plan_id = uuidlib.uuid4().hex
        self.send(Plan(plan_id, view_id, limit, max_result_bytes), record=False)
        response = self.peek_response(plan_id, timeout)
        if response.status != PEEK_ROWS:
            raise ControllerError(f"plan of {view_id} at {self.address} failed: {response.error}")
        return response

    def cancel_peek(self, peek_id: str) -> None:
        self.send(CancelPeek(peek_id), record=False)

    # -- state ---------------------------------------------------------------------------------

    def wait_status(self, predicate, what: str, timeout: float | None = None) -> Status:
        return self._wait(lambda: self.status_ if self.status_ and predicate(self.status_) else None,
                          what, timeout)

    def status(self) -> Status:
        return self.wait_status(lambda s: True, "a status")

    def wait_frontier(self, view_id: str, at_least: int, timeout: float | None = None) -> int:
        self._wait(lambda: (f := self.frontiers.get(view_id)) is not None and f >= at_least,
                   f"the frontier of {view_id} to reach {at_least}", timeout)
        return self.frontiers[view_id]


def view_spec(path: str) -> dict:
    """A view specification from a YAML file, without the settings that belong to one replica."""
    return shared_spec(spec_from_yaml(path))


class PartialCutover(ControllerError):
    """A cutover of some views of a replica that runs others: allowing writes promotes them all."""


def views_to_cut_over(old: Controller, new: Controller, view_id: str | None) -> list[str]:
    """The views a cutover from ``old`` to ``new`` hands over: ``view_id`` alone, or every view
    ``new`` runs (None: ``--all``). Allowing writes is the replica's, not a view's: it promotes
    every view ``new`` runs, so a single view is refused (:class:`PartialCutover`, nothing
    changed) where ``new`` runs others; they would be promoted while ``old`` keeps writing them."""
    running = sorted(new.status().views)
    if view_id is None:
        if not running:
            raise ControllerError(f"cutover: {new.address} runs no view")
        return running
    if view_id not in running:
        raise ControllerError(f"cutover of {view_id}: {new.address} does not run it (it runs {running or 'none'})")
    others = [v for v in running if v != view_id]
    if others:
        raise PartialCutover(
            f"cutover of {view_id} refused, nothing changed: {new.address} also runs views {others}, and "
            f"allowing it to write promotes all of them while {old.address} would keep writing them (each "
            f"then fenced, or refused, there). Cut over the whole replica: mvsink cutover --all --old "
            f"{old.address} --new {new.address}")
    return [view_id]


def cutover(old: Controller, new: Controller, view_ids: list[str], timeout: float = 600.0,
            poll_seconds: float = 1.0, max_plan_rows: int | None = None) -> dict[str, int]:
    """Blue/green cutover of ``view_ids`` (every view ``new`` runs: see
    :func:`views_to_cut_over`) from ``old`` (writing) to ``new`` (read-only).

    1. wait until ``new`` has hydrated every view and its frontier has reached ``old``'s;
    1b. with ``max_plan_rows``: raise :class:`PlanTooLarge`, changing nothing (``old`` still
       writes, ``new`` stays read-only), if ``new``'s plan of a view has more updates than that;
    2. drop the views at ``old`` and wait for their empty frontiers: their queries have stopped,
       they will write nothing more (so the first commit after the cutover is ``new``'s);
    3. allow writes at ``new``.

    Returns the frontier at which ``new`` took over each view. The caller stops the old process.
    """
    deadline = time.monotonic() + timeout
    frontiers = {}
    for view_id in view_ids:
        frontiers[view_id] = _caught_up(old, new, view_id, deadline, timeout, poll_seconds)
    if max_plan_rows is not None:
        for view_id in view_ids:
            plan = new.plan(view_id, limit=0, timeout=timeout)
            if plan.updates > max_plan_rows:
                raise PlanTooLarge(f"cutover of {view_id} refused: the first commit of {new.address} would write "
                                   f"{plan.updates} updates (+{plan.added} -{plan.removed} rows) at [{plan.lower}, "
                                   f"{plan.upper}), more than --max-plan-rows {max_plan_rows}; nothing changed: "
                                   f"{old.address} still writes, {new.address} stays read-only")
            log.info("cutover of %s: the plan writes %d updates, within %d", view_id, plan.updates, max_plan_rows)
    log.info("cutover of %s: the new replica caught up at %s; stopping the old one", ", ".join(view_ids), frontiers)
    for view_id in view_ids:
        old.drop(view_id)
    new.allow_writes()
    log.info("cutover of %s: the new replica writes from frontiers %s", ", ".join(view_ids), frontiers)
    return frontiers


def _caught_up(old: Controller, new: Controller, view_id: str, deadline: float, timeout: float,
               poll_seconds: float) -> int:
    """Wait until ``new``'s frontier of ``view_id`` has reached ``old``'s; returns it."""
    while True:
        old_frontier = old.frontiers.get(view_id)
        new_frontier = new.frontiers.get(view_id)
        if old_frontier is not None and new_frontier is not None and new_frontier >= old_frontier:
            return new_frontier
        if time.monotonic() > deadline:
            raise ControllerError(f"cutover of {view_id}: the new replica did not catch up in {timeout}s "
                                  f"(old frontier {old_frontier}, new {new_frontier})")
        log.info("cutover of %s: waiting for the new replica (frontier %s) to reach the old (%s)",
                 view_id, new_frontier, old_frontier)
        time.sleep(poll_seconds)
