"""A Spark logical plan of projections, filters and inner equi-joins, evaluated in this process with Arrow.

A small change's terms (:mod:`mvsink.desired.in_process`) are a few thousand rows joined with the
rows of a few files: Spark spends far longer planning and scheduling them than computing them. So
the plan Spark optimized for the query over held rows (:data:`~mvsink.desired.row_wise.HELD_ROWS`
leaves, one per source) is translated once into Arrow compute calls, and each term is evaluated
over Arrow tables of the sources' rows.

The translation takes only what Arrow computes exactly as Spark does, and refuses the rest with
:class:`NotTranslated` naming what it met:

* nodes: a held leaf, ``Project``, ``Filter``, an inner ``Join`` with at least one equality of a
  column of each side (a hash join, in which a null key matches nothing, as in Spark; the other
  conjuncts filter the joined rows);
* column types: integers, booleans, dates, decimals and strings of Spark's binary collation
  (compared by their UTF-8 bytes, as Spark compares them); no floating point (Spark's ``NaN``
  equals itself), no timestamps (time zones);
* expressions: columns, literals, ``IS [NOT] NULL``, ``NOT``/``AND``/``OR`` (three-valued, as
  Spark's), the comparisons ``= < <= > >=`` between one type, ``IN`` of literals (null where the
  value is null, or where it matches none and the list holds a null), ``+ - *`` of integers and of
  decimals whose result scale is the exact one (computed in 256 bits where it needs more than 38
  digits, then fitted to Spark's type; where Spark rounds, to fit 38 digits, it is refused),
  casts that widen an integer or a decimal or make an integer a decimal, ``CASE WHEN`` and ``IF``
  (a null condition is not true), ``COALESCE``, ``year``, ``month`` and ``day`` of a date, and
  ``LIKE`` of a literal pattern with the default escape, with the prefix, suffix and substring
  tests Spark makes of simple ones.

Arithmetic is checked: where a value overflows, or does not fit the type Spark gives the
expression, evaluation raises :class:`NotEvaluated` (Spark, which the caller then asks, raises its
own error or computes its own value). Each plan attribute is a column named by its expression id,
so the joined tables' names never clash; the result has the plan's output columns under their names,
in the Arrow types of the plan's Spark schema.

Invariant: where :meth:`ArrowPlan.evaluate` returns, its rows are the multiset Spark's plan
yields over the same leaf rows.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from decimal import Decimal
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_type

from mvsink.desired.join import INNER_JOINS
from mvsink.desired.row_wise import HELD_ROWS, conjuncts, scala_items

_COMPARISONS = {"EqualTo": pc.equal, "LessThan": pc.less, "LessThanOrEqual": pc.less_equal,
                "GreaterThan": pc.greater, "GreaterThanOrEqual": pc.greater_equal}
_ARITHMETIC = {"Add": pc.add_checked, "Subtract": pc.subtract_checked, "Multiply": pc.multiply_checked}
_STRING_TESTS = {"Like": pc.match_like, "StartsWith": pc.starts_with, "EndsWith": pc.ends_with,
                 "Contains": pc.match_substring}
_INTEGERS = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
#: A date's fields (Spark's and Arrow's calendars are both the proleptic Gregorian).
_DATE_FIELDS = {"Year": pc.year, "Month": pc.month, "DayOfMonth": pc.day}
_EPOCH = datetime.date(1970, 1, 1)

#: An evaluated expression: an array over a table's rows, or a scalar.
Value = pa.Array | pa.ChunkedArray | pa.Scalar
Expression = Callable[[pa.Table], Value]
Node = Callable[[dict[str, pa.Table]], pa.Table]


class NotTranslated(Exception):
    """The plan has a node, expression or type that is not evaluated here."""


class NotEvaluated(Exception):
    """A value overflowed or did not fit its type: Spark decides what it is."""


class ArrowPlan:
    """``rows``' optimized plan over held leaves (``names``: each leaf's RDD id -> its source),
    translated: :meth:`evaluate` gives its rows over Arrow tables of the sources."""

    def __init__(self, rows: DataFrame, names: dict[int, str]):
        plan = rows._jdf.queryExecution().optimizedPlan()
        self._names = names
        self._used = _used_ids(plan)
        #: Per source, the columns the plan reads of it (by name).
        self.columns: dict[str, list[str]] = {}
        self._root = self._node(plan)
        self._output = [(_column(a), a.name()) for a in scala_items(plan.output())]
        self.schema = rows.schema
        self.arrow_schema = arrow_schema(rows.schema)

    def evaluate(self, sources: dict[str, pa.Table]) -> pa.Table:
        """The plan's rows over ``sources`` (by name, each with at least :attr:`columns` of it)."""
        try:
            table = self._root(sources)
            columns = [pc.cast(table.column(column), field.type, safe=True)
                       for (column, _), field in zip(self._output, self.arrow_schema)]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OverflowError) as exc:
            raise NotEvaluated(str(exc).splitlines()[0][:200]) from None
        return pa.Table.from_arrays(columns, schema=self.arrow_schema)

    def _node(self, plan) -> Node:
        kind = plan.nodeName()
        children = scala_items(plan.children())
        if not children:
            return self._leaf(plan)
        if kind == "Project":
            return self._project(plan, self._node(plan.child()))
        if kind == "Filter":
            child, condition = self._node(plan.child()), _expression(plan.condition())
            return lambda sources: _filtered(child(sources), condition)
        if kind == "Join" and plan.joinType().toString() in INNER_JOINS:
            return self._join(plan)
        raise NotTranslated(f"the node {kind}")

    def _leaf(self, plan) -> Node:
        if plan.nodeName() != HELD_ROWS or plan.rdd().id() not in self._names:
            raise NotTranslated(f"the leaf {plan.nodeName()}")
        name = self._names[plan.rdd().id()]
        attributes = [a for a in scala_items(plan.output()) if a.exprId().id() in self._used]
        for a in attributes:
            _arrow_type(a.dataType())
        self.columns[name] = [a.name() for a in attributes]
        renamed = [(a.name(), _column(a)) for a in attributes]
        return lambda sources: pa.table({column: sources[name].column(source) for source, column in renamed})

    @staticmethod
    def _project(plan, child: Node) -> Node:
        outputs = []
        for item in scala_items(plan.projectList()):
            if item.nodeName() == "Alias":
                outputs.append((_column(item), _expression(item.child())))
            else:
                outputs.append((_column(item), _expression(item)))

        def project(sources: dict[str, pa.Table]) -> pa.Table:
            table = child(sources)
            return pa.table({column: _array(expression(table), table.num_rows) for column, expression in outputs})
        return project

    def _join(self, plan) -> Node:
        left, right = self._node(plan.left()), self._node(plan.right())
        left_ids = {a.exprId().id() for a in scala_items(plan.left().output())}
        right_ids = {a.exprId().id() for a in scala_items(plan.right().output())}
        keys, rest = [], []
        for conjunct in (conjuncts(plan.condition().get()) if plan.condition().isDefined() else []):
            pair = _equi_pair(conjunct, left_ids, right_ids)
            if pair is None:
                rest.append(_expression(conjunct))
            else:
                keys.append(pair)
        if not keys:
            raise NotTranslated("a join without an equality of its sides' columns")
        left_keys, right_keys = [k for k, _ in keys], [k for _, k in keys]

        def join(sources: dict[str, pa.Table]) -> pa.Table:
            joined = left(sources).join(right(sources), left_keys, right_keys, join_type="inner",
                                        coalesce_keys=False)
            return reduce(_filtered, rest, joined)
        return join


