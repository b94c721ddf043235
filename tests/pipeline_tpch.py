"""A pipeline of six views, two levels of views over views, over small TPC-H-like tables, shared
by the pipeline tests: the folder, random source commits, and the independent computation
(DuckDB over the sources read with delta-rs at the versions a time stands for). With
``python=True`` three more views mix Python and SQL: a Python view over a SQL view and a source,
a SQL view over it, a Python view over that one and a SQL view; DuckDB computes each of them from
SQL written here, not from the functions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import duckdb

from helpers import commit_sql, create_source, insert
from mvsink.check import TimelineReader, table_at
from mvsink.target.read import version_of_time

TABLES = {
    "nation": "n_nationkey BIGINT, n_name STRING",
    "customer": "c_custkey BIGINT, c_name STRING, c_nationkey BIGINT",
    "orders": "o_orderkey BIGINT, o_custkey BIGINT, o_orderstatus STRING, o_totalprice BIGINT",
    "lineitem": "l_orderkey BIGINT, l_linenumber BIGINT, l_quantity BIGINT, l_extendedprice BIGINT, l_returnflag STRING",
}

SILVER = """-- level 0: over the sources
CREATE MATERIALIZED VIEW order_lines KEY (l_orderkey, l_linenumber) AS
SELECT l.l_orderkey, l.l_linenumber, o.o_custkey, l.l_quantity, l.l_extendedprice, l.l_returnflag
FROM lineitem l JOIN orders o ON l.l_orderkey = o.o_orderkey;

CREATE MATERIALIZED VIEW customer_nation KEY (c_custkey) AS
SELECT c.c_custkey, c.c_name, n.n_name FROM customer c JOIN nation n ON c.c_nationkey = n.n_nationkey;

/* open orders; the ';' in this comment ends nothing */
CREATE MATERIALIZED VIEW open_orders KEY (o_orderkey) AS
SELECT o_orderkey, o_custkey, o_totalprice FROM orders WHERE o_orderstatus = 'O'
"""

GOLD = """-- level 1: over views
CREATE MATERIALIZED VIEW customer_revenue KEY (c_custkey) AS
SELECT cn.c_custkey, cn.c_name, cn.n_name, sum(ol.l_extendedprice) AS revenue, count(*) AS line_count
FROM order_lines ol JOIN customer_nation cn ON ol.o_custkey = cn.c_custkey
GROUP BY cn.c_custkey, cn.c_name, cn.n_name;

CREATE MATERIALIZED VIEW returns_by_flag KEY (l_returnflag) AS
SELECT l_returnflag, sum(l_quantity) AS quantity, count(*) AS line_count FROM order_lines GROUP BY l_returnflag;

-- level 2: over a view over views
CREATE MATERIALIZED VIEW nation_revenue KEY (n_name) AS
WITH per_customer AS (SELECT n_name, revenue FROM customer_revenue)
SELECT n_name, sum(revenue) AS revenue, count(*) AS customers FROM per_customer GROUP BY n_name;
"""

PYTHON = """from pyspark.sql import functions as F

from mvsink.pipeline import materialized_view


@materialized_view(name="big_customers", key=("c_custkey",))
def big_customers(customer_revenue, customer):  # a Python view over a SQL view and a source
    return (customer_revenue.where(F.col("revenue") >= 150)
            .join(customer.select("c_custkey", "c_nationkey"), "c_custkey")
            .select("c_custkey", "n_name", "revenue", "c_nationkey"))


@materialized_view(key="n_name")
def big_share(big_by_nation, customer_nation):  # a Python view over a SQL view over a Python view
    everyone = customer_nation.groupBy("n_name").agg(F.count(F.lit(1)).alias("all_customers"))
    return big_by_nation.join(everyone, "n_name").select("n_name", "customers", "all_customers")
