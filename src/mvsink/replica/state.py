"""A replica's compute state: the protocol's stages, its views, its history, its reports.

Commands arrive from one controller connection at a time (a new connection replaces the old one)
and are handled one at a time, in order. Stages are enforced per connection:

1. creation: ``CreateTimely`` (starts the Spark session), then ``CreateInstance``. On a reconnect
   both must equal what the replica was created with;
2. initialization: computation commands are collected until ``InitializationComplete``, then
   *reconciled* with what runs (below);
3. computation, read-only: nothing is written;
4. computation, read-write, after ``AllowWrites``; writability is the replica's, there is no way
   back, and it survives reconnects. A replica started without ``--read-only`` allows writes
   itself when it first completes initialization; as a writer from the start, it writes only
   under its view's current definition (:mod:`mvsink.append.fence`): a view whose table is
   fenced for another definition is refused (an :class:`Error` starting ``fenced:``) and stays
   read-only until its query stops. An ``AllowWrites`` is a cutover: each view's first commit
   raises the fence to its definition, also for views created on the replica after it.

A command out of order, for an unknown view, or with bad arguments is answered with an
:class:`Error` and changes nothing.

Reconciliation: a view the new commands create with the same specification as a running, healthy
view keeps running: no restart, no re-hydration. Every other running view is dropped, every other
command is applied as if on a fresh replica, pending peeks of the old connection are forgotten,
every view's frontier is reported afresh, and the history becomes the new commands, reduced.

Reports: ``FrontierUpper`` whenever a view's frontier (:meth:`MaterializedView.frontier`) passes
the last one reported on this connection — so never backwards and never twice — and the empty
frontier once when a view is dropped; ``Status`` after initialization, on hydration, allow-writes,
drops and configuration changes.
"""

from __future__ import annotations

import logging
import queue
import threading

from mvsink.replica.history import CommandHistory
from mvsink.replica.peeks import PendingPeeks
from mvsink.replica.protocol import (AllowCompaction, AllowWrites, CancelPeek, CreateDataflow,
                                     CreateInstance, CreateTimely, Error, FrontierUpper,
                                     InitializationComplete, PEEK_ERROR, Peek, PeekResponse, Plan,
                                     PlanResponse, ProtocolError, Schedule, Status, UpdateConfiguration)
from mvsink.replica.plan import answer_plan
from mvsink.replica.running import RunningView
from mvsink.append.fence import Fenced
from mvsink.log_context import about_view
from mvsink.sink import MaterializedView
from mvsink.view import ConfigError, view_from_spec

log = logging.getLogger(__name__)

CREATION, INITIALIZATION, COMPUTATION = "creation", "initialization", "computation"
_COMPUTATION_COMMANDS = (CreateDataflow, Schedule, AllowWrites, AllowCompaction, Peek, CancelPeek,
                         Plan, UpdateConfiguration)
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Connection:
    """The responses for one controller, in order; iterating ends when the connection closes."""

    def __init__(self, name: str):
        self.name = name
        self._queue: queue.Queue = queue.Queue()
        self.closed = False

    def send(self, response) -> None:
        if not self.closed:
            self._queue.put(response)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._queue.put(None)

    def __iter__(self):
        while (response := self._queue.get()) is not None:
            yield response


class LogConnection(Connection):
    """The job's own connection when it runs stand-alone: responses go to the log."""

    def __init__(self):
        super().__init__("self")
        self.errors: list[Error] = []

    def send(self, response) -> None:
        if isinstance(response, Error):
            self.errors.append(response)
            log.error("%s refused: %s", response.command, response.message)
        else:
            log.debug("response: %s", response)


