"""A step's changes by the operators: per time, the top operator's rows added and removed.

Each time of a step is one :class:`~.base.Step` from the versions of the time before to its own;
a source's change at that time is its rows of the step's changes (read once for the step's times,
:func:`~mvsink.desired.change_feed.source_changes`, held by the caller) at that time, a row of
diff ``n`` repeated ``|n|`` times on its side.
"""

from __future__ import annotations

from typing import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from mvsink.desired.operators.base import Operator, Step
from mvsink.desired.operators.catalyst import Catalyst
from mvsink.updates import DIFF, TIME


def time_changes(root: Operator, catalyst: Catalyst, times: list[int], versions: Callable[[int], dict[str, int]],
                 read: Callable[[str, int], DataFrame], feeds: dict[str, DataFrame]
                 ) -> tuple[list[tuple[int, DataFrame, DataFrame]], float]:
    """Per time of ``times`` whose change is not nothing, the query's rows added and removed
    (lazy); ``feeds`` holds the changes of every source read whose version moves. And the
    seconds spent holding state from whole inputs (:attr:`~.base.Step.setup`)."""
    found, setup = [], [0.0]
    for time in times:
        step = Step(catalyst, versions(time - 1), versions(time), read,
                    lambda name, time=time: (_side(feeds[name], time, 1), _side(feeds[name], time, -1)), setup=setup)
        change = root.change(step)
        if change is not None:
            found.append((time, catalyst.frame(change.plus), catalyst.frame(change.minus)))
    return found, setup[0]


def _side(feed: DataFrame, time: int, sign: int) -> DataFrame:
    """The rows of ``feed`` at ``time`` whose diff has ``sign``, each as many times as its diff says."""
    columns = [c for c in feed.columns if c not in (TIME, DIFF)]
    copies = F.col(DIFF) * sign
    rows = feed.where((F.col(TIME) == time) & (copies > 0))
    return rows.select(*columns, F.explode(F.array_repeat(F.lit(0), copies.cast("int"))).alias("_mv_copy")
                       ).select(*columns)
