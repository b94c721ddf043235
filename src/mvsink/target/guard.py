"""The guard: what a table must be for mvsink to commit to it and read it back, and its upper's history.

mvsink commits staged Parquet files through delta-rs with no Spark in the path, and reads a
table back by its list of data files (:mod:`mvsink.correction.readback`). So a table is refused,
with an error naming the feature and the fix, when it has anything those two cannot honour:

* deletion vectors, where the view says ``deletion_vectors: off`` (otherwise the read-back
  follows logical files and the retractions' search skips deleted rows, and with ``on``/``auto``
  mvsink marks its own retractions in them: :func:`allows_deletion_vectors`);
* column mapping (mvsink writes columns under their names, not physical ids);
* check constraints, invariants, generated or identity columns (nothing in the commit path
  enforces or fills them);
* row tracking, type widening, catalog-managed or coordinated commits, and any reader or writer
  feature not on the allow-lists below (unknown to mvsink, so not known to be safe);
* ``delta.setTransactionRetentionDuration``: it expires ``txn`` actions, and the view's upper is
  one; an expired txn reads as upper 0 and would make a replica write every time again.

The check runs on every snapshot mvsink bases a read-back, a commit or a compaction on, so a
protocol upgrade or a property set behind mvsink's back stops the replica at its next step,
before it writes.

The upper (the version of the view's txn) only ever grows, and only mvsink's commits of the
view set it. :class:`UpperHistory` holds a replica to that: the upper it reads must not be below
one it has seen, nor below the upper recorded (``mvsink.upper``) by the last commit that carried
the txn; a commit that carries the txn without being the view's own (a writer reusing the appId)
is reported. Each of these stops the replica (a :class:`ConfigError`) instead of writing.
"""

from __future__ import annotations

from deltalake import DeltaTable

from mvsink.view import ConfigError

#: The property that expires txn actions, and so the view's upper.
TXN_RETENTION = "delta.setTransactionRetentionDuration"

#: Features whose tables mvsink commits to and reads back correctly (delta-rs 1.6 supports them
#: and they constrain nothing mvsink writes).
#: ``variantType``: delta-rs 1.6 lists it in every table it creates with table features (one with
#: deletion vectors); mvsink's views have no variant columns.
ALLOWED_READER_FEATURES = frozenset({"timestampNtz", "vacuumProtocolCheck", "variantType"})
ALLOWED_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "checkConstraints", "changeDataFeed",
                                     "generatedColumns", "identityColumns", "timestampNtz",
                                     "vacuumProtocolCheck", "domainMetadata", "variantType"})

#: Why a feature is refused, for the ones a user is likely to meet.
_WHY = {
    "deletionVectors": "the view says deletion_vectors: off, which keeps the table readable by "
                       "readers without deletion vectors; say auto or on to take it",
    "columnMapping": "mvsink writes Parquet columns under their names, column mapping reads them by "
                     "physical name",
    "rowTracking": "mvsink's commits do not assign row ids",
    "typeWidening": "mvsink's read-back reads every file with the view's types",
    "v2Checkpoint": "not known to work with mvsink's commit path",
    "catalogOwned-preview": "commits must go through the catalog, mvsink commits to the log itself",
    "catalogManaged": "commits must go through the catalog, mvsink commits to the log itself",
    "coordinatedCommits-preview": "commits must go through a commit coordinator, mvsink commits to the "
                                  "log itself",
}


class UnsupportedTarget(ConfigError):
    """The table has a feature or property mvsink's commit path or read-back cannot take."""


class UpperWentBackwards(ConfigError):
    """The view's upper is below one already seen or recorded: something else set or dropped it."""


class ForeignTransaction(ConfigError):
    """A commit that is not the view's carries the view's txn appId."""


def allows_deletion_vectors(table: DeltaTable) -> bool:
    """Whether a commit may add files with deletion vectors to ``table``: its protocol has the
    ``deletionVectors`` reader and writer features and ``delta.enableDeletionVectors`` is true."""
    protocol = table.protocol()
    return ("deletionVectors" in (protocol.reader_features or ()) and "deletionVectors" in
            (protocol.writer_features or ()) and
            table.metadata().configuration.get("delta.enableDeletionVectors", "false").lower() == "true")