class ComputeState:
    def __init__(self, replica_id: str, spark_factory, *, read_only_start: bool, trigger_seconds: float,
                 log_level: str = "INFO"):
        self.replica_id = replica_id
        #: Returns the Spark session; called by the first ``CreateTimely``.
        self.spark_factory = spark_factory
        self.read_only_start = read_only_start
        self.read_only = True
        self.config = {"trigger_seconds": trigger_seconds, "log_level": log_level.upper()}
        self.spark = None
        self.timely: CreateTimely | None = None
        self.instance: CreateInstance | None = None
        self.views: dict[str, RunningView] = {}
        self.history = CommandHistory()
        self.peeks: PendingPeeks | None = None
        self.conn: Connection | None = None
        self.stage = CREATION
        self._initializing: list = []
        self._timely_seen = False
        self._initialized_once = False
        self._lock = threading.RLock()
        self._send_lock = threading.Lock()
        self._reported: dict[str, int] = {}
        self._hydrated: set[str] = set()
        #: Writes were allowed by a cutover (``AllowWrites``), not by starting as a writer.
        self._cutover = False

    # -- connections ---------------------------------------------------------------------------

    def connect(self, conn: Connection) -> None:
        """``conn`` becomes the controller; an earlier one is disconnected."""
        with self._lock, self._send_lock:
            if self.conn is not None:
                log.info("controller %s replaced by %s", self.conn.name, conn.name)
                self.conn.close()
            self.conn = conn
            self.stage = CREATION
            self._timely_seen = False
            self._initializing = []
            self._reported = {}

    def disconnect(self, conn: Connection) -> None:
        with self._lock, self._send_lock:
            if self.conn is conn:
                log.info("controller %s disconnected; views keep running", conn.name)
                self.conn = None
            conn.close()

    def _send(self, response) -> None:
        with self._send_lock:
            if self.conn is not None:
                self.conn.send(response)

    # -- commands ------------------------------------------------------------------------------

    def handle(self, conn: Connection, command) -> None:
        """Handle one command from ``conn``; refusals are answered with :class:`Error`."""
        with self._lock:
            if conn is not self.conn:
                return  # a replaced controller's late command
            try:
                self._handle(command)
            except ProtocolError as exc:
                log.warning("refused %s: %s", type(command).__name__, exc)
                conn.send(Error(type(command).__name__, str(exc)))
            except Exception as exc:
                log.exception("%s failed", type(command).__name__)
                conn.send(Error(type(command).__name__, f"failed: {exc}"))

    def _handle(self, command) -> None:
        name = type(command).__name__
        if self.stage == CREATION:
            expected = CreateInstance if self._timely_seen else CreateTimely
            if not isinstance(command, expected):
                raise ProtocolError(f"{name} in the creation stage: expected {expected.__name__} "
                                    f"(creation is CreateTimely, then CreateInstance)")
            if isinstance(command, CreateTimely):
                self._create_timely(command)
            else:
                self._create_instance(command)
            return
        if isinstance(command, (CreateTimely, CreateInstance)):
            raise ProtocolError(f"{name} after the creation stage (stage {self.stage_name()})")
        if isinstance(command, InitializationComplete):
            if self.stage != INITIALIZATION:
                raise ProtocolError(f"InitializationComplete in stage {self.stage_name()}: "
                                    "initialization is already complete")
            self._complete_initialization()
            return
        if not isinstance(command, _COMPUTATION_COMMANDS):
            raise ProtocolError(f"unexpected command {name}")
        if self.stage == INITIALIZATION:
            self._initializing.append(command)
        else:
            self._apply(command)

    def _create_timely(self, command: CreateTimely) -> None:
        if self.timely is not None and command != self.timely:
            raise ProtocolError(f"CreateTimely {command} does not match the replica's {self.timely}")
        if command.protocol_version != 1:
            raise ProtocolError(f"protocol version {command.protocol_version} is not supported (1)")
        if self.spark is None:
            self.spark = self.spark_factory()
            self.config["shuffle_partitions"] = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
            self.peeks = PendingPeeks(self.spark, self._send)
            self.timely = command
            self.history.push(command)
        self._timely_seen = True

    def _create_instance(self, command: CreateInstance) -> None:
        if self.instance is not None and command != self.instance:
            raise ProtocolError(f"CreateInstance {command} does not match the replica's {self.instance}; "
                                "a replica keeps its instance configuration for life")
        if self.instance is None:
            self.instance = command
            self.history.push(command)
        self.stage = INITIALIZATION

    def _complete_initialization(self) -> None:
        """Reconcile what runs with the commands of this initialization (see the module doc)."""
        commands, self._initializing = self._initializing, []
        wanted = {c.view["view_id"]: c.view for c in commands
                  if isinstance(c, CreateDataflow) and isinstance(c.view, dict)}
        retained = {view_id for view_id, running in self.views.items()
                    if wanted.get(view_id) == running.spec and running.failure() is None}
        for view_id in list(self.views):
            if view_id not in retained:
                log.info("reconciliation: view %s is not requested as it runs; replacing it", view_id)
                self._drop(view_id, report=False)
        self.peeks.clear()
        self.history = CommandHistory([self.timely, self.instance])
        for command in commands:
            if isinstance(command, CreateDataflow) and command.view.get("view_id") in retained:
                self.history.push(command)
                log.info("reconciliation: view %s kept running", command.view["view_id"])
            elif isinstance(command, Schedule) and command.view_id in retained \
                    and self.views[command.view_id].scheduled:
                self.history.push(command)
            else:
                try:
                    self._apply(command)
                except ProtocolError as exc:
                    self.conn.send(Error(type(command).__name__, str(exc)))
        if not self.read_only_start and not self._initialized_once and self.read_only:
            log.info("started without --read-only: allowing writes")
            self._allow_writes(cutover=False)
            self.history.push(AllowWrites())
        elif not self.read_only:
            self.history.push(AllowWrites())  # writable for good, whatever this controller sent
        self.history.reduce()
        self._initialized_once = True
        self.stage = COMPUTATION
        with self._send_lock:
            self._reported = {}
            self._hydrated = set()
        for running in list(self.views.values()):
            self._report_progress(running)
        self._send(self.status())

    def _apply(self, command) -> None:
        if isinstance(command, CreateDataflow):
            self._create_dataflow(command)
            self._send(self.status())
        elif isinstance(command, Schedule):
            self._view(command.view_id, command).schedule(self.config["trigger_seconds"])
            self._send(self.status())
        elif isinstance(command, AllowWrites):
            self._allow_writes(cutover=True)
        elif isinstance(command, AllowCompaction):
            running = self._view(command.view_id, command)
            if command.frontier is None:
                self._drop(command.view_id, report=True)
                self._send(self.status())
            else:
                running.allow_compaction(command.frontier)
                self._send(self.status())
        elif isinstance(command, Peek):
            running = self.views.get(command.view_id)
            if running is None:
                self._send(PeekResponse(command.uuid, PEEK_ERROR, error=f"no view {command.view_id!r}"))
            else:
                self.peeks.add(command, running.view.view.target, running.since)
            return
        elif isinstance(command, CancelPeek):
            self.peeks.cancel(command.uuid)
            return
        elif isinstance(command, Plan):
            running = self.views.get(command.view_id)
            if running is None:
                self._send(PlanResponse(command.uuid, PEEK_ERROR, error=(
                    f"no view {command.view_id!r} at replica {self.replica_id} (views: {sorted(self.views)})")))
            else:
                answer_plan(running.view, command, self._send)
            return
        elif isinstance(command, UpdateConfiguration):
            self._update_configuration(command.params)
        self.history.push(command)

    def _allow_writes(self, cutover: bool) -> None:
        """Leave read-only mode: by a cutover (``AllowWrites``), or as a replica started as a
        writer; a view this refuses (fenced) is reported and writes nothing."""
        if not self.read_only:
            return
        self.read_only, self._cutover = False, cutover
        for running in self.views.values():
            try:
                with about_view(running.view_id):
                    running.view.allow_writes(cutover=cutover)
            except Fenced as exc:
                self._send(Error("AllowWrites", f"fenced: {exc}"))
        log.info("writes allowed: read-write computation%s", " (a cutover)" if cutover else "")
        self._send(self.status())

    def _view(self, view_id: str, command) -> RunningView:
        running = self.views.get(view_id)
        if running is None:
            raise ProtocolError(f"{type(command).__name__}: no view {view_id!r} "
                                f"(views: {sorted(self.views)})")
        return running

    def _create_dataflow(self, command: CreateDataflow) -> None:
        view_id = command.view.get("view_id")
        if view_id in self.views:
            raise ProtocolError(f"CreateDataflow: view {view_id!r} exists; drop it first "
                                "(AllowCompaction to the empty frontier)")
        try:
            with about_view(view_id):
                definition = view_from_spec(command.view, read_only=True, replica_id=self.replica_id)
                view = MaterializedView(self.spark, definition,
                                        orphan_grace_seconds=self.instance.orphan_grace_seconds)
                if not self.read_only:  # writable as the replica is: by a cutover, or as a writer
                    view.allow_writes(cutover=self._cutover)
        except Fenced as exc:
            raise ProtocolError(f"fenced: {exc}") from None
        except ConfigError as exc:
            raise ProtocolError(f"bad configuration: {exc}") from None
        except Exception as exc:
            log.exception("creating view %s failed", view_id)
            raise ProtocolError(f"creating view {view_id!r} failed: {exc}") from None
        self.views[view_id] = RunningView(command.view, view, self._report_progress)
        log.info("view %s created", view_id)

    def _drop(self, view_id: str, report: bool) -> None:
        running = self.views.pop(view_id)
        running.stop()
        self.peeks.fail_view(view_id, f"view {view_id!r} was dropped")
        with self._send_lock:
            self._reported.pop(view_id, None)
            self._hydrated.discard(view_id)
        if report:
            self._send(FrontierUpper(view_id, None))
        log.info("view %s dropped", view_id)

    def _update_configuration(self, params: dict) -> None:
        checks = {
            "trigger_seconds": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0,
            "shuffle_partitions": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "log_level": lambda v: isinstance(v, str) and v.upper() in _LOG_LEVELS,
        }
        for name, value in params.items():
            if name not in checks:
                raise ProtocolError(f"UpdateConfiguration: unknown setting {name!r}; known: {sorted(checks)}")
            if not checks[name](value):
                raise ProtocolError(f"UpdateConfiguration: bad value {value!r} for {name}")
        if "shuffle_partitions" in params:
            self.spark.conf.set("spark.sql.shuffle.partitions", str(params["shuffle_partitions"]))
        if "log_level" in params:
            logging.getLogger("mvsink").setLevel(params["log_level"].upper())
        if "trigger_seconds" in params and params["trigger_seconds"] != self.config["trigger_seconds"]:
            for running in self.views.values():
                running.set_trigger(float(params["trigger_seconds"]))
        self.config.update({k: (v.upper() if k == "log_level" else v) for k, v in params.items()})
        log.info("configuration updated: %s", self.config)
        self._send(self.status())

    # -- reports -------------------------------------------------------------------------------

    def _report_progress(self, running: RunningView) -> None:
        """After a step of ``running``: report its frontier if it advanced, and its hydration."""
        frontier = running.view.frontier()
        status_changed = False
        with self._send_lock:
            if self.views.get(running.view_id) is not running or self.conn is None:
                return
            if self.stage != COMPUTATION:
                return
            last = self._reported.get(running.view_id)
            if frontier is not None and (last is None or frontier > last):
                self._reported[running.view_id] = frontier
                self.conn.send(FrontierUpper(running.view_id, frontier))
            # Hydrated once the hydration's step ended (its frontier is set as it begins): a
            # controller connecting during it gets the status that says so when it ends.
            if frontier is not None and not running.view.hydration.running and running.view_id not in self._hydrated:
                self._hydrated.add(running.view_id)
                status_changed = True
        if status_changed:
            self._send(self.status())
        if self.peeks is not None:
            self.peeks.wake()

    def stage_name(self) -> str:
        if self.stage != COMPUTATION:
            return self.stage
        return "read-only" if self.read_only else "read-write"

    def status(self) -> Status:
        return Status(replica_id=self.replica_id, stage=self.stage_name(), read_only=self.read_only,
                      config=dict(self.config),
                      views={view_id: running.status() for view_id, running in list(self.views.items())})

    def fenced(self) -> dict[str, str]:
        """Views fenced out by another definition of theirs, and why."""
        return {view_id: f for view_id, running in list(self.views.items()) if (f := running.view.fenced)}

    def failures(self) -> dict[str, str]:
        """Views whose step loop ended on a failure, and why."""
        return {view_id: f for view_id, running in list(self.views.items())
                if (f := running.failure()) is not None}

    def allow_writes(self) -> None:
        """The job's own AllowWrites (signal or file), whatever controller is connected."""
        with self._lock:
            self._apply(AllowWrites())

    def shutdown(self) -> None:
        with self._lock:
            for running in list(self.views.values()):
                running.stop()
            if self.conn is not None:
                self.conn.close()
