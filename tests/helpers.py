"""Test helpers: source tables, view configs, replica processes."""

from __future__ import annotations

import atexit

from functools import reduce

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from differential.reads import source_at, view_at
from differential.tables import values_sql

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "mvsink_job.py"


def create_source(spark, path: str, rows: list[tuple] | None = None, schema: str = "id BIGINT, v STRING") -> None:
    """A Delta source table with the change data feed on and deletion vectors off: version 0
    created by Spark, version 1 (if ``rows``) their append (:func:`insert`). A local one is a copy
    of the empty table made once a test process for its schema: a path-based Delta table's log
    names its files relative to it, and creating it by Spark took one to three seconds under load
    for each of hundreds of tests."""
    if "://" in path:
        _create_source(spark, path, schema)
    else:
        template = _SOURCE_TEMPLATES.get(schema)
        if template is None:
            template = os.path.join(_source_templates_dir(), str(len(_SOURCE_TEMPLATES)))
            _create_source(spark, template, schema)
            _SOURCE_TEMPLATES[schema] = template
        shutil.copytree(template, path)
    if rows:
        insert(spark, path, rows)


#: The empty tables :func:`create_source` copies, by schema: made once a test process.
_SOURCE_TEMPLATES: dict[str, str] = {}


def _source_templates_dir() -> str:
    """A directory of this process for :data:`_SOURCE_TEMPLATES`, removed at its exit."""
    if not hasattr(_source_templates_dir, "path"):
        _source_templates_dir.path = tempfile.mkdtemp(prefix="mvsink-test-sources-")
        atexit.register(shutil.rmtree, _source_templates_dir.path, True)
    return _source_templates_dir.path


def _create_source(spark, path: str, schema: str) -> None:
    spark.sql(
        f"CREATE TABLE delta.`{path}` ({schema}) USING delta TBLPROPERTIES "
        "(delta.enableChangeDataFeed = true, delta.enableDeletionVectors = false)"
    )


def vacuum_all(spark, path: str) -> None:
    """VACUUM the Delta table at ``path`` keeping no history: every file it no longer reads is gone."""
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        spark.sql(f"VACUUM delta.`{path}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")


