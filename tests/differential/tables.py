"""The differential tester's sources: four small tables shaped like TPC-H's, their random first
rows and Delta properties.

Key domains are small so that joins hit (a few nations, customers, orders per customer, lines
per order) and every key and value column holds some NULLs. No floating-point column: a sum of
doubles depends on the order it is added in, which would make the maintained view and the full
evaluation differ by rounding, not by a defect.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass
from decimal import Decimal

#: Each table's columns: (name, SQL type, kind). Kinds: ``key`` (joined on), ``int``, ``dec``,
#: ``str``, ``date`` (what the grammar may do with it).
SCHEMAS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "nation": (("n_nationkey", "INT", "key"), ("n_name", "STRING", "str"), ("n_region", "INT", "int")),
    "customer": (("c_custkey", "BIGINT", "key"), ("c_nationkey", "INT", "key"), ("c_segment", "STRING", "str"),
                 ("c_acctbal", "DECIMAL(10,2)", "dec")),
    "orders": (("o_orderkey", "BIGINT", "key"), ("o_custkey", "BIGINT", "key"), ("o_status", "STRING", "str"),
               ("o_total", "DECIMAL(10,2)", "dec"), ("o_date", "DATE", "date")),
    "lineitem": (("l_orderkey", "BIGINT", "key"), ("l_linenumber", "INT", "int"), ("l_quantity", "INT", "int"),
                 ("l_price", "DECIMAL(10,2)", "dec"), ("l_flag", "STRING", "str")),
}

#: Key domains: nations 0..4, customers 1..12, orders 1..40 (new ones numbered above).
NATIONS, CUSTOMERS, ORDERS = 5, 12, 40
SEGMENTS, STATUSES, FLAGS = ("AUTO", "BUILD", "FURN"), ("F", "O", "P"), ("A", "N", "R")


def schema_sql(table: str) -> str:
    return ", ".join(f"{name} {type_}" for name, type_, _ in SCHEMAS[table])


@dataclass
class TableSpec:
    """A source's first rows and properties: change data feed and deletion vectors on or off."""

    rows: list[tuple]
    change_feed: bool = True
    deletion_vectors: bool = False


def _maybe(rng: random.Random, value, p: float = 0.08):
    return None if rng.random() < p else value


def random_row(rng: random.Random, table: str, key: int | None = None) -> tuple:
    """A row of ``table``; its first column ``key`` if given (a new order's or line's number)."""
    if table == "nation":
        return (key if key is not None else rng.randrange(NATIONS), _maybe(rng, rng.choice(("ASIA", "EU", "US"))),
                _maybe(rng, rng.randrange(3)))
    if table == "customer":
        return (key if key is not None else _maybe(rng, rng.randint(1, CUSTOMERS), 0.05),
                _maybe(rng, rng.randrange(NATIONS + 1)), _maybe(rng, rng.choice(SEGMENTS)),
                _maybe(rng, Decimal(rng.randint(-500, 5000)) / 100))
    if table == "orders":
        return (key if key is not None else _maybe(rng, rng.randint(1, ORDERS), 0.04),
                _maybe(rng, rng.randint(1, CUSTOMERS + 2)), _maybe(rng, rng.choice(STATUSES)),
                _maybe(rng, Decimal(rng.randint(100, 90000)) / 100),
                _maybe(rng, datetime.date(2024, 1, 1) + datetime.timedelta(days=rng.randrange(60))))
    return (key if key is not None else _maybe(rng, rng.randint(1, ORDERS + 3), 0.04),
            _maybe(rng, rng.randint(1, 4), 0.03), _maybe(rng, rng.randint(1, 10)),
            _maybe(rng, Decimal(rng.randint(100, 20000)) / 100), _maybe(rng, rng.choice(FLAGS)))


def random_tables(rng: random.Random) -> dict[str, TableSpec]:
    """The four sources' first rows (a few hundred in all, some repeated whole) and properties."""
    counts = {"nation": NATIONS + 1, "customer": CUSTOMERS + 2, "orders": ORDERS + 5, "lineitem": 120}
    specs = {}
    for table, n in counts.items():
        if table == "nation":
            rows = [random_row(rng, table, k) for k in range(NATIONS)] + [random_row(rng, table)]
        elif table == "customer":
            rows = [random_row(rng, table, k) for k in range(1, CUSTOMERS + 1)] + [random_row(rng, table)
                                                                                 for _ in range(2)]
        else:
            rows = [random_row(rng, table) for _ in range(n)]
        rows += rng.sample(rows, 2)  # whole-row duplicates
        specs[table] = TableSpec(rows, change_feed=rng.random() < 0.75, deletion_vectors=rng.random() < 0.3)
    return specs


def sql_literal(value) -> str:
    """``value`` as an exact SQL literal (a Decimal as a `BD` literal, never a double)."""
    if value is None:
        return "NULL"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, datetime.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, Decimal):
        return f"{value}BD"
    return str(value)


def values_sql(rows: list[tuple]) -> str:
    """``rows`` as the SQL of a ``VALUES`` list."""
    return ", ".join("(" + ", ".join(sql_literal(v) for v in row) + ")" for row in rows)


def create(spark, table: str, path: str, spec: TableSpec) -> None:
    """The Delta table ``table`` at ``path`` with ``spec``'s properties and rows (one commit)."""
    spark.sql(f"CREATE TABLE delta.`{path}` ({schema_sql(table)}) USING delta TBLPROPERTIES "
              f"(delta.enableChangeDataFeed = {str(spec.change_feed).lower()}, "
              f"delta.enableDeletionVectors = {str(spec.deletion_vectors).lower()})")
    if spec.rows:
        spark.sql(f"INSERT INTO delta.`{path}` VALUES {values_sql(spec.rows)}")
