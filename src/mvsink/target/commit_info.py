"""The commit-info vocabulary: what every mvsink commit says of itself in the Delta log.

Every key is prefixed ``mvsink.`` so it cannot clash with Delta's own. A commit of a view carries
view, replica, lower, upper, reason and commit id; the rest are set by the commits named beside
them. Readers of the table (:mod:`mvsink.target.read`, :mod:`mvsink.target.status`,
:mod:`mvsink.check`), the read-back and the step all read a commit through these names.
"""

#: Commit-info keys, all prefixed so they cannot clash with Delta's own.
META_VIEW = "mvsink.view"
META_REPLICA = "mvsink.replica"
META_LOWER = "mvsink.lower"
META_UPPER = "mvsink.upper"
META_REASON = "mvsink.reason"
META_REPAIRS = "mvsink.repairs"
META_COMMIT = "mvsink.commit"
#: Set by compactions only: the view's since from that commit on.
META_SINCE = "mvsink.since"
#: Set by appends: the table version the replica had read back; foreign commits up to it are
#: accounted for by this commit (see :mod:`mvsink.correction.readback`). Set by the table
#: layout's compactions too: the version whose files they rearranged.
META_READBACK = "mvsink.readback"
#: Set by repairs: how many updates the commit wrote below its lower, restoring history.
META_HISTORY = "mvsink.history_updates"
#: The definition id of the committing replica's view (:mod:`mvsink.definition`).
META_DEFINITION = "mvsink.definition"

REASON_CORRECTION = "correction"
REASON_REPAIR = "repair"
REASON_PROGRESS = "progress"
REASON_ADVANCE_UPPER = "advance-upper"
REASON_COMPACTION = "compaction"
REASON_FENCE = "fence"