def insert(spark, path: str, rows: list[tuple]) -> None:
    """One commit appending ``rows`` to the Delta table at ``path``: by delta-rs where the rows
    are values of the table's Arrow types (a few milliseconds, where Spark's ``INSERT`` took half
    a second), else (or on S3) by Spark's ``INSERT``, which casts them as SQL does."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    table = DeltaTable(path) if "://" not in path else None
    if table is not None and _plain_columns(table):
        arrow_schema = pa.schema(table.schema().to_arrow())
        try:
            appended = pa.Table.from_pylist([dict(zip(arrow_schema.names, row, strict=True)) for row in rows],
                                            schema=arrow_schema)
        except (pa.ArrowException, TypeError, ValueError):
            pass
        else:
            write_deltalake(path, appended, mode="append")
            return
    spark.sql(f"INSERT INTO delta.`{path}` VALUES {values_sql(rows)}")


_UPDATE = re.compile(r"UPDATE delta\.`(?P<path>[^`]+)` SET (?P<set>.+?) WHERE (?P<where>.+)", re.DOTALL)
_DELETE = re.compile(r"DELETE FROM delta\.`(?P<path>[^`]+)` WHERE (?P<where>.+)", re.DOTALL)
_PMOD = re.compile(r"pmod\((\w+), (\d+)\)")


def commit_sql(spark, statement: str) -> None:
    """One commit of the SQL ``UPDATE delta.`path` SET ... WHERE ...`` or ``DELETE FROM delta.`path`
    WHERE ...`` ``statement``: by delta-rs's ``update``/``delete`` where the table is local, its
    columns plain (:func:`_plain_columns`) and without deletion vectors (10-30 ms, where Spark's
    took 0.25-1 s), else by Spark. The statement's ``pmod(column, n)`` is DataFusion's
    ``column % n``: the same rows where the column is not negative. Both write the change data
    feed's files of a table that has it on; a test about Spark's own commits calls ``spark.sql``."""
    match = _UPDATE.fullmatch(statement) or _DELETE.fullmatch(statement)
    table = _rewritable_by_delta_rs(match["path"]) if match else None
    if table is None:
        spark.sql(statement)
    elif "set" in match.groupdict():
        updates = dict(_assignment(part) for part in _top_level_split(_datafusion(match["set"])))
        table.update(updates=updates, predicate=_datafusion(match["where"]), error_on_type_mismatch=False)
    else:
        table.delete(_datafusion(match["where"]))


def _datafusion(sql: str) -> str:
    """Spark SQL's ``pmod(column, n)`` in ``sql`` as DataFusion's ``(column % n)``."""
    return _PMOD.sub(r"(\1 % \2)", sql)


def replace_where(spark, path: str, column: str, value) -> None:
    """One commit deleting the rows of the Delta table at ``path`` whose ``column`` is ``value`` and
    inserting them again (Spark's ``INSERT ... REPLACE WHERE``): by delta-rs's overwrite with a
    predicate where :func:`commit_sql` uses delta-rs, else by Spark."""
    from deltalake import write_deltalake

    table = _rewritable_by_delta_rs(path)
    if table is None:
        spark.sql(f"INSERT INTO delta.`{path}` REPLACE WHERE {column} = {value!r} "
                  f"SELECT * FROM delta.`{path}` WHERE {column} = {value!r}")
        return
    rows = table.to_pyarrow_table(filters=[(column, "=", value)])
    write_deltalake(path, rows, mode="overwrite", predicate=f"{column} = {value!r}")


def _rewritable_by_delta_rs(path: str):
    """The delta-rs ``DeltaTable`` at ``path`` if the tests rewrite its files by delta-rs: local,
    plain columns (:func:`_plain_columns`), no deletion vectors (delta-rs 1.6 does not write them)."""
    from deltalake import DeltaTable

    if "://" in path:
        return None
    table = DeltaTable(path)
    plain = _plain_columns(table) and "deletionVectors" not in (table.protocol().writer_features or ())
    return table if plain else None


def _assignment(text: str) -> tuple[str, str]:
    column, _, expression = text.partition("=")
    return column.strip(), expression.strip()


def _top_level_split(text: str) -> list[str]:
    """``text`` split at its commas outside parentheses and quotes."""
    parts, depth, quoted, start = [], 0, False, 0
    for i, char in enumerate(text):
        if char == "'":
            quoted = not quoted
        elif not quoted and char in "()":
            depth += 1 if char == "(" else -1
        elif not quoted and depth == 0 and char == ",":
            parts.append(text[start:i])
            start = i + 1
    return [*parts, text[start:]]


def _plain_columns(table) -> bool:
    """Whether ``table``'s columns take any value of their type as it is: nullable, without a
    `CHAR`/`VARCHAR` length (Spark pads and checks those) and without column mapping."""
    return (all(field.nullable and not field.metadata for field in table.schema().fields)
            and "delta.columnMapping.mode" not in table.metadata().configuration)


def view_upper_of(target: str, view_id: str) -> int | None:
    """The view's upper (None before the target exists); local or S3."""
    from mvsink.check import table_at
    from mvsink.table import latest_version

    if latest_version(target) is None:
        return None
    return table_at(target).transaction_version(f"mvsink:{view_id}") or 0


def write_config(path: Path, **settings) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


class Replica:
    """A replica as a separate process: ``python mvsink_job.py [--config ...] [--listen ...]``, or
    with ``submit`` (a ``spark-submit ...`` command) ``spark-submit ... mvsink_job.py ...`` in a
    session of its own, whose whole process group (the JVM and the Python driver) gets the signals."""

    def __init__(self, config: Path | None, replica_id: str, log_dir: Path, *extra: str,
                 env: dict | None = None, listen: bool = False, submit: list[str] | None = None):
        self.config, self.replica_id, self.log_dir, self.extra = config, replica_id, log_dir, extra
        self.env = env or {}
        self.submit = submit
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        #: ``host:port`` of the replica protocol, if it listens.
        self.address = f"127.0.0.1:{free_port()}" if listen else None

    def start(self) -> "Replica":
        self.starts += 1
        log = open(self.log_dir / f"{self.replica_id}-{self.starts}.log", "w")
        env = {**os.environ, "MVSINK_LOG_LEVEL": "INFO", **self.env}
        config = ["--config", str(self.config)] if self.config else []
        listen = ["--listen", self.address] if self.address else []
        self.proc = subprocess.Popen(
            [*(self.submit or [sys.executable]), str(JOB), *config, *listen, "--replica-id", self.replica_id,
             "--trigger-seconds", "0.5", *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=bool(self.submit),
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self._send(sig)
        self._reap()

    def _reap(self) -> None:
        """Wait for the process to end (SIGKILL after 60 s), then for whatever of its group outlived it."""
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._send(signal.SIGKILL)
            self.proc.wait()
        if self.submit:
            kill_group(self.proc.pid)  # whatever of the group outlived its leader

    def _send(self, sig: int) -> None:
        if self.submit:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def logs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.log_dir.glob(f"{self.replica_id}-*.log")))


def edit_with_restarts(fleet: list[Replica], rng, commits: int, restarts: int, edit: Callable[[int], None],
                       target: str, view_id: str, pause: tuple[float, float] = (0.3, 2.0),
                       takeover_timeout: float = 600) -> int:
    """Make source commits (``edit(n)``) and kill a replica ``restarts`` times, with SIGKILL and
    SIGTERM in turn (the first chosen at random: two restarts see both). The victim is the replica
    that won the view's latest commit writing updates (the replicas in turn before any has), so a
    replica that wins every race is still made to hand over: every run has at least two writers.
    A victim stays down, while the edits go on, until another replica has won a commit that
    writes updates, so every run shows the survivors taking over; then it restarts. Makes at least
    ``commits`` edits, more while a takeover is pending: a survivor may
    itself have just restarted, so on a loaded machine it can take a JVM's start and a hydration,
    and the wait is bounded in seconds (``takeover_timeout``), not in edits. Fails at once if a
    replica that was not killed exits. At the end every replica is alive. Returns the number of
    restarts."""
    kill_at = sorted(rng.sample(range(2, commits - 4), restarts))
    signals = [signal.SIGKILL, signal.SIGTERM]
    rng.shuffle(signals)
    down: tuple[Replica, int, float] | None = None  # the victim, the others' data commits then, when
    n = done = 0
    while n < commits or done < restarts or down:
        fail_if_exited([r for r in fleet if down is None or r is not down[0]], "the edits")
        if down and time.monotonic() - down[2] > takeover_timeout:
            raise AssertionError(f"no replica took over from {down[0].replica_id} in {takeover_timeout}s "
                                 f"({n} edits); the others' last lines:\n" + "\n".join(
                                     f"--- {r.replica_id}\n{r.logs()[-3000:]}" for r in fleet if r is not down[0]))
        edit(n)
        n += 1
        if down and _won_by_others(_data_commit_winners(target, view_id), down[0]) > down[1]:
            down[0].start()
            down = None
        if down is None and done < restarts and n >= kill_at[done]:
            winners = _data_commit_winners(target, view_id)
            victim = next((r for r in fleet if winners and r.replica_id == winners[0]), fleet[done % len(fleet)])
            victim.kill(signals[done % 2])
            down = (victim, _won_by_others(winners, victim), time.monotonic())
            done += 1
        time.sleep(rng.uniform(*pause))
    for replica in fleet:
        assert replica.alive(), replica.logs()[-3000:]
    return done


def _data_commit_winners(target: str, view_id: str) -> list:
    """The replica that won each of the view's commits that write updates, newest first."""
    from mvsink.check import table_at

    return [info.get("mvsink.replica") for info in table_at(target).history()
            if info.get("mvsink.view") == view_id and info.get("mvsink.reason") != "advance-upper"]


def _won_by_others(winners: list, victim: Replica) -> int:
    """How many of ``winners``' commits were won by replicas other than ``victim``."""
    return sum(1 for winner in winners if winner not in (None, victim.replica_id))


def stop_all(replicas, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` to every replica still running, then wait for each (as :meth:`Replica.kill`):
    they stop side by side, not one after another."""
    for replica in replicas:
        if replica.alive():
            replica._send(sig)
    for replica in replicas:
        replica._reap()


def kill_group(pgid: int) -> None:
    """SIGKILL every process left in the process group ``pgid`` (none left is fine)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def fail_if_exited(replicas, during: str) -> None:
    """Fail with its log's end if one of ``replicas`` has exited (``during`` says when)."""
    for replica in replicas:
        if not replica.alive():
            raise AssertionError(f"replica {replica.replica_id} exited during {during}:\n" + replica.logs()[-4000:])


def wait_for(predicate, timeout: float, interval: float = 0.5, what: str = "condition",
             watch: tuple["Replica", ...] = ()):
    """Wait until ``predicate()`` is true; fail at once if a watched replica has exited, and on a
    timeout with the end of each watched replica's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        fail_if_exited(watch, f"the wait for {what}")
        time.sleep(interval)
    dumped = [r for r in watch if r.alive() and not r.submit]  # (a JVM takes SIGUSR2 for itself)
    for replica in dumped:
        replica.signal(signal.SIGUSR2)  # its Python threads' stacks into its log (faulthandler)
    dump_deadline = time.monotonic() + 5
    while time.monotonic() < dump_deadline and not all("most recent call first" in r.logs() for r in dumped):
        time.sleep(0.1)
    logs = "".join(f"\n--- replica {r.replica_id}'s log, its end:\n{r.logs()[-12000:]}" for r in watch)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}{logs}")


# -- S3: a real HTTP S3 server (moto) with injectable faults -------------------------------------

S3_BUCKET = "mvsink-test"


class S3Faults:
    """WSGI middleware around moto's S3 app: injects faults into matching requests.

    Rules are set over HTTP (``POST /_faults`` with a JSON list; ``GET /_faults`` returns the rules
    with how often each fired; ``DELETE /_faults`` clears them). A rule matches a request by
    ``method``, a regular expression ``path`` (searched in the path plus query string) and
    optionally a ``header`` the request must carry; it skips the first ``after`` matches and then
    fires on the next ``times`` matches with its ``fault`` (with ``after_rule: i``, only once rule
    ``i`` has fired):

    * ``500``, ``503``, ``throttle`` (503 SlowDown): answer with that error, moto never sees it;
    * ``slow``: sleep ``delay`` seconds, then serve the request;
    * ``lost-reply``: serve the request (it takes effect), then answer 500 as if the reply was lost.

    Every request reaches moto under one lock: moto checks ``If-None-Match`` / ``If-Match`` and then
    writes, which real S3 does atomically; the lock gives moto the same guarantee.
    """

    def __init__(self, app):
        import threading

        self.app = app
        self.lock = threading.Lock()
        self.rules: list[dict] = []

    def __call__(self, environ, start_response):
        import io
        import re

        path = environ.get("PATH_INFO", "")
        if path == "/_faults":
            return self._control(environ, start_response)
        # Read the whole body first, so that an error answer leaves the connection clean.
        length = environ.get("CONTENT_LENGTH")
        body = environ["wsgi.input"].read(int(length)) if length else (
            environ["wsgi.input"].read() if environ.get("wsgi.input_terminated") else b"")
        environ["wsgi.input"] = io.BytesIO(body)
        method = environ.get("REQUEST_METHOD", "")
        target = path + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
        fault = None
        with self.lock:
            for rule in self.rules:
                if rule.get("method", method) != method or not re.search(rule.get("path", ""), target):
                    continue
                header = rule.get("header")
                if header and "HTTP_" + header.upper().replace("-", "_") not in environ:
                    continue
                if "after_rule" in rule and not self.rules[rule["after_rule"]]["fired"]:
                    continue
                rule["matched"] += 1
                if rule["matched"] > rule.get("after", 0) and rule["fired"] < rule.get("times", 1):
                    rule["fired"] += 1
                    rule.setdefault("fired_on", []).append(f"{method} {target}")
                    fault = rule
                    break
        kind = fault["fault"] if fault else None
        if kind in ("500", "503", "throttle"):
            code, status = ("SlowDown", "503 Slow Down") if kind == "throttle" else (
                ("InternalError", "500 Internal Server Error") if kind == "500"
                else ("ServiceUnavailable", "503 Service Unavailable"))
            return self._error(start_response, status, code)
        if kind == "slow":
            import time

            time.sleep(float(fault.get("delay", 2.0)))
        with self.lock:
            captured = {}

            def capture(status, headers, exc_info=None):
                captured["status"], captured["headers"] = status, headers
                return lambda data: captured.setdefault("extra", []).append(data)

            result = self.app(environ, capture)
            try:
                data = b"".join(captured.get("extra", [])) + b"".join(result)
            finally:
                if hasattr(result, "close"):
                    result.close()
        if kind == "lost-reply":
            return self._error(start_response, "500 Internal Server Error", "InternalError")
        start_response(captured["status"], captured["headers"])
        return [data]

    @staticmethod
    def _error(start_response, status, code):
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>injected by the test server</Message></Error>").encode()
        start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
        return [body]

    def _control(self, environ, start_response):
        import json

        method = environ["REQUEST_METHOD"]
        with self.lock:
            if method == "POST":
                length = int(environ.get("CONTENT_LENGTH") or 0)
                rules = json.loads(environ["wsgi.input"].read(length))
                self.rules = [{**r, "matched": 0, "fired": 0} for r in rules]
            elif method == "DELETE":
                self.rules = []
            body = json.dumps(self.rules).encode()
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]


def serve_s3(port_file: str) -> None:
    """Run moto's S3 (wrapped in :class:`S3Faults`) on a free 127.0.0.1 port until killed."""
    from moto.moto_server.werkzeug_app import (DomainDispatcherApplication, MotoRequestHandler,
                                               create_backend_app)
    from werkzeug.serving import make_server

    app = S3Faults(DomainDispatcherApplication(create_backend_app))
    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(tmp, port_file)
    server.serve_forever()


class S3Server:
    """The moto S3 server as a separate process, and the environment that points clients at it."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None
        self.endpoint = ""

    def start(self) -> "S3Server":
        port_file = self.workdir / "s3.port"
        log = open(self.workdir / "s3-server.log", "w")
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                f"import helpers; helpers.serve_s3({str(port_file)!r})")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the S3 server did not start:\n" + (self.workdir / "s3-server.log").read_text())
            time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{port_file.read_text()}"
        return self

    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_EC2_METADATA_DISABLED": "true"}

    def create_bucket(self, name: str = S3_BUCKET) -> str:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                     aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=name)
        return name

    def faults(self, rules: list[dict] | None = None) -> list[dict]:
        """Set the fault rules (None: only read them); returns the rules with their counts."""
        import json
        import urllib.request

        if rules is None:
            request = urllib.request.Request(self.endpoint + "/_faults")
        else:
            request = urllib.request.Request(self.endpoint + "/_faults", data=json.dumps(rules).encode(),
                                             method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def s3_server_fixture(tmp_path_factory):
    """Body of the ``s3`` fixtures of the S3 tests: a started server, its env set in os.environ."""
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    server.create_bucket()
    try:
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def log_history(target: str) -> list[dict]:
    """The commit infos of ``target``, newest first, each with the ``version`` of its own log file.

    Not ``DeltaTable.history()``: delta-rs lists every commit on storage but numbers them down from
    the version it loaded, so a commit that lands in between shifts every number by one."""
    from mvsink.table import commit_info, latest_version

    return [dict(commit_info(target, v), version=v) for v in range(latest_version(target), -1, -1)]


def s3_table(uri: str):
    """The Delta table at ``uri`` (s3:// or s3a://) through delta-rs."""
    from deltalake import DeltaTable

    from mvsink import storage

    return DeltaTable(storage.delta_uri(uri), storage_options=storage.storage_options(uri))


def s3_edit(src: str, rng, version: int, next_id: list[int]) -> None:
    """One source commit (delta-rs, change data feed on): insert, update or delete."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from mvsink import storage

    op = rng.choice(["insert", "insert", "update", "delete"])
    if op == "insert":
        ids = list(range(next_id[0], next_id[0] + rng.randint(1, 4)))
        next_id[0] += len(ids)
        write_deltalake(src, pa.table({"id": pa.array(ids, pa.int64()), "v": [f"r{version}-{i}" for i in ids]}),
                        mode="append", storage_options=storage.storage_options(src))
    elif op == "update":
        s3_table(src).update(predicate=f"id % 3 = {version % 3}", updates={"v": f"concat(v, '+{version}')"})
    else:
        s3_table(src).delete(f"id % 7 = {version % 7}")


@dataclass
class KillRun:
    """What :func:`run_with_a_kill` did."""

    victim: Replica
    kill_at: int  # the source version after which it was killed
    upper_at_kill: int | None
    latest: int  # the source's last version
    final_upper: int


def run_with_a_kill(fleet: list[Replica], src: str, target: str, view_id: str, rng, source_versions: int,
                    timeout: float = 400, restarted: Callable[[Replica], bool] | None = None,
                    kill_between: tuple[int, int] | None = None) -> KillRun:
    """Replicas of one view (on S3) while its source changes ``source_versions`` times
    (:func:`s3_edit`): the replica that made the latest commit is killed with SIGKILL at a random
    version (in ``kill_between``, default from 3 to 4 before the end), in whatever it is doing, and
    started again at once; the view catches up now and then and at the end, when every replica
    must be alive (and, with ``restarted``, once ``restarted(victim)`` holds). The fleet is
    stopped (SIGTERM) in every case."""
    from mvsink.check import caught_up

    try:
        wait_for(lambda: view_upper_of(target, view_id), timeout=timeout, what="the first commit", watch=tuple(fleet))
        next_id = [100]
        kill_at = rng.randrange(*(kill_between or (3, source_versions - 4)))
        victim = upper_at_kill = None
        for version in range(source_versions):
            s3_edit(src, rng, version, next_id)
            if version == kill_at:
                last = next(h for h in s3_table(target).history() if h.get("mvsink.view") == view_id)
                victim = next(r for r in fleet if r.replica_id == last["mvsink.replica"])
                victim.kill(signal.SIGKILL)
                upper_at_kill = view_upper_of(target, view_id)
                victim.start()
            elif version % 2 == 0:
                # Let the view catch up now and then, so that the table has many versions.
                wait_for(lambda: caught_up(target, view_id), timeout=timeout,
                         what=f"the view to reach source version {s3_table(src).version()}", watch=tuple(fleet))
            time.sleep(rng.uniform(0.2, 1.5))
        if restarted is not None:
            wait_for(lambda: restarted(victim), timeout=timeout, what=f"{victim.replica_id} to be back",
                     watch=tuple(fleet))
        for replica in fleet:
            assert replica.alive(), replica.logs()[-3000:]
        latest = s3_table(src).version()
        wait_for(lambda: caught_up(target, view_id), timeout=timeout,
                 what=f"the view to reach source version {latest}", watch=tuple(fleet))
        return KillRun(victim, kill_at, upper_at_kill, latest, view_upper_of(target, view_id))
    finally:
        stop_all(fleet)


def stage_row(target: str, name: str, proc: int, lower: int, table=None):
    """Stage a file for `[lower, lower + 1)` in ``target`` through pyarrow (S3 or local), as the
    table layout writes a batch: with ``table`` (a delta-rs snapshot), the file holds its rows
    plus the new one and the batch removes every file it had (a rewrite); else the new row alone."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from mvsink import storage
    from mvsink.mint import Description
    from mvsink.write import StagedBatch, StagedFile
    from mvsink.write.stats import FileStats

    schema = row_schema()
    rows = table.to_pyarrow_table().to_pylist() if table is not None else []
    batch = pa.RecordBatch.from_pylist(rows + [{"proc": proc, "round": lower}], schema=schema)
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_batches([batch]), buffer)
    fs, root = storage.filesystem(target)

    def put():
        with fs.open_output_stream(storage.join(root, name)) as f:
            f.write(buffer.getvalue())

    storage.retrying(f"staging {name}", put)
    stats = FileStats(schema)
    stats.add(batch)
    removes = []
    if table is not None:
        actions = table.get_add_actions(flatten=True)
        removes = list(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()))
    return StagedBatch(Description(lower, lower + 1), target,
                       [StagedFile(name, len(buffer.getvalue()), batch.num_rows, stats.to_json())], removes=removes)


def row_schema():
    import pyarrow as pa

    return pa.schema([("proc", pa.int64()), ("round", pa.int64())])


def list_files(target: str, prefix: str = "") -> set[str]:
    """Names of the files directly in ``target``'s directory (on S3: under its prefix)."""
    from pyarrow.fs import FileSelector, FileType

    from mvsink import storage

    fs, root = storage.filesystem(target)
    return {i.base_name for i in fs.get_file_info(FileSelector(root, allow_not_found=True))
            if i.type == FileType.File and i.base_name.startswith(prefix)}


def race_outcome(outs: list[str], rounds: int) -> tuple[dict[int, tuple[int, str]], int, int]:
    """Read the racers' attempt logs; assert every round was attempted and won exactly once.

    Returns {round: (winning process, its file)}, the number of contested rounds (tried by more
    than one process) and the number of commit attempts.
    """
    import json
    from collections import defaultdict

    attempts = defaultdict(list)
    for i, out in enumerate(outs):
        for a in json.load(open(out)):
            attempts[a["lower"]].append((i, a["won"], a["file"]))
    assert sorted(attempts) == list(range(rounds)), "every round was attempted"
    winners = {lower: [(p, f) for p, won, f in tries if won] for lower, tries in attempts.items()}
    assert all(len(w) == 1 for w in winners.values()), {k: v for k, v in winners.items() if len(v) != 1}
    contested = sum(1 for tries in attempts.values() if len(tries) > 1)
    assert contested >= rounds // 2, f"only {contested} rounds were contested: the test did not race"
    return {r: w[0] for r, w in winners.items()}, contested, sum(len(t) for t in attempts.values())


def assert_race_log(table, winners: dict[int, tuple[int, str]], rounds: int) -> list[dict]:
    """The log holds one commit per round, each from the round's winner, starting where the
    previous one ended, and exactly the winners' rows. Returns the commits' infos."""
    assert table.transaction_version("mvsink:race") == rounds
    commits = [h for h in reversed(table.history()) if h.get("mvsink.view") == "race"]
    assert [(h["mvsink.lower"], h["mvsink.upper"]) for h in commits] == [(r, r + 1) for r in range(rounds)]
    assert [h["mvsink.replica"] for h in commits] == [f"p{winners[r][0]}" for r in range(rounds)]
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted((r["round"], r["proc"]) for r in rows) == [(r, winners[r][0]) for r in range(rounds)]
    return commits


def race(target: str, proc: int, barrier, done, out_path: str, rounds: int) -> None:
    """One racing process: each round, as the table layout writes, stage the table's rows plus
    one at the upper in a file that replaces every file of the snapshot the upper was read in, and
    compare-and-append it, until the upper reaches ``rounds``; writes its attempts (lower, won,
    file) to ``out_path``."""
    import json

    from mvsink.append import Shard, compare_and_append

    shard = Shard(target, "mvsink:race", "race", f"p{proc}")
    attempts = []
    while True:
        barrier.wait()
        if done.value:
            break
        table = shard.table()
        upper = shard.upper_of(table)
        if upper >= rounds:
            done.value = 1
            continue
        batch = stage_row(target, f"mvsink-race-{upper}-{upper + 1}-p{proc}.parquet", proc, upper, table)
        result = compare_and_append(shard, batch.desc, batch, "correction")
        attempts.append({"lower": upper, "won": result.appended, "file": batch.files[0].path})
    with open(out_path, "w") as f:
        json.dump(attempts, f)


def run_racers(target: str, processes: int, rounds: int, out_dir, timeout: float) -> list[str]:
    """Run :func:`race` in ``processes`` spawned processes, all passing one barrier per round;
    returns their attempt logs' paths."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    barrier, done = ctx.Barrier(processes), ctx.Value("i", 0)
    outs = [str(out_dir / f"p{i}.json") for i in range(processes)]
    procs = [ctx.Process(target=race, args=(target, i, barrier, done, outs[i], rounds))
             for i in range(processes)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
        assert p.exitcode == 0, f"racer exited with {p.exitcode}"
    return outs


def query_results_at_every_time(spark, src: str | dict[str, str], sql: str, views: dict[str, str], timeline: str,
                                upper: int, key: tuple[str, ...] = ()) -> None:
    """Each view (view id -> target) equals ``sql`` over ``src`` (one source, as ``src``; or
    sources by name) at the versions of every time below ``upper`` on ``timeline``, evaluated here
    by Spark over the sources' rows as of those versions (read by delta-rs, :func:`source_at`).
    A view in the table layout is read as a plain reader reads it: its table at the version
    holding each time, by delta-rs (:func:`differential.reads.view_at`); in the update layout by
    :func:`mvsink.read_view`. With ``key``: its ok rows are the result's rows whose key has no
    null, and its errors one per such row with a null and one per key with several rows
    (computed here in SQL over the result, not by mvsink's code); a key with several rows has none
    of them among the ok rows (they are withheld while it does). Without, it has no error.

    Every time's results are read by one Spark job (:func:`_at_every_time`), the query's and each
    view's: a job per time and side was most of the check's time."""
    from collections import Counter

    from pyspark.sql import functions as F

    from mvsink import read_view, view_errors
    from mvsink.check import TimelineReader
    from mvsink.target.layout import TABLE, layout_of

    if upper == 0:
        return
    sources = {"src": src} if isinstance(src, str) else src
    reader = TimelineReader(timeline)
    results = []
    for at in range(upper):
        for name, version in reader.versions(at).items():
            source_at(spark, sources[name], version).createOrReplaceTempView(name)
        results.append(spark.sql(sql))  # analyzed now: it keeps these versions' tables
    columns = results[0].columns
    rows_at = _at_every_time(spark, results)
    expected_errors_at = {at: Counter() for at in range(upper)}
    at_key = [columns.index(k) for k in key]
    if key and any(None in k or n > 1 for rows in rows_at.values()
                   for k, n in Counter(tuple(row[i] for i in at_key) for row in rows).items()):
        # the errors' messages, by Spark
        null_key = reduce(lambda a, b: a | b, [F.col(k).isNull() for k in key])
        message = F.to_json(F.struct(*columns), {"ignoreNullFields": "false"})
        errors = []
        for result in results:
            nulls = result.where(null_key).select(F.concat(F.lit(f"null in key column(s) {list(key)} of row "),
                                                           message))
            duplicates = (result.where(~null_key).groupBy(*key).count().where(F.col("count") > 1)
                          .select(F.concat(F.lit("duplicate key "), F.to_json(F.struct(*key)), F.lit(": "),
                                           F.col("count").cast("string"), F.lit(" rows"))))
            errors.append(nulls.union(duplicates))
        expected_errors_at = {at: Counter(r[0] for r in rows) for at, rows in _at_every_time(spark, errors).items()}
        rows_at = {at: rows_of_unique_keys(rows, at_key) for at, rows in rows_at.items()}
    for view_id, target in views.items():
        table_layout = layout_of(target) == TABLE
        got_at = _at_every_time(spark, [view_at(spark, target, view_id, at, errors="ignore") if table_layout
                                        else read_view(spark, target, view_id, at, errors="ignore" if key else "raise")
                                        for at in range(upper)])
        errors_at = (_at_every_time(spark, [view_errors(spark, target, at, view_id) for at in range(upper)])
                     if key or table_layout else {})
        for at in range(upper):
            got, expected = Counter(got_at[at]), Counter(rows_at[at])
            assert got == expected, (f"view {view_id} at time {at}: rows it has too many "
                                     f"{dict(got - expected)}, too few {dict(expected - got)}")
            if key or table_layout:
                assert Counter(r[0] for r in errors_at[at]) == expected_errors_at[at], \
                    f"view {view_id}'s errors at time {at}"


def rows_of_unique_keys(rows: list[tuple], at_key: list[int]) -> list[tuple]:
    """The rows whose key (the columns at ``at_key``) has no null and no other row: a view's ok
    rows, a violated key's being withheld."""
    from collections import Counter

    keys = Counter(tuple(row[i] for i in at_key) for row in rows)
    return [row for row in rows if keys[key_of := tuple(row[i] for i in at_key)] == 1 and None not in key_of]


def _at_every_time(spark, frames: list) -> dict[int, list[tuple]]:
    """The rows of each of ``frames`` (one per time, of one schema) by its index, by one Spark job
    over their union all, each row tagged with its frame's index."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    tagged = reduce(DataFrame.unionAll, [frame.select(F.lit(at).alias("_mvsink_test_time"), "*")
                                         for at, frame in enumerate(frames)])
    rows_at: dict[int, list[tuple]] = {at: [] for at in range(len(frames))}
    for row in tagged.collect():
        rows_at[row[0]].append(tuple(row[1:]))
    return rows_at


def from_the_feed(spark, tmp_path, src: str, sql: str, edit: Callable[[], None], rounds: int, rng,
                  key: tuple[str, ...] = (), refresh: str = "incremental", recomputed: bool = False,
                  late: bool = True):
    """:func:`through_random_rounds` over one source ``src``, the view named ``from_feed`` (beside
    the view ``recomputed`` in full, if asked): each equals the query at every time, rows and key
    errors (:func:`query_results_at_every_time`). Returns the first view (for what it kept)."""
    view, upper = through_random_rounds(spark, tmp_path, {"src": src}, sql, edit, rounds, rng, key, refresh,
                                        "from_feed", recomputed, late)
    targets = {n: str(tmp_path / n) for n in (("from_feed", "recomputed") if recomputed else ("from_feed",))}
    query_results_at_every_time(spark, src, sql, targets, targets["from_feed"] + "_timeline", upper, key)
    return view


def through_commits_without_feed(spark, view, src: str, caplog, without_feed: str, with_feed: Callable[[], None],
                                 deletion_vectors: bool = True) -> None:
    """``view`` caught up after a source commit made with the change data feed off (the SQL
    ``without_feed``): with ``deletion_vectors`` on for it, its files do not hold the source's
    rows, and the view warns that the changes cannot be read; without, it reads the commit's
    files and does not. Then after ``with_feed()`` commits, the feed on again: it does not."""
    import logging

    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = false, "
              f"delta.enableDeletionVectors = {str(deletion_vectors).lower()})")
    spark.sql(without_feed)
    with caplog.at_level(logging.WARNING, logger="mvsink.desired"):
        view.run_until_caught_up()
    warned = any("cannot be read" in r.getMessage() for r in caplog.records)
    assert warned == deletion_vectors, caplog.text
    spark.sql(f"ALTER TABLE delta.`{src}` SET TBLPROPERTIES (delta.enableChangeDataFeed = true)")
    with_feed()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mvsink.desired"):
        view.run_until_caught_up()
    assert not any("cannot be read" in r.getMessage() for r in caplog.records), "from the feed again"


#: The one-row sources of :func:`query_over_a_source` by ``(row, schema)``: made once a run.
_ONE_ROW_SOURCES: dict[tuple[tuple, str], str] = {}


def query_over_a_source(spark, tmp_path, sql: str, row: tuple, schema: str):
    """``sql`` over a Delta source of one ``row`` (registered as ``src``), as a DataFrame. The
    source is made once a run for each row and schema (next to ``tmp_path``) and never changed."""
    src = _ONE_ROW_SOURCES.get((row, schema))
    if src is None:
        src = _ONE_ROW_SOURCES[row, schema] = str(tmp_path.parent / f"one-row-source-{len(_ONE_ROW_SOURCES)}")
        create_source(spark, src, [row], schema)
    spark.read.format("delta").load(src).createOrReplaceTempView("src")
    return spark.sql(sql)


def random_commit(spark, src: str, rng, update: Callable[[], str], delete: Callable[[], str],
                  inserts: Callable[[], list[tuple]]) -> None:
    """One source commit chosen with ``rng``: the SQL ``update()`` (twice as likely), the SQL
    ``delete()``, or the rows ``inserts()``."""
    kind = rng.choice(["update", "update", "delete", "insert"])
    if kind == "insert":
        insert(spark, src, inserts())
    else:
        commit_sql(spark, update() if kind == "update" else delete())


def duckdb_with_delta():
    """DuckDB with the delta extension of the duckdb-ext-delta package (no download)."""
    import duckdb
    import duckdb_ext

    extensions = Path(list(duckdb_ext.__path__)[0]) / "extensions"
    con = duckdb.connect(config={"extension_directory": str(extensions), "autoinstall_known_extensions": False})
    con.execute("LOAD delta")
    return con


def rows_by_readers(spark, table: str, columns: list[str]) -> dict:
    """The multiset of ``columns`` rows of the Delta table at ``table`` as each reader that is not
    mvsink's reads it: Spark, DuckDB (``delta_scan``) and delta-rs (``QueryBuilder``, which applies
    deletion vectors), by reader name."""
    from collections import Counter

    from deltalake import DeltaTable, QueryBuilder

    listed = ", ".join(columns)
    duck = duckdb_with_delta()
    try:
        duckdb_rows = duck.sql(f"SELECT {listed} FROM delta_scan('{table}')").fetchall()
    finally:
        duck.close()
    delta_rs = QueryBuilder().register("t", DeltaTable(table)).execute(f"SELECT {listed} FROM t").read_all()
    return {"Spark": Counter(tuple(r) for r in spark.read.format("delta").load(table).select(*columns).collect()),
            "DuckDB": Counter(duckdb_rows),
            "delta-rs": Counter(zip(*(delta_rs.column(c).to_pylist() for c in columns)))}


def read_plainly_at_every_time(spark, target: str, view_id: str, columns: list[str], expected,
                               since: int = 0) -> tuple[int, int]:
    """Every time in `[since, upper)` of a table-layout view, read at the version that holds it
    (:func:`mvsink.target.read.version_of_time`) by three readers that know nothing of mvsink (DuckDB
    attached at that version, delta-rs, Spark's time travel), each equal to ``expected(t)``.
    Times whose version also holds a foreign commit are skipped. Returns (times read, versions
    read)."""
    from collections import Counter

    from deltalake import DeltaTable, QueryBuilder
    from pyspark.sql import functions as F

    from mvsink.target.read import NotReadable, version_of_time, view_upper

    version_at: dict[int, int] = {}
    for t in range(since, view_upper(target, view_id)):
        try:
            version_at[t] = version_of_time(target, view_id, t)
        except NotReadable as exc:
            assert "foreign commit" in str(exc), exc
    versions = sorted(set(version_at.values()))
    # Spark reads every version by time travel in one job: a union of the versions' reads.
    by_spark = {v: Counter() for v in versions}
    if versions:
        reads = [spark.read.format("delta").option("versionAsOf", v).load(target)
                 .select(F.lit(v).alias("_version"), *columns) for v in versions]
        for row in reduce(lambda a, b: a.unionAll(b), reads).collect():
            by_spark[row[0]][tuple(row[1:])] += 1
    con = duckdb_with_delta()
    selected = ", ".join(f'"{c}"' for c in columns)
    for version in versions:
        con.execute(f"ATTACH '{target}' AS v{version} (TYPE delta, VERSION {version})")
        by_duckdb = Counter(con.sql(f"SELECT {selected} FROM v{version}").fetchall())
        data = QueryBuilder().register("t", DeltaTable(target, version=version)).execute(
            f"SELECT {selected} FROM t").read_all()  # reads deletion vectors, which to_pyarrow_table refuses
        by_delta_rs = Counter(zip(*(data.column(c).to_pylist() for c in columns)))
        assert by_duckdb == by_delta_rs == by_spark[version], f"readers disagree at version {version}"
    for t, version in version_at.items():
        assert by_spark[version] == expected(t), f"time {t} at version {version}"
    return len(version_at), len(versions)


def foreign_append_before_commit(monkeypatch, target: str, rows) -> list[int]:
    """Arm the ``before-commit`` failpoint of mvsink's appends to append ``rows`` (a pyarrow table)
    to ``target`` behind mvsink's back, once, right before its next commit; the list gets the
    version of that foreign commit."""
    from deltalake import write_deltalake

    import mvsink.append as append_module
    from mvsink.table import latest_version

    hit = append_module.failpoints.hit
    landed: list[int] = []

    def foreign_append_first(name):
        if name == "before-commit" and not landed:
            write_deltalake(target, rows, mode="append")
            landed.append(latest_version(target))
        hit(name)

    monkeypatch.setattr(append_module.failpoints, "hit", foreign_append_first)
    return landed


def edit_orders(spark, src: str, rng, next_id: list[int], customers: int = 5, key=int,
                more: Callable[[], tuple] = tuple) -> None:
    """One commit to orders ``(id, cust, amount)`` of ``customers`` customers (and null): duplicate
    rows, null join keys, rows moving to another customer, deletes, and a row deleted and inserted
    again in one commit. A customer ``k``'s key is ``key(k)`` (an integer, or a string); an
    inserted row's further columns are ``more()``."""
    kind = rng.choice(["insert", "move", "delete", "reinsert"])
    if kind == "insert":
        rows = [(next_id[0] + i, rng.choice([*map(key, range(1, customers)), None]), rng.randint(0, 5), *more())
                for i in range(rng.randint(1, 4))]
        next_id[0] += len(rows)
        insert(spark, src, rows + rows[:1])  # a duplicate
    elif kind == "move":
        commit_sql(spark, f"UPDATE delta.`{src}` SET cust = {key(rng.randint(1, customers))!r} "
                          f"WHERE pmod(id, 4) = {rng.randint(0, 3)}")
    elif kind == "delete":
        commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE pmod(id, 5) = {rng.randint(0, 4)}")
    else:
        id_ = rng.randint(0, 30)
        replace_where(spark, src, "id", id_)


def edit_customers(spark, src: str, rng, customers: int = 5, key=int) -> None:
    """One commit to customers ``(cust, segment)`` (keys up to ``customers``, and null): customers
    changing segment, duplicated, deleted, null keys, appearing. Keys as :func:`edit_orders`'."""
    kind = rng.choice(["segment", "delete", "insert"])
    if kind == "segment":
        commit_sql(spark, f"UPDATE delta.`{src}` SET segment = '{rng.choice('xyz')}' "
                          f"WHERE cust = {key(rng.randint(1, customers))!r}")
    elif kind == "delete":
        commit_sql(spark, f"DELETE FROM delta.`{src}` WHERE cust = {key(rng.randint(1, customers))!r}")
    else:
        insert(spark, src, [(rng.choice([*map(key, range(1, customers + 1)), None]), rng.choice("xyz"))])


def through_random_rounds(spark, tmp_path, sources: dict[str, str], sql: str, edit: Callable[[], None],
                          rounds: int, rng, key: tuple[str, ...] = (), refresh: str = "incremental",
                          name: str = "maintained", recomputed: bool = False, late: bool = True):
    """The view ``name`` of ``sql`` over ``sources`` with ``key``, as mvsink maintains it (with
    ``refresh``), and if ``recomputed`` the view ``recomputed`` evaluated in full at each time;
    ``rounds`` times 1-3 ``edit()`` calls (source commits), then caught up. If ``late``, a second
    replica of the first, hydrated at the start, catches up only at the end: its changes span
    every time since. The catch-up is the strategy's own code whatever the query, and about 40% of
    such a test's time: a test over several queries of one strategy asks for it in a few (a source
    without change data feed among them, where one is), not in each. Returns the first view and
    the times every view holds."""
    from mvsink import MaterializedView, SnapshotInput, ViewDefinition

    def view(view_id: str, replica: str = "r1"):
        return MaterializedView(spark, ViewDefinition(view_id, str(tmp_path / view_id),
                                                      SnapshotInput(sql=sql, refresh=refresh), key=key,
                                                      sources=sources, replica_id=replica))

    views = {view_id: view(view_id) for view_id in ((name, "recomputed") if recomputed else (name,))}
    if recomputed:
        full = views["recomputed"].desired
        full.row_wise, full.aggregate, full.join, full.per_group = False, None, False, None
    late_views = [view(name, "r2")] if late else []
    for round_ in range(rounds + 1):
        for each in views.values():
            each.run_until_caught_up()
        if round_ == 0:
            for each in late_views:
                each.run_until_caught_up()
        for _ in range(rng.randint(1, 3)):
            edit()
    for each in [*views.values(), *late_views]:
        each.run_until_caught_up()
    upper = views[name].observed_upper
    assert {each.observed_upper for each in views.values()} == {upper} and upper >= rounds
    return views[name], upper


def maintained_against_the_query(spark, tmp_path, sources: dict[str, str], sql: str, edit: Callable[[], None],
                                 rounds: int, rng, key: tuple[str, ...] = (), refresh: str = "incremental",
                                 late: bool = True):
    """:func:`through_random_rounds`, then at every time the view ``maintained`` has the rows (and
    key errors) of the query evaluated in full by Spark over the sources as of that time's
    versions (:func:`query_results_at_every_time`). Returns the view (for its strategy)."""
    view, upper = through_random_rounds(spark, tmp_path, sources, sql, edit, rounds, rng, key, refresh, late=late)
    target = str(tmp_path / "maintained")
    query_results_at_every_time(spark, sources, sql, {"maintained": target}, target + "_timeline", upper, key)
    return view
