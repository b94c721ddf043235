"""Reads of a source after its first, renamed (:mod:`mvsink.desired.occurrences`): which reads are,
and the renamed text means the same query."""

from __future__ import annotations

import pytest

from mvsink.desired.occurrences import split_reads

SOURCES = {"orders": "/data/orders", "Nation": "/data/nation"}


@pytest.mark.parametrize("sql, renamed, extra", [
    ("SELECT * FROM orders o JOIN nation n1 ON o.a = n1.k JOIN `nation` AS n2 ON o.b = n2.k",
     "SELECT * FROM orders o JOIN nation n1 ON o.a = n1.k JOIN `Nation__2` AS n2 ON o.b = n2.k",
     {"Nation__2": "Nation"}),
    ("SELECT orders.id FROM orders JOIN (SELECT id FROM orders WHERE amount > 2) t ON orders.id = t.id",
     "SELECT orders.id FROM orders JOIN (SELECT id FROM `orders__2` AS `orders` WHERE amount > 2) t "
     "ON orders.id = t.id", {"orders__2": "orders"}),
    ("SELECT * FROM orders a WHERE EXISTS (SELECT 1 FROM orders b WHERE b.id = a.id) "
     "AND a.id IN (SELECT id FROM orders c)",
     "SELECT * FROM orders a WHERE EXISTS (SELECT 1 FROM `orders__2` b WHERE b.id = a.id) "
     "AND a.id IN (SELECT id FROM `orders__3` c)", {"orders__2": "orders", "orders__3": "orders"}),
], ids=["aliased", "unaliased", "subqueries"])
def test_each_read_after_the_first_gets_a_name_of_its_own(spark, sql, renamed, extra):
    reads = split_reads(spark, sql, SOURCES)
    assert (reads.sql, reads.extra) == (renamed, extra)
    versions = {"orders": 3, "Nation": 7}
    assert reads.versions(versions) == {**versions, **{name: versions[source] for name, source in extra.items()}}
    assert sorted(reads.declared([*extra, *SOURCES])) == sorted(SOURCES)  # each declared source once


@pytest.mark.parametrize("sql", [
    "SELECT * FROM orders a JOIN nation n ON a.x = n.k",  # each read once
    "WITH orders AS (SELECT 1 AS id) SELECT * FROM orders a JOIN orders b ON a.id = b.id",  # a CTE named like a source
    "WITH t AS (SELECT * FROM orders) SELECT * FROM t a JOIN t b ON a.id = b.id",  # one read in the text
    "SELECT * FROM orders a JOIN db.orders b ON a.id = b.id",  # a name of two parts is no source
    "SELECT * FROM orders a JOIN orders b ON",  # does not parse: its error is the query's own
], ids=["once", "cte-named-like-a-source", "cte-read-twice", "qualified", "no-parse"])
def test_the_query_is_read_as_written(spark, sql):
    reads = split_reads(spark, sql, SOURCES)
    assert (reads.sql, reads.extra) == (sql, {})
