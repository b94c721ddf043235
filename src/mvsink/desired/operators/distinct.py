"""Which of a query's output columns no two of its rows share values of, read off its plan.

A view keyed by such columns can have no duplicate key at any time, whatever its sources hold, so
a step that changes how many rows a key has needs no key check (a null key is an error row made
with the rows, not by the check). Two sources of that knowledge:

* Spark's own (``LogicalPlan.distinctKeys``): an aggregate's grouping columns, ``DISTINCT``, kept
  through projections and filters;
* the dedup ``row_number() OVER (PARTITION BY p ...) = 1`` (or ``<= 1``), which Spark does not
  derive: under a filter keeping row number 1 only, the window's partition columns.

Either only where every column of the set is an attribute the query outputs (by id).
"""

from __future__ import annotations

from mvsink.desired.row_wise import conjuncts, scala_items


def distinct_keys(query) -> list[frozenset[str]]:
    """The sets of ``query``'s (a DataFrame) output column names known distinct."""
    plan = query._jdf.queryExecution().optimizedPlan()
    names = {a.exprId().id(): a.name() for a in scala_items(plan.output())}
    found = [_named(scala_items(keys.toSeq()), names) for keys in scala_items(plan.distinctKeys().toSeq())]
    found.append(_named(_row_number_partition(plan), names))
    return [keys for keys in found if keys]


def _named(expressions: list, names: dict[int, str]) -> frozenset[str] | None:
    """The output names of ``expressions`` if each is an output attribute; else None."""
    if not expressions or any(e.nodeName() != "AttributeReference" or e.exprId().id() not in names
                              for e in expressions):
        return None
    return frozenset(names[e.exprId().id()] for e in expressions)


def _row_number_partition(plan) -> list:
    """The partition expressions of a window under ``plan``'s projections and filters, one of whose
    filters keeps only row number 1 of that window's ``row_number()``; else none."""
    kept, node = set(), plan
    while node.nodeName() in ("Project", "Filter"):
        if node.nodeName() == "Filter":
            kept |= {_first_row_of(c) for c in conjuncts(node.condition())} - {None}
        node = node.child()
    if node.nodeName() != "Window":
        return []
    for expression in scala_items(node.windowExpressions()):
        window = expression.child() if expression.nodeName() == "Alias" else None
        if (window is not None and expression.exprId().id() in kept and window.nodeName() == "WindowExpression"
                and window.windowFunction().nodeName() == "RowNumber"):
            return scala_items(window.windowSpec().partitionSpec())
    return []


def _first_row_of(condition) -> int | None:
    """The id of the attribute ``condition`` keeps at 1 only (``a = 1``, ``a <= 1``, ``a < 2``)."""
    name = condition.nodeName()
    if name not in ("EqualTo", "LessThanOrEqual", "LessThan"):
        return None
    left, right = condition.left(), condition.right()
    if left.nodeName() != "AttributeReference" or right.nodeName() != "Literal":
        return None
    bound = right.value()
    return left.exprId().id() if bound == (2 if name == "LessThan" else 1) else None