def arrow_schema(schema: T.StructType) -> pa.Schema:
    """``schema``'s columns in their Arrow types, each nullable (whatever Spark says: a row of a
    join's or an aggregate's may be null where its source's is not)."""
    return pa.schema([pa.field(f.name, to_arrow_type(f.dataType)) for f in schema.fields])


def _used_ids(plan) -> set[int]:
    """The ids of the attributes ``plan``'s nodes read, and of its output: the leaf columns to read."""
    used, pending = {a.exprId().id() for a in scala_items(plan.output())}, [plan]
    while pending:
        node = pending.pop()
        used |= {a.exprId().id() for a in scala_items(node.references().toSeq())}
        pending += scala_items(node.children())
    return used


def _equi_pair(conjunct, left_ids: set[int], right_ids: set[int]) -> tuple[str, str] | None:
    """The columns ``(left's, right's)`` an equality of two attributes of one type compares, one
    of each side; None for any other conjunct."""
    if conjunct.nodeName() != "EqualTo":
        return None
    a, b = conjunct.left(), conjunct.right()
    if a.nodeName() != "AttributeReference" or b.nodeName() != "AttributeReference":
        return None
    if a.exprId().id() in right_ids and b.exprId().id() in left_ids:
        a, b = b, a
    if a.exprId().id() not in left_ids or b.exprId().id() not in right_ids:
        return None
    if a.dataType().json() != b.dataType().json():
        return None
    return _column(a), _column(b)