def check_supported(table: DeltaTable, uri: str, deletion_vectors: bool = False) -> None:
    """Raise :class:`UnsupportedTarget` naming everything in ``table`` (at ``uri``) that mvsink
    cannot commit to or read back, with the fix. ``deletion_vectors``: the view takes tables with
    deletion vectors (its read-back follows logical files, :mod:`mvsink.correction.readback`)."""
    protocol = table.protocol()
    configuration = table.metadata().configuration
    problems = []
    if protocol.min_reader_version > 3 or protocol.min_writer_version > 7:
        problems.append(f"protocol ({protocol.min_reader_version}, {protocol.min_writer_version}) is newer "
                        "than Delta's reader 3 / writer 7")
    features = set(protocol.reader_features or []) - ALLOWED_READER_FEATURES
    features |= set(protocol.writer_features or []) - ALLOWED_WRITER_FEATURES
    if configuration.get("delta.enableDeletionVectors", "false").lower() == "true":
        features.add("deletionVectors")
    if configuration.get("delta.columnMapping.mode", "none").lower() != "none":
        features.add("columnMapping")
    if configuration.get("delta.enableRowTracking", "false").lower() == "true":
        features.add("rowTracking")
    if deletion_vectors:
        features.discard("deletionVectors")
    for feature in sorted(features):
        why = _WHY.get(feature, "mvsink does not know it to be safe for its commit path")
        problems.append(f"table feature {feature} ({why}); recreate the table without it, or "
                        f"ALTER TABLE delta.`{uri}` DROP FEATURE {feature}")
    constraints = sorted(k[len("delta.constraints."):] for k in configuration if k.startswith("delta.constraints."))
    if constraints:
        problems.append(f"check constraints {constraints} (mvsink's commits do not enforce them); "
                        f"ALTER TABLE delta.`{uri}` DROP CONSTRAINT <name>")
    for field in table.schema().fields:
        kinds = [k for k in field.metadata if k in ("delta.generationExpression", "delta.invariants")
                 or k.startswith("delta.identity.")]
        if kinds:
            problems.append(f"column {field.name} has {', '.join(sorted(kinds))} (mvsink's commits do not "
                            "enforce or fill them)")
    if TXN_RETENTION in configuration:
        problems.append(f"table property {TXN_RETENTION} = {configuration[TXN_RETENTION]!r} expires txn "
                        "actions, and the view's upper is one: an expired upper would read as 0 and every "
                        f"time would be written again; ALTER TABLE delta.`{uri}` UNSET TBLPROPERTIES "
                        f"('{TXN_RETENTION}')")
    if problems:
        raise UnsupportedTarget(f"mvsink cannot write to {uri}: " + "; ".join(problems))


class UpperHistory:
    """The highest upper of one txn appId a replica has seen or found recorded; see the module doc."""

    def __init__(self, uri: str, app_id: str, view_id: str):
        self.uri, self.app_id, self.view_id = uri, app_id, view_id
        self.highest = 0
        #: Where the highest came from, for the error.
        self.seen_at = "nowhere"

    def check(self, upper: int, table_version: int) -> int:
        """``upper``, read at ``table_version``; raises :class:`UpperWentBackwards` if it is below
        the highest seen."""
        if upper < self.highest:
            raise UpperWentBackwards(
                f"the upper of view {self.view_id!r} in {self.uri} is {upper} at table version "
                f"{table_version}, below {self.highest} ({self.seen_at}): its txn {self.app_id!r} was "
                f"dropped or set back (expired by {TXN_RETENTION}, the table recreated, or a foreign "
                "writer using the appId); mvsink stops rather than write again times the table has. "
                "Rebuild the target (move it away; mvsink writes it again from the sources)")
        if upper > self.highest:
            self.highest, self.seen_at = upper, f"seen at table version {table_version}"
        return upper

    def record(self, version: int, actions: list[dict]) -> None:
        """Take in the log entry of table ``version``: if it carries the txn, it must be the
        view's own commit (:class:`ForeignTransaction` if not), and its upper is recorded."""
        txn = next((a["txn"] for a in actions if "txn" in a and a["txn"].get("appId") == self.app_id), None)
        if txn is None:
            return
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        recorded = info.get("mvsink.upper")
        if info.get("mvsink.view") != self.view_id or recorded is None or int(recorded) != int(txn["version"]):
            raise ForeignTransaction(
                f"table version {version} of {self.uri} sets txn {self.app_id!r} to {txn['version']} but is not "
                f"a commit of view {self.view_id!r} (operation {info.get('operation')!r}, engine "
                f"{info.get('engineInfo') or info.get('clientVersion')!r}): a writer is using the view's appId; "
                "mvsink will not build on it. Stop that writer, then rebuild the target (move it away)")
        if int(recorded) > self.highest:
            self.highest, self.seen_at = int(recorded), f"recorded by the view's commit at table version {version}"