"""

PLATINUM = """-- a SQL view over a Python view
CREATE MATERIALIZED VIEW big_by_nation KEY (n_name) AS
SELECT n_name, count(*) AS customers, sum(revenue) AS revenue FROM big_customers GROUP BY n_name
"""

#: The Python views' rows, in SQL for DuckDB.
PYTHON_IN_SQL = {
    "big_customers": "SELECT cr.c_custkey, cr.n_name, cr.revenue, c.c_nationkey FROM customer_revenue cr "
                     "JOIN customer c ON cr.c_custkey = c.c_custkey WHERE cr.revenue >= 150",
    "big_share": "SELECT b.n_name, b.customers, e.all_customers FROM big_by_nation b JOIN "
                 "(SELECT n_name, count(*) AS all_customers FROM customer_nation GROUP BY n_name) e "
                 "ON b.n_name = e.n_name",
}

#: view -> its columns, in dependency order.
VIEWS = {
    "order_lines": ["l_orderkey", "l_linenumber", "o_custkey", "l_quantity", "l_extendedprice", "l_returnflag"],
    "customer_nation": ["c_custkey", "c_name", "n_name"],
    "open_orders": ["o_orderkey", "o_custkey", "o_totalprice"],
    "customer_revenue": ["c_custkey", "c_name", "n_name", "revenue", "line_count"],
    "returns_by_flag": ["l_returnflag", "quantity", "line_count"],
    "nation_revenue": ["n_name", "revenue", "customers"],
}

#: The same with the Python views and the SQL view between them.
MIXED_VIEWS = {
    **VIEWS,
    "big_customers": ["c_custkey", "n_name", "revenue", "c_nationkey"],
    "big_by_nation": ["n_name", "customers", "revenue"],
    "big_share": ["n_name", "customers", "all_customers"],
}


def write_pipeline(spark, root: Path, *, gold: str = GOLD, python: bool = False,
                   tpch_scale: float | None = None) -> dict[str, str]:
    """The sources and the pipeline folder at ``root``; the sources' paths. The sources hold a few
    rows, or with ``tpch_scale`` the TPC-H tables ``tpchgen-cli`` generates at that scale (their
    columns of :data:`TABLES`, prices in whole units)."""
    sources = {name: str(root / "data" / name) for name in TABLES}
    if tpch_scale is not None:
        _tpch_sources(spark, root / "tpch", sources, tpch_scale)
    else:
        create_source(spark, sources["nation"], [(0, "NL"), (1, "FR"), (2, "DE")], TABLES["nation"])
        create_source(spark, sources["customer"], [(i, f"c{i}", i % 3) for i in range(1, 7)], TABLES["customer"])
        create_source(spark, sources["orders"], [(10 + i, 1 + i % 6, "O" if i % 2 else "F", 100 * i)
                                                 for i in range(8)], TABLES["orders"])
        create_source(spark, sources["lineitem"], [(10 + i, j, 1 + i + j, 10 * (i + j), "NRA"[(i + j) % 3])
                                                   for i in range(8) for j in range(1, 3)], TABLES["lineitem"])
    (root / "sql").mkdir(parents=True, exist_ok=True)
    (root / "sql" / "silver.sql").write_text(SILVER)
    (root / "sql" / "gold.sql").write_text(gold)
    if python:
        (root / "sql" / "platinum.sql").write_text(PLATINUM)
        (root / "py").mkdir(exist_ok=True)
        (root / "py" / "big.py").write_text(PYTHON)
    (root / "pipeline.yaml").write_text(
        "sources: {" + ", ".join(f"{n}: data/{n}" for n in TABLES) + "}\n"
        "targets: views\ntimeline: views/_timeline\ndefaults: {trigger_seconds: 0.5}\n")
    return sources


def _tpch_sources(spark, generated: Path, sources: dict[str, str], scale: float) -> None:
    """The four sources from ``tpchgen-cli``'s Parquet files at ``scale``, as Delta tables."""
    import shutil
    import subprocess
    import sys

    cli = shutil.which("tpchgen-cli") or str(Path(sys.executable).parent / "tpchgen-cli")
    subprocess.run([cli, "parquet", "-s", str(scale), "--tables", ",".join(TABLES), "--output-dir", str(generated)],
                   check=True, capture_output=True)
    for name, schema in TABLES.items():
        create_source(spark, sources[name], schema=schema)
        columns = [c.split()[0] for c in schema.split(", ")]
        types = dict(c.split() for c in schema.split(", "))
        (spark.read.parquet(str(generated / f"{name}.parquet"))
         .selectExpr(*(f"CAST({c} AS {types[c]}) AS {c}" for c in columns))
         .write.format("delta").mode("append").save(sources[name]))


#: The first key of new customers and new nations, for the few rows :func:`write_pipeline` writes
#: and for the TPC-H tables (whose keys are below these).
NEW_KEYS = {"few": (7, 3), "tpch": (10_000_000, 1_000)}