def _filtered(table: pa.Table, condition: Expression) -> pa.Table:
    """``table``'s rows where ``condition`` is true (not false, not null)."""
    mask = condition(table)
    if isinstance(mask, pa.Scalar):
        return table if mask.as_py() is True else table.slice(0, 0)
    return table.filter(mask, null_selection_behavior="drop")


def _array(value: Value, rows: int) -> pa.Array | pa.ChunkedArray:
    """``value`` as a column of ``rows`` rows (a scalar repeated)."""
    return pa.repeat(value, rows) if isinstance(value, pa.Scalar) else value


def _column(attribute) -> str:
    """The column an attribute (or alias) is in: its expression id."""
    return f"#{attribute.exprId().id()}"


def _spark_type(data_type) -> T.DataType:
    return T._parse_datatype_json_string(data_type.json())


def _arrow_type(data_type) -> pa.DataType:
    """The Arrow type of a Catalyst type evaluated here; :class:`NotTranslated` for any other."""
    spark = _spark_type(data_type)
    if isinstance(spark, T.StringType) and spark.collation != "UTF8_BINARY":
        raise NotTranslated(f"a string of collation {spark.collation}")
    if not isinstance(spark, (*_INTEGERS, T.BooleanType, T.DateType, T.DecimalType, T.StringType)):
        raise NotTranslated(f"a column of type {spark.simpleString()}")
    return to_arrow_type(spark)


def _expression(expr) -> Expression:
    """``expr`` (a Catalyst expression) as a function of a table's columns."""
    kind = expr.nodeName()
    arrow_type = _arrow_type(expr.dataType())
    if kind == "AttributeReference":
        column = _column(expr)
        return lambda table: table.column(column)
    if kind == "Literal":
        value = _literal(expr.value(), _spark_type(expr.dataType()))
        scalar = pa.scalar(value, arrow_type)
        return lambda table: scalar
    if kind in ("IsNotNull", "IsNull"):
        child = _expression(expr.child())
        test = pc.is_valid if kind == "IsNotNull" else pc.is_null
        return lambda table: test(child(table))
    if kind == "Not":
        child = _expression(expr.child())
        return lambda table: pc.invert(child(table))
    if kind in ("And", "Or"):
        left, right = _expression(expr.left()), _expression(expr.right())
        both = pc.and_kleene if kind == "And" else pc.or_kleene
        return lambda table: both(left(table), right(table))
    if kind in _COMPARISONS:
        if expr.left().dataType().json() != expr.right().dataType().json():
            raise NotTranslated(f"a comparison of {expr.left().dataType().simpleString()} "
                                f"and {expr.right().dataType().simpleString()}")
        left, right, compare = _expression(expr.left()), _expression(expr.right()), _COMPARISONS[kind]
        return lambda table: compare(left(table), right(table))
    if kind in ("In", "InSet"):
        return _in(expr)
    if kind in _ARITHMETIC:
        return _arithmetic(expr, kind, arrow_type)
    if kind == "Cast":
        return _cast(expr, arrow_type)
    if kind in ("CaseWhen", "If"):
        return _conditional(expr, kind, arrow_type)
    if kind == "Coalesce":
        children = [_expression(child) for child in scala_items(expr.children())]
        return lambda table: pc.coalesce(*(_typed(child(table), arrow_type) for child in children))
    if kind in _STRING_TESTS:
        return _string_test(expr, kind)
    if kind in _DATE_FIELDS and isinstance(_spark_type(expr.child().dataType()), T.DateType):
        child, field = _expression(expr.child()), _DATE_FIELDS[kind]
        return lambda table: pc.cast(field(child(table)), arrow_type)
    raise NotTranslated(f"the expression {kind}")


def _typed(value: Value, arrow_type: pa.DataType) -> Value:
    """``value`` in ``arrow_type`` (a literal ``NULL`` is typed by the expression it is in)."""
    return value if value.type == arrow_type else pc.cast(value, arrow_type, safe=True)


def _conditional(expr, kind: str, arrow_type: pa.DataType) -> Expression:
    """``CASE WHEN`` (the first branch whose condition is true, not null; else its ``ELSE`` or
    null) and ``IF``."""
    if kind == "If":
        branches = [(_expression(expr.predicate()), _expression(expr.trueValue()))]
        otherwise = _expression(expr.falseValue())
    else:
        branches = [(_expression(pair._1()), _expression(pair._2())) for pair in scala_items(expr.branches())]
        otherwise = _expression(expr.elseValue().get()) if expr.elseValue().isDefined() else None
    nothing = pa.scalar(None, arrow_type)

    def case(table: pa.Table) -> Value:
        result = _typed(otherwise(table), arrow_type) if otherwise is not None else nothing
        for condition, value in reversed(branches):
            result = pc.if_else(pc.fill_null(condition(table), False), _typed(value(table), arrow_type), result)
        return result
    return case


def _string_test(expr, kind: str) -> Expression:
    """``LIKE`` (a literal pattern, the default escape) and the tests Spark rewrites simple ones
    to (``StartsWith``, ``EndsWith``, ``Contains``), by the strings' bytes as Spark compares them."""
    pattern = expr.right()
    if pattern.nodeName() != "Literal" or pattern.value() is None:
        raise NotTranslated(f"a {kind} of other than a literal")
    if kind == "Like" and expr.escapeChar() != "\\":
        raise NotTranslated("a LIKE with an escape character of its own")
    text, value, test = pattern.value().toString(), _expression(expr.left()), _STRING_TESTS[kind]
    return lambda table: test(value(table), text)


def _literal(value, data_type: T.DataType):
    """A Catalyst literal's JVM value as the Python value of ``data_type``."""
    if value is None:
        return None
    if isinstance(data_type, T.StringType):
        return value.toString()
    if isinstance(data_type, T.DecimalType):
        exact = value.toJavaBigDecimal()  # py4j gives a java.math.BigDecimal as a Decimal
        return exact if isinstance(exact, Decimal) else Decimal(exact.toPlainString())
    if isinstance(data_type, T.DateType):
        return _EPOCH + datetime.timedelta(days=int(value))
    return value