def random_commit(spark, sources: dict[str, str], rng, n: int, next_key: list[int], new_keys=NEW_KEYS["few"]) -> None:
    """One commit to one source, chosen at random (new customers and nations from ``new_keys``)."""
    op = rng.choice(["order", "order", "lines", "customer", "rename", "status", "cancel", "drop-lines", "nation"])
    if op == "order":
        key = next_key[0]
        next_key[0] += 1
        insert(spark, sources["orders"], [(key, rng.randint(1, 8), rng.choice("OF"), rng.randint(1, 900))])
        insert(spark, sources["lineitem"], [(key, j, rng.randint(1, 9), rng.randint(1, 300), rng.choice("NRA"))
                                            for j in range(1, rng.randint(2, 4))])
    elif op == "lines":
        insert(spark, sources["lineitem"], [(rng.randint(10, next_key[0]), 10 + n, rng.randint(1, 9),
                                             rng.randint(1, 300), rng.choice("NRA"))])
    elif op == "customer":
        insert(spark, sources["customer"], [(new_keys[0] + n, f"c{new_keys[0] + n}", rng.randint(0, 3))])
    elif op == "rename":
        commit_sql(spark, f"UPDATE delta.`{sources['customer']}` SET c_name = concat(c_name, '+') "
                          f"WHERE c_custkey % 3 = {n % 3}")
    elif op == "status":
        commit_sql(spark, f"UPDATE delta.`{sources['orders']}` SET o_orderstatus = 'F' WHERE o_orderkey % 4 = {n % 4}")
    elif op == "cancel":
        commit_sql(spark, f"DELETE FROM delta.`{sources['orders']}` WHERE o_orderkey % 7 = {n % 7}")
    elif op == "drop-lines":
        commit_sql(spark, f"DELETE FROM delta.`{sources['lineitem']}` WHERE l_linenumber % 3 = {n % 3}")
    else:
        insert(spark, sources["nation"], [(new_keys[1] + n, f"N{n}")])


class Independent:
    """expected(view, t): the view's rows at time ``t``, by DuckDB over the sources at ``t``'s
    versions (read with delta-rs), the views before it created as DuckDB views from the same SQL
    files (only the statements' headers are cut off, by a regex, not by mvsink)."""

    def __init__(self, root: Path, sources: dict[str, str], timeline: str, views: dict[str, list[str]] = VIEWS):
        import re

        self.sources = sources
        self.views = views
        self.timeline = TimelineReader(timeline)
        text = ";\n".join(p.read_text() for p in sorted((root / "sql").glob("*.sql")))
        text = re.sub(r"/\*.*?\*/|--[^\n]*", "", text, flags=re.S)
        self.queries = {}
        for statement in filter(str.strip, text.split(";")):
            found = re.match(r"\s*CREATE MATERIALIZED VIEW (\w+)(?: KEY \([^)]*\))? AS(.*)", statement, re.S | re.I)
            self.queries[found.group(1)] = found.group(2)
        self.queries.update(PYTHON_IN_SQL)
        self._cache: dict[tuple, dict[str, Counter]] = {}

    def at(self, t: int) -> dict[str, Counter]:
        versions = self.timeline.versions(t)
        key = tuple(sorted(versions.items()))
        if key not in self._cache:
            db = duckdb.connect()
            for name, path in self.sources.items():
                db.register(f"{name}_arrow", table_at(path, versions[name]).to_pyarrow_table())
                db.execute(f"CREATE VIEW {name} AS SELECT * FROM {name}_arrow")
            result = {}
            for view, columns in self.views.items():
                db.execute(f"CREATE VIEW {view} AS {self.queries[view]}")
                result[view] = Counter(db.execute(f"SELECT {', '.join(columns)} FROM {view}").fetchall())
            self._cache[key] = result
        return self._cache[key]

    def expected(self, view: str):
        return lambda t: self.at(t)[view]


def view_rows_at(target: str, view: str, t: int) -> Counter:
    """The view's rows at ``t``, as a Delta reader sees them at the version that holds ``t``."""
    columns = MIXED_VIEWS[view]
    data = table_at(target, version_of_time(target, view, t)).to_pyarrow_table(columns=columns)
    return Counter(zip(*(data.column(c).to_pylist() for c in columns)))


def views_agree(targets: dict[str, str], t: int) -> None:
    """The views read from their tables at one time agree with each other."""
    rows = {view: view_rows_at(targets[view], view, t) for view in VIEWS}
    revenue, per_nation = Counter(), Counter()
    for _, _, nation, amount, _ in rows["customer_revenue"].elements():
        revenue[nation] += amount
        per_nation[nation] += 1
    assert rows["nation_revenue"] == Counter((n, revenue[n], per_nation[n]) for n in revenue), t
    assert sum(n for _, _, n in rows["returns_by_flag"].elements()) == sum(rows["order_lines"].values()), t
    lines_per_customer = Counter(row[2] for row in rows["order_lines"].elements())
    customers = {row[0] for row in rows["customer_nation"]}
    assert {(c, n) for c, _, _, _, n in rows["customer_revenue"]} == \
        {(c, n) for c, n in lines_per_customer.items() if c in customers}, t