def _in(expr) -> Expression:
    """``value IN (literals)``, null where ``value`` is null or matches none while a literal is null."""
    value = _expression(expr.child() if expr.nodeName() == "InSet" else expr.value())
    data_type = _spark_type((expr.child() if expr.nodeName() == "InSet" else expr.value()).dataType())
    if expr.nodeName() == "InSet":
        items = [_literal(v, data_type) for v in scala_items(expr.hset().toSeq())]
    else:
        listed = scala_items(expr.list())
        if any(item.nodeName() != "Literal" or item.dataType().json() != expr.value().dataType().json()
               for item in listed):
            raise NotTranslated("an IN of other than literals of its value's type")
        items = [_literal(item.value(), data_type) for item in listed]
    has_null = any(item is None for item in items)
    value_set = pa.array([item for item in items if item is not None], to_arrow_type(data_type))

    def member(table: pa.Table) -> Value:
        values = value(table)
        found = pc.is_in(values, value_set=value_set, skip_nulls=True)
        unknown = pc.or_(pc.is_null(values), pc.and_(pc.invert(found), pa.scalar(has_null)))
        return pc.if_else(unknown, pa.scalar(None, pa.bool_()), found)
    return member


def _arithmetic(expr, kind: str, arrow_type: pa.DataType) -> Expression:
    """``+ - *`` of one type, or of decimals whose result scale is the exact one."""
    left_type, right_type = _spark_type(expr.left().dataType()), _spark_type(expr.right().dataType())
    result = _spark_type(expr.dataType())
    if isinstance(result, T.DecimalType):
        if not (isinstance(left_type, T.DecimalType) and isinstance(right_type, T.DecimalType)):
            raise NotTranslated(f"{kind} of {left_type.simpleString()} and {right_type.simpleString()}")
        exact = left_type.scale + right_type.scale if kind == "Multiply" else max(left_type.scale, right_type.scale)
        if result.scale != exact:
            raise NotTranslated(f"{kind} rounded to {result.simpleString()}")
    elif not (isinstance(result, _INTEGERS) and left_type == right_type == result):
        raise NotTranslated(f"{kind} of {left_type.simpleString()} and {right_type.simpleString()}")
    left, right, compute = _expression(expr.left()), _expression(expr.right()), _ARITHMETIC[kind]
    wide = _wide_decimals(left_type, right_type, kind)
    if wide is not None:  # computed in 256 bits, then fitted to Spark's type (which may cap the precision at 38)
        return lambda table: pc.cast(compute(pc.cast(left(table), wide[0]), pc.cast(right(table), wide[1])),
                                     arrow_type, safe=True)
    return lambda table: pc.cast(compute(left(table), right(table)), arrow_type, safe=True)


def _wide_decimals(left: T.DataType, right: T.DataType, kind: str) -> tuple[pa.DataType, pa.DataType] | None:
    """Both operands' 256-bit types where the exact result of ``kind`` of two decimals needs more
    than 38 digits (Arrow's 128-bit decimals refuse it); None otherwise."""
    if not isinstance(left, T.DecimalType):
        return None
    if kind == "Multiply":
        digits = left.precision + right.precision + 1
    else:
        digits = max(left.precision - left.scale, right.precision - right.scale) + max(left.scale, right.scale) + 1
    if digits <= 38:
        return None
    return pa.decimal256(left.precision, left.scale), pa.decimal256(right.precision, right.scale)


def _cast(expr, arrow_type: pa.DataType) -> Expression:
    """A cast that keeps every value: same type, a wider integer or decimal, an integer to a decimal."""
    source, target = _spark_type(expr.child().dataType()), _spark_type(expr.dataType())
    widening = (source == target
                or isinstance(source, _INTEGERS) and isinstance(target, (*_INTEGERS, T.DecimalType))
                and (not isinstance(target, _INTEGERS) or _INTEGERS.index(type(source)) <= _INTEGERS.index(type(target)))
                or isinstance(source, T.DecimalType) and isinstance(target, T.DecimalType)
                and target.scale >= source.scale and target.precision - target.scale >= source.precision - source.scale)
    if not widening:
        raise NotTranslated(f"a cast of {source.simpleString()} to {target.simpleString()}")
    child = _expression(expr.child())
    return lambda table: pc.cast(child(table), arrow_type, safe=True)
