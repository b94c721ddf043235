"""TPC-H views kept by mvsink, overwrite and MERGE: Q1, Q3-like and a rollup of it, Q5, Q10, Q13, and more.

Workload: the tables the ``--query`` reads, from ``tpchgen-cli`` at ``--scale`` (default 1), loaded
into Delta tables (change data feed on), each laid out by its key (``repartitionByRange``: orders
and lineitem by order key, customer, supplier, nation and region by theirs, so each file holds a
range of keys). The views, each keyed by the group-by columns that identify its rows:

* ``q3`` (default): TPC-H Q3 without its segment filter and ``LIMIT``: the revenue of every order
  placed before 1995-03-15 from its lines shipped after it, with the customer's segment, one row
  per order (key ``l_orderkey``);
* ``q3having``: ``q3`` under ``HAVING sum(revenue) > 100000``, with each order's mean revenue per
  line (``sum(revenue) / count(*)``): a linear aggregate under a top (key ``l_orderkey``);
* ``q3max``: ``q3`` with each order's largest line revenue and its count of distinct suppliers
  (``max``, ``count(DISTINCT ...)``: not linear) instead of its revenue: an aggregate of an inner
  join, its changed orders recomputed (orders and lineitem read only there, customer whole; key
  ``l_orderkey``);
* ``q3left``: ``q3max`` over a left join with lineitem, by order: every order placed before the
  date, with its largest line revenue, distinct suppliers and count of lines shipped after it
  (none: nulls and zero); an aggregate of a join with an outer join, recomputed per changed order
  (orders and lineitem read only there, customer whole; key ``o_orderkey``);
* ``q3seg``: a rollup of ``q3``, its revenue and orders per market segment (a linear aggregate of a
  linear aggregate; key ``c_mktsegment``);
* ``q1``: TPC-H Q1 over lineitem (sums, averages and count per return flag and line status; key
  ``l_returnflag, l_linestatus``);
* ``q5``: TPC-H Q5 (the revenue of local suppliers per nation of ASIA over 1994; key ``n_name``);
* ``q10``: TPC-H Q10 (the revenue lost to returns per customer over 1993's last quarter; key
  ``c_custkey``);
* ``q13``: the inner query of TPC-H Q13, every customer's count of orders (a left outer join, zero
  for none; key ``c_custkey``): a linear aggregate over an outer join (the inner join's terms and
  the changed customers padded; orders not read);
* ``q13dist``: TPC-H Q13 itself, without its ``ORDER BY``: how many customers have each count of
  orders (an aggregate over ``q13``; key ``c_count``): a rollup, both linear aggregates moved by the change;
* ``q7``: TPC-H Q7 (the volume shipped between France and Germany per year, nation read twice;
  key ``supp_nation, cust_nation, l_year``);
* ``q8``: TPC-H Q8 (Brazil's market share in America per year, nation read twice, an expression of
  two sums; key ``o_year``);
* ``q9``: TPC-H Q9 (the profit on parts whose name holds "green", per nation and year; six
  sources; key ``nation, o_year``);
* ``q6``: TPC-H Q6, one sum over a year of lineitem (no ``GROUP BY``: one row, no key);
* ``q14``: TPC-H Q14, the promotions' share of a month's revenue (lineitem joined with part, an
  expression of two sums, no ``GROUP BY``: one row, no key);
* ``lines``: per order, its lines' highest price, first ship date and distinct suppliers (min, max,
  ``count(DISTINCT ...)`` over lineitem; key ``l_orderkey``): recomputed per group;
* ``latest``: each order's last shipped line (``row_number() OVER (PARTITION BY l_orderkey ORDER
  BY l_shipdate DESC, l_linenumber) = 1``, the dedup of a Delta pipeline; key ``l_orderkey``): a
  window by key, recomputed for the changed orders by the operators;
* ``custorders``: a view over an aggregate view, every customer with its orders' count, last date
  and largest total (customer left joined with an aggregate of orders by customer; key
  ``c_custkey``): a key join, recomputed per key.

None has an ``ORDER BY`` or ``LIMIT``. Each round applies refreshes in the spirit of TPC-H's:
``--new-fraction`` of the orders (0.1%) come in as new orders (copies of existing ones with new
keys above the largest, with their lineitems), and ``--delete-fraction`` of the orders (0.1%), the
oldest by key, go with their lineitems (``--changed-orders N``: N of each, at any scale); only
orders and lineitem where the query reads them. Then, in the same run, each contender brings its
table up to date:

* mvsink: a :class:`MaterializedView` over the sources (its strategy is printed; the step's
  phases and the other sides' files read are printed per round);
* overwrite: the query written over its own target with mode ``overwrite``;
* MERGE-sync: ``MERGE`` of the query into its own target on the view's key, with update (where a
  column differs), insert and ``WHEN NOT MATCHED BY SOURCE DELETE``;
* the query alone: the query run to a ``noop`` sink (what any full recomputation costs at least).

At the end the three targets and the query are compared through an order-independent hash, so no
contender is timed doing the wrong thing.

With ``--string-keys``, the order and customer keys (``o_orderkey``, ``l_orderkey``, ``o_custkey``,
``c_custkey``) are loaded as strings of 12 digits, zero-padded (their order is the numbers'), as
tables keyed by identifiers rather than numbers are: the joins and the view's key are on strings.

With ``--spark-work``, each mvsink round's Spark work is printed at the end, read from Spark's event
log (:mod:`spark_work`: its jobs, the time none ran, its SQL executions by kind).

Run: ``python benchmarks/bench_tpch.py [--query q3|q3having|q3max|q3left|q3seg|q1|q5|q6|q7|q8|q9|q10|q13|q13dist|q14|lines|latest|custorders]
[--scale 1] [--rounds 5] [--changed-orders N] [--moved-customers 0.001] [--string-keys] [--spark-work]`` (``pip install -e '.[bench]'`` for ``tpchgen-cli``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_sink import WORKDIR_HELP, fingerprint, machine, percentile, work_directory  # noqa: E402
from spark_work import event_log_conf, summaries  # noqa: E402

#: Each view: its SQL, its key (the group-by columns that identify a row) and the tables it reads.
QUERIES = {
    "q3": ("""
SELECT l_orderkey, c_mktsegment, o_orderdate, o_shippriority, sum(revenue) AS revenue FROM (
  SELECT l.l_orderkey, c.c_mktsegment, o.o_orderdate, o.o_shippriority,
         l.l_extendedprice * (1 - l.l_discount) AS revenue
  FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey JOIN lineitem l ON l.l_orderkey = o.o_orderkey
  WHERE o.o_orderdate < DATE '1995-03-15' AND l.l_shipdate > DATE '1995-03-15')
GROUP BY l_orderkey, c_mktsegment, o_orderdate, o_shippriority
""", ("l_orderkey",), ("customer", "orders", "lineitem")),
    "q1": ("""
SELECT l_returnflag, l_linestatus, sum(l_quantity) AS sum_qty, sum(l_extendedprice) AS sum_base_price,
       sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       avg(l_quantity) AS avg_qty, avg(l_extendedprice) AS avg_price, avg(l_discount) AS avg_disc,
       count(*) AS count_order
FROM lineitem WHERE l_shipdate <= DATE '1998-09-02'
GROUP BY l_returnflag, l_linestatus
""", ("l_returnflag", "l_linestatus"), ("lineitem",)),
    "q5": ("""
SELECT n_name, sum(l_extendedprice * (1 - l_discount)) AS revenue
FROM customer, orders, lineitem, supplier, nation, region
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND l_suppkey = s_suppkey AND c_nationkey = s_nationkey
  AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'ASIA'
  AND o_orderdate >= DATE '1994-01-01' AND o_orderdate < DATE '1995-01-01'
GROUP BY n_name
""", ("n_name",), ("customer", "orders", "lineitem", "supplier", "nation", "region")),
    "q10": ("""
SELECT c_custkey, c_name, sum(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, c_address,
       c_phone, c_comment
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01'
  AND o_orderdate < DATE '1994-01-01' AND l_returnflag = 'R' AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment
""", ("c_custkey",), ("customer", "orders", "lineitem", "nation")),
    "q13": ("""
SELECT c_custkey, count(o_orderkey) AS c_count
FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
GROUP BY c_custkey
""", ("c_custkey",), ("customer", "orders")),
    "q13dist": ("""
SELECT c_count, count(*) AS custdist FROM (
  SELECT c_custkey, count(o_orderkey) AS c_count
  FROM customer LEFT OUTER JOIN orders ON c_custkey = o_custkey AND o_comment NOT LIKE '%special%requests%'
  GROUP BY c_custkey)
GROUP BY c_count
""", ("c_count",), ("customer", "orders")),
    "lines": ("""
SELECT l_orderkey, max(l_extendedprice) AS top_price, min(l_shipdate) AS first_ship,
       count(DISTINCT l_suppkey) AS suppliers
FROM lineitem GROUP BY l_orderkey
""", ("l_orderkey",), ("lineitem",)),
    "custorders": ("""
SELECT c_custkey, c_name, c_mktsegment, coalesce(o.orders, 0) AS orders, o.last_order, o.largest
FROM customer LEFT JOIN (SELECT o_custkey, count(*) AS orders, max(o_orderdate) AS last_order,
                                max(o_totalprice) AS largest FROM orders GROUP BY o_custkey) o
  ON c_custkey = o.o_custkey
""", ("c_custkey",), ("customer", "orders")),
    "latest": ("""
SELECT l_orderkey, l_linenumber, l_shipdate, l_extendedprice FROM (
  SELECT *, row_number() OVER (PARTITION BY l_orderkey ORDER BY l_shipdate DESC, l_linenumber) AS rn
  FROM lineitem)
WHERE rn = 1
""", ("l_orderkey",), ("lineitem",)),
}
#: TPC-H Q6: one sum over lineitem, no GROUP BY (one row; no key).
QUERIES["q6"] = ("""
SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
WHERE l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'
  AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24
""", (), ("lineitem",))
#: TPC-H Q14: the promotions' share of a month's revenue, over lineitem joined with part, no GROUP
#: BY (an expression of two sums: a linear aggregate under a top; one row, no key).
QUERIES["q14"] = ("""
SELECT 100.00 * sum(CASE WHEN p_type LIKE 'PROMO%' THEN l_extendedprice * (1 - l_discount) ELSE 0 END)
       / sum(l_extendedprice * (1 - l_discount)) AS promo_revenue
FROM lineitem JOIN part ON l_partkey = p_partkey
WHERE l_shipdate >= DATE '1995-09-01' AND l_shipdate < DATE '1995-10-01'
""", (), ("lineitem", "part"))
#: TPC-H Q7: the volume shipped between two nations per year, nation read twice (the supplier's and
#: the customer's: each read a source of its own, :mod:`mvsink.desired.occurrences`).
QUERIES["q7"] = ("""
SELECT supp_nation, cust_nation, l_year, sum(volume) AS revenue
FROM (
  SELECT n1.n_name AS supp_nation, n2.n_name AS cust_nation, year(l_shipdate) AS l_year,
         l_extendedprice * (1 - l_discount) AS volume
  FROM supplier, lineitem, orders, customer, nation n1, nation n2
  WHERE s_suppkey = l_suppkey AND o_orderkey = l_orderkey AND c_custkey = o_custkey
    AND s_nationkey = n1.n_nationkey AND c_nationkey = n2.n_nationkey
    AND ((n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE'))
    AND l_shipdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31'
) shipping
GROUP BY supp_nation, cust_nation, l_year
""", ("supp_nation", "cust_nation", "l_year"), ("supplier", "lineitem", "orders", "customer", "nation"))
#: TPC-H Q8: a nation's market share per year within a region (nation read twice; an expression of
#: two sums: a linear aggregate under a top).
QUERIES["q8"] = ("""
SELECT o_year, sum(CASE WHEN nation = 'BRAZIL' THEN volume ELSE 0 END) / sum(volume) AS mkt_share
FROM (
  SELECT year(o_orderdate) AS o_year, l_extendedprice * (1 - l_discount) AS volume, n2.n_name AS nation
  FROM part, supplier, lineitem, orders, customer, nation n1, nation n2, region
  WHERE p_partkey = l_partkey AND s_suppkey = l_suppkey AND l_orderkey = o_orderkey
    AND o_custkey = c_custkey AND c_nationkey = n1.n_nationkey AND n1.n_regionkey = r_regionkey
    AND r_name = 'AMERICA' AND s_nationkey = n2.n_nationkey
    AND o_orderdate BETWEEN DATE '1995-01-01' AND DATE '1996-12-31' AND p_type = 'ECONOMY ANODIZED STEEL'
) all_nations
GROUP BY o_year
""", ("o_year",), ("part", "supplier", "lineitem", "orders", "customer", "nation", "region"))
#: TPC-H Q9: the profit on a line of parts per nation and year (six sources, ``LIKE``, ``year()``).
QUERIES["q9"] = ("""
SELECT nation, o_year, sum(amount) AS sum_profit
FROM (
  SELECT n_name AS nation, year(o_orderdate) AS o_year,
         l_extendedprice * (1 - l_discount) - ps_supplycost * l_quantity AS amount
  FROM part, supplier, lineitem, partsupp, orders, nation
  WHERE s_suppkey = l_suppkey AND ps_suppkey = l_suppkey AND ps_partkey = l_partkey AND p_partkey = l_partkey
    AND o_orderkey = l_orderkey AND s_nationkey = n_nationkey AND p_name LIKE '%green%'
) profit
GROUP BY nation, o_year
""", ("nation", "o_year"), ("part", "supplier", "lineitem", "partsupp", "orders", "nation"))
#: A rollup (a view over a view): Q3's per-order revenue, summed per market segment.
QUERIES["q3seg"] = (f"SELECT c_mktsegment, sum(revenue) AS revenue, count(*) AS orders FROM ({QUERIES['q3'][0]}) "
                    "GROUP BY c_mktsegment", ("c_mktsegment",), QUERIES["q3"][2])
#: Q3 under HAVING, with an expression of its aggregates: the orders whose revenue passes 100,000,
#: with their mean revenue per line (a linear aggregate under a top).
QUERIES["q3having"] = (QUERIES["q3"][0].replace(
    "sum(revenue) AS revenue FROM", "sum(revenue) AS revenue, sum(revenue) / count(*) AS line_revenue FROM")
    + "HAVING sum(revenue) > 100000\n", ("l_orderkey",), QUERIES["q3"][2])
#: Q3 with aggregates that are not linear: per order, its largest line revenue and its distinct suppliers.
QUERIES["q3max"] = (QUERIES["q3"][0].replace("sum(revenue) AS revenue FROM", "max(revenue) AS top_line, "
                                             "count(DISTINCT l_suppkey) AS suppliers FROM")
                    .replace("l.l_extendedprice * (1 - l.l_discount) AS revenue",
                             "l.l_suppkey, l.l_extendedprice * (1 - l.l_discount) AS revenue"),
                    ("l_orderkey",), QUERIES["q3"][2])
#: Q3max over a left join with lineitem: every order placed before the date, with its lines shipped
#: after it (none: a row of nulls and zero lines), by order (orders and lineitem read only for the
#: changed orders, customer whole).
QUERIES["q3left"] = ("""
SELECT o.o_orderkey, c.c_mktsegment, o.o_orderdate, o.o_shippriority,
       max(l.l_extendedprice * (1 - l.l_discount)) AS top_line, count(DISTINCT l.l_suppkey) AS suppliers,
       count(l.l_linenumber) AS lines
FROM customer c JOIN orders o ON c.c_custkey = o.o_custkey
  LEFT JOIN lineitem l ON l.l_orderkey = o.o_orderkey AND l.l_shipdate > DATE '1995-03-15'
WHERE o.o_orderdate < DATE '1995-03-15'
GROUP BY o.o_orderkey, c.c_mktsegment, o.o_orderdate, o.o_shippriority
""", ("o_orderkey",), QUERIES["q3"][2])
#: The rest of TPC-H's 22 queries, as the specification writes them (its substitution parameters'
#: validation values), without ``ORDER BY`` and ``LIMIT``; each keyed by the columns that identify
#: its rows. Q15's view ``revenue0`` is a CTE.
QUERIES["q2"] = ("""
SELECT s_acctbal, s_name, n_name, p_partkey, p_mfgr, s_address, s_phone, s_comment
FROM part, supplier, partsupp, nation, region
WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND p_size = 15 AND p_type LIKE '%BRASS'
  AND s_nationkey = n_nationkey AND n_regionkey = r_regionkey AND r_name = 'EUROPE'
  AND ps_supplycost = (SELECT min(ps_supplycost) FROM partsupp, supplier, nation, region
                       WHERE p_partkey = ps_partkey AND s_suppkey = ps_suppkey AND s_nationkey = n_nationkey
                         AND n_regionkey = r_regionkey AND r_name = 'EUROPE')
""", ("p_partkey", "s_name"), ("part", "supplier", "partsupp", "nation", "region"))
QUERIES["q4"] = ("""
SELECT o_orderpriority, count(*) AS order_count FROM orders
WHERE o_orderdate >= DATE '1993-07-01' AND o_orderdate < DATE '1993-10-01'
  AND EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND l_commitdate < l_receiptdate)
GROUP BY o_orderpriority
""", ("o_orderpriority",), ("orders", "lineitem"))
QUERIES["q11"] = ("""
SELECT ps_partkey, sum(ps_supplycost * ps_availqty) AS value
FROM partsupp, supplier, nation
WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey AND n_name = 'GERMANY'
GROUP BY ps_partkey
HAVING sum(ps_supplycost * ps_availqty) > (SELECT sum(ps_supplycost * ps_availqty) * 0.0001
                                           FROM partsupp, supplier, nation
                                           WHERE ps_suppkey = s_suppkey AND s_nationkey = n_nationkey
                                             AND n_name = 'GERMANY')
""", ("ps_partkey",), ("partsupp", "supplier", "nation"))
QUERIES["q12"] = ("""
SELECT l_shipmode,
       sum(CASE WHEN o_orderpriority = '1-URGENT' OR o_orderpriority = '2-HIGH' THEN 1 ELSE 0 END) AS high_line_count,
       sum(CASE WHEN o_orderpriority <> '1-URGENT' AND o_orderpriority <> '2-HIGH' THEN 1 ELSE 0 END) AS low_line_count
FROM orders, lineitem
WHERE o_orderkey = l_orderkey AND l_shipmode IN ('MAIL', 'SHIP') AND l_commitdate < l_receiptdate
  AND l_shipdate < l_commitdate AND l_receiptdate >= DATE '1994-01-01' AND l_receiptdate < DATE '1995-01-01'
GROUP BY l_shipmode
""", ("l_shipmode",), ("orders", "lineitem"))
QUERIES["q15"] = ("""
WITH revenue0 AS (
  SELECT l_suppkey AS supplier_no, sum(l_extendedprice * (1 - l_discount)) AS total_revenue FROM lineitem
  WHERE l_shipdate >= DATE '1996-01-01' AND l_shipdate < DATE '1996-04-01' GROUP BY l_suppkey)
SELECT s_suppkey, s_name, s_address, s_phone, total_revenue FROM supplier, revenue0
WHERE s_suppkey = supplier_no AND total_revenue = (SELECT max(total_revenue) FROM revenue0)
""", ("s_suppkey",), ("supplier", "lineitem"))
QUERIES["q16"] = ("""
SELECT p_brand, p_type, p_size, count(DISTINCT ps_suppkey) AS supplier_cnt
FROM partsupp, part
WHERE p_partkey = ps_partkey AND p_brand <> 'Brand#45' AND p_type NOT LIKE 'MEDIUM POLISHED%'
  AND p_size IN (49, 14, 23, 45, 19, 3, 36, 9)
  AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%Customer%Complaints%')
GROUP BY p_brand, p_type, p_size
""", ("p_brand", "p_type", "p_size"), ("partsupp", "part", "supplier"))
QUERIES["q17"] = ("""
SELECT sum(l_extendedprice) / 7.0 AS avg_yearly FROM lineitem, part
WHERE p_partkey = l_partkey AND p_brand = 'Brand#23' AND p_container = 'MED BOX'
  AND l_quantity < (SELECT 0.2 * avg(l_quantity) FROM lineitem WHERE l_partkey = p_partkey)
""", (), ("lineitem", "part"))
QUERIES["q18"] = ("""
SELECT c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice, sum(l_quantity) AS quantity
FROM customer, orders, lineitem
WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem GROUP BY l_orderkey HAVING sum(l_quantity) > 300)
  AND c_custkey = o_custkey AND o_orderkey = l_orderkey
GROUP BY c_name, c_custkey, o_orderkey, o_orderdate, o_totalprice
""", ("o_orderkey",), ("customer", "orders", "lineitem"))
QUERIES["q19"] = ("""
SELECT sum(l_extendedprice * (1 - l_discount)) AS revenue FROM lineitem, part
WHERE (p_partkey = l_partkey AND p_brand = 'Brand#12' AND p_container IN ('SM CASE', 'SM BOX', 'SM PACK', 'SM PKG')
       AND l_quantity >= 1 AND l_quantity <= 11 AND p_size BETWEEN 1 AND 5 AND l_shipmode IN ('AIR', 'AIR REG')
       AND l_shipinstruct = 'DELIVER IN PERSON')
   OR (p_partkey = l_partkey AND p_brand = 'Brand#23'
       AND p_container IN ('MED BAG', 'MED BOX', 'MED PKG', 'MED PACK') AND l_quantity >= 10 AND l_quantity <= 20
       AND p_size BETWEEN 1 AND 10 AND l_shipmode IN ('AIR', 'AIR REG') AND l_shipinstruct = 'DELIVER IN PERSON')
   OR (p_partkey = l_partkey AND p_brand = 'Brand#34' AND p_container IN ('LG CASE', 'LG BOX', 'LG PACK', 'LG PKG')
       AND l_quantity >= 20 AND l_quantity <= 30 AND p_size BETWEEN 1 AND 15 AND l_shipmode IN ('AIR', 'AIR REG')
       AND l_shipinstruct = 'DELIVER IN PERSON')
""", (), ("lineitem", "part"))
QUERIES["q20"] = ("""
SELECT s_name, s_address FROM supplier, nation
WHERE s_suppkey IN (
    SELECT ps_suppkey FROM partsupp
    WHERE ps_partkey IN (SELECT p_partkey FROM part WHERE p_name LIKE 'forest%')
      AND ps_availqty > (SELECT 0.5 * sum(l_quantity) FROM lineitem
                         WHERE l_partkey = ps_partkey AND l_suppkey = ps_suppkey
                           AND l_shipdate >= DATE '1994-01-01' AND l_shipdate < DATE '1995-01-01'))
  AND s_nationkey = n_nationkey AND n_name = 'CANADA'
""", ("s_name",), ("supplier", "nation", "partsupp", "part", "lineitem"))
QUERIES["q21"] = ("""
SELECT s_name, count(*) AS numwait FROM supplier, lineitem l1, orders, nation
WHERE s_suppkey = l1.l_suppkey AND o_orderkey = l1.l_orderkey AND o_orderstatus = 'F'
  AND l1.l_receiptdate > l1.l_commitdate
  AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey AND l2.l_suppkey <> l1.l_suppkey)
  AND NOT EXISTS (SELECT * FROM lineitem l3 WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_suppkey <> l1.l_suppkey
                  AND l3.l_receiptdate > l3.l_commitdate)
  AND s_nationkey = n_nationkey AND n_name = 'SAUDI ARABIA'
GROUP BY s_name
""", ("s_name",), ("supplier", "lineitem", "orders", "nation"))
QUERIES["q22"] = ("""
SELECT cntrycode, count(*) AS numcust, sum(c_acctbal) AS totacctbal FROM (
  SELECT substring(c_phone, 1, 2) AS cntrycode, c_acctbal FROM customer
  WHERE substring(c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17')
    AND c_acctbal > (SELECT avg(c_acctbal) FROM customer
                     WHERE c_acctbal > 0.00 AND substring(c_phone, 1, 2) IN ('13', '31', '23', '29', '30', '18', '17'))
    AND NOT EXISTS (SELECT * FROM orders WHERE o_custkey = c_custkey)) AS custsale
GROUP BY cntrycode
""", ("cntrycode",), ("customer", "orders"))
#: Each table's key, and its files per scale factor 1 (at least 1).
TABLES = {"customer": ("c_custkey", 2), "orders": ("o_orderkey", 16), "lineitem": ("l_orderkey", 48),
          "supplier": ("s_suppkey", 1), "nation": ("n_nationkey", 1), "region": ("r_regionkey", 1),
          "part": ("p_partkey", 2), "partsupp": ("ps_partkey", 8)}


#: The keys ``--string-keys`` loads as strings.
STRING_KEYS = ("o_orderkey", "l_orderkey", "o_custkey", "c_custkey")


def as_key_string(number):
    """A key column as ``--string-keys`` has it: 12 digits, zero-padded (ordered as the numbers)."""
    from pyspark.sql import functions as F
    return F.lpad(number.cast("string"), 12, "0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--query", choices=sorted(QUERIES), default="q3", help="the view (default q3)")
    parser.add_argument("--scale", type=float, default=1.0, help="TPC-H scale factor (default 1; 0.1 for a quick run)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--new-fraction", type=float, default=0.001, help="orders added per round (default 0.1%%)")
    parser.add_argument("--delete-fraction", type=float, default=0.001,
                        help="orders deleted per round, the oldest (default 0.1%%)")
    parser.add_argument("--moved-customers", type=float, default=0.0,
                        help="customers moved to another market segment per round, where the query reads customer "
                             "(default 0; TPC-H's refreshes do not; 0.001 for 0.1%%)")
    parser.add_argument("--changed-orders", type=int, default=None,
                        help="orders added and orders deleted per round (overrides both fractions)")
    parser.add_argument("--refresh", choices=("auto", "incremental", "full"), default="auto",
                        help="mvsink's refresh policy (default auto)")
    parser.add_argument("--also-full", action="store_true",
                        help="also keep the view with refresh full, timed in the same rounds: where full "
                             "evaluation becomes cheaper than the sources' changes")
    parser.add_argument("--string-keys", action="store_true",
                        help="load the order and customer keys as zero-padded strings (joins and the key on strings)")
    parser.add_argument("--spark-work", action="store_true",
                        help="print where each mvsink round's time went in Spark (from Spark's event log)")
    parser.add_argument("--workdir", default=None, help=WORKDIR_HELP)
    args = parser.parse_args()
    with work_directory(args.workdir, "tpch") as workdir:
        return run(args, workdir)


def generate(scale: float, tables: tuple[str, ...], directory: str) -> None:
    """``tables`` as Parquet files from ``tpchgen-cli``."""
    cli = shutil.which("tpchgen-cli") or os.path.join(os.path.dirname(sys.executable), "tpchgen-cli")
    if not os.path.exists(cli):
        raise SystemExit("tpchgen-cli not found: pip install -e '.[bench]'")
    subprocess.run([cli, "parquet", "-s", str(scale), "--tables", ",".join(tables), "--output-dir", directory],
                   check=True)


def load(spark, scale: float, tables: tuple[str, ...], workdir: str, string_keys: bool, query: str
         ) -> tuple[dict[str, str], dict[str, int]]:
    """``tables`` at ``scale`` generated and loaded into Delta tables under ``workdir`` (change data
    feed on, laid out by key: see the module doc); their paths and row counts, printed."""
    from pyspark.sql import functions as F

    raw = os.path.join(workdir, "raw")
    started = time.monotonic()
    generate(scale, tables, raw)
    generated = time.monotonic() - started
    sources = {name: os.path.join(workdir, name) for name in tables}
    started = time.monotonic()
    for name in tables:
        column, files = TABLES[name]
        rows = spark.read.parquet(os.path.join(raw, f"{name}.parquet"))
        if string_keys:
            rows = rows.select(*(as_key_string(F.col(c)).alias(c) if c in STRING_KEYS else c for c in rows.columns))
        (rows.repartitionByRange(max(1, int(files * scale)), column).sortWithinPartitions(column)
         .write.format("delta").option("delta.enableChangeDataFeed", "true")
         .option("delta.enableDeletionVectors", "false").save(sources[name]))
    loaded = time.monotonic() - started
    sizes = {name: spark.read.format("delta").load(path).count() for name, path in sources.items()}
    print(f"TPC-H scale {scale}, {query}: {', '.join(f'{n} {c:,} rows' for n, c in sizes.items())} "
          f"(generated in {generated:.1f}s, loaded into Delta in {loaded:.1f}s)", flush=True)
    return sources, sizes


def refresh(spark, sources: dict[str, str], round_: int, new_orders: int, deleted_orders: int,
            orders_count: int, moved_customers: float = 0.0) -> int:
    """One round of refreshes: ``new_orders`` orders copied (spread over the key space) with keys
    above the largest, with their lineitems; the ``deleted_orders`` oldest orders deleted with
    theirs. Only the loaded ones of orders and lineitem are changed (their order keys from
    orders, else from lineitem). With ``moved_customers``, that fraction of the customers (spread
    over the key space), if loaded, move to the next market segment, in one commit. Returns the
    largest order key deleted (a string with ``--string-keys``)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    tables = {name: spark.read.format("delta").load(sources[name])
              for name in ("orders", "lineitem") if name in sources}
    keys = (tables["orders"].select("o_orderkey") if "orders" in tables
            else tables["lineitem"].select(F.col("l_orderkey").alias("o_orderkey")).distinct())
    top = keys.agg(F.max("o_orderkey")).first()[0]
    strings = isinstance(keys.schema["o_orderkey"].dataType, T.StringType)  # --string-keys

    def moved(column: str):  # a key plus the largest, in the key's type
        moved = F.col(column).cast("long") + F.lit(int(top))
        return as_key_string(moved) if strings else moved

    picked = keys.where(F.pmod(F.xxhash64("o_orderkey", F.lit(round_)), F.lit(max(1, orders_count // new_orders))) == 0)
    picked = picked.limit(new_orders).localCheckpoint()
    if "orders" in tables:
        (tables["orders"].join(picked, "o_orderkey", "left_semi").withColumn("o_orderkey", moved("o_orderkey"))
         .write.format("delta").mode("append").save(sources["orders"]))
    if "lineitem" in tables:
        lineitem = tables["lineitem"]
        (lineitem.join(picked.select(F.col("o_orderkey").alias("l_orderkey")), "l_orderkey", "left_semi")
         .withColumn("l_orderkey", moved("l_orderkey")).select(*lineitem.columns)
         .write.format("delta").mode("append").save(sources["lineitem"]))
    oldest = keys.orderBy("o_orderkey").limit(deleted_orders).agg(F.max("o_orderkey")).first()[0]
    for name, column in (("orders", "o_orderkey"), ("lineitem", "l_orderkey")):
        if name in tables:
            spark.sql(f"DELETE FROM delta.`{sources[name]}` WHERE {column} <= {oldest!r}")
    if moved_customers and "customer" in sources:
        segments = ["AUTOMOBILE", "BUILDING", "FURNITURE", "HOUSEHOLD", "MACHINERY"]
        following = " ".join(f"WHEN '{a}' THEN '{b}'" for a, b in zip(segments, segments[1:] + segments[:1]))
        spark.sql(f"UPDATE delta.`{sources['customer']}` SET c_mktsegment = CASE c_mktsegment {following} END "
                  f"WHERE pmod(xxhash64(c_custkey, {round_}), {max(1, round(1 / moved_customers))}) = 0")
    return oldest


def run(args, workdir: str) -> int:
    from delta.tables import DeltaTable

    from mvsink import MaterializedView, SnapshotInput, ViewDefinition
    from mvsink.target.read import read_view
    from mvsink.spark import spark_session

    sql, key, tables = QUERIES[args.query]
    event_log = os.path.join(workdir, "event-log")
    if args.spark_work:
        os.makedirs(event_log)
    spark = spark_session("mvsink-bench-tpch", event_log_conf(event_log) if args.spark_work else None)
    sources, sizes = load(spark, args.scale, tables, workdir, args.string_keys, args.query)

    def query():
        session = spark.newSession()
        for name, path in sources.items():
            session.read.format("delta").load(path).createOrReplaceTempView(name)
        return session.sql(sql)

    columns = query().columns
    targets = {name: os.path.join(workdir, name) for name in ("view", "view_full", "overwrite", "merge")}

    def kept_view(target: str, refresh: str) -> MaterializedView:
        return MaterializedView(spark, ViewDefinition(args.query, targets[target], SnapshotInput(sql=sql, refresh=refresh),
                                                      key=key, sources=sources, replica_id="bench"))

    views = {"mvsink": kept_view("view", args.refresh)}
    if args.also_full:
        views["mvsink, full"] = kept_view("view_full", "full")
    view = views["mvsink"]
    started = time.monotonic()
    view.run_until_caught_up()
    hydration = {"mvsink": time.monotonic() - started}
    for each in list(views.values())[1:]:
        each.run_until_caught_up()
    started = time.monotonic()
    query().write.format("delta").save(targets["overwrite"])
    hydration["overwrite"] = time.monotonic() - started
    started = time.monotonic()
    query().write.format("delta").save(targets["merge"])
    hydration["MERGE"] = time.monotonic() - started
    view_rows = spark.read.format("delta").load(targets["overwrite"]).count()
    print(f"view: {view_rows:,} rows; first load mvsink {hydration['mvsink']:.1f}s, overwrite "
          f"{hydration['overwrite']:.1f}s, MERGE target {hydration['MERGE']:.1f}s", flush=True)

    def overwrite():
        query().write.format("delta").mode("overwrite").save(targets["overwrite"])

    matched = " AND ".join(f"t.{c} = s.{c}" for c in key) or "true"  # no key: a view of one row
    changed = " OR ".join(f"NOT (t.{c} <=> s.{c})" for c in columns if c not in key)

    def merge():
        (DeltaTable.forPath(spark, targets["merge"]).alias("t").merge(query().alias("s"), matched)
         .whenMatchedUpdateAll(condition=changed).whenNotMatchedInsertAll().whenNotMatchedBySourceDelete()
         .execute())

    def query_alone():
        query().write.format("noop").mode("overwrite").save()

    orders_count = (sizes["orders"] if "orders" in sizes
                    else spark.read.format("delta").load(sources["lineitem"]).select("l_orderkey").distinct().count())
    new_orders = args.changed_orders or max(1, int(orders_count * args.new_fraction))
    deleted_orders = args.changed_orders or max(1, int(orders_count * args.delete_fraction))
    times = {name: [] for name in [*views, "overwrite", "MERGE", "query alone"]}
    contenders = {"overwrite": overwrite, "MERGE": merge, "query alone": query_alone}
    strategies, stretches = set(), []  # stretches: each round's mvsink steps, wall clock
    for round_ in range(1, args.rounds + 1):
        oldest = refresh(spark, sources, round_, new_orders, deleted_orders, orders_count, args.moved_customers)
        phases_then = dict(view.metrics.phase_seconds)
        steps = {}  # the views take turns going first (the first reads the new source versions' logs)
        for name, each in sorted(views.items(), key=lambda item: item[0] == "mvsink", reverse=round_ % 2 == 1):
            started, wall = time.monotonic(), time.time()
            steps[name] = caught_up(each)
            times[name].append(time.monotonic() - started)
            if name == "mvsink":
                stretches.append((wall, time.time()))
        reports = steps["mvsink"]
        strategies.update(r.strategy for r in reports if r.strategy)
        phases = ", ".join(f"{p} {s - phases_then.get(p, 0.0):.2f}s" for p, s in view.metrics.phase_seconds.items()
                           if s - phases_then.get(p, 0.0) >= 0.005)
        reads = ", ".join(str(r) for report in reports for r in report.reads)
        for name, contender in contenders.items():
            started = time.monotonic()
            contender()
            times[name].append(time.monotonic() - started)
        print(f"round {round_}: +{new_orders:,} orders, -{deleted_orders:,} orders (keys <= {oldest if isinstance(oldest, str) else f'{oldest:,}'}); "
              + ", ".join(f"{n} {t[-1]:.2f}s" for n, t in times.items())
              + f"\n  mvsink by {', '.join((r.strategy or '-') + (f' ({r.in_process} in process)' if r.in_process else '') for r in reports)} ({len(reports)} steps"
              + "".join(f", change {r.change_share:.2%} of the sources" for r in reports if r.change_share is not None)
              + f"): {phases}"
              + f"\n  mvsink read: {reads or 'no Delta scan'}", flush=True)

    hashes = {name: fingerprint(read_view(spark, each.view.target, args.query), columns)
              for name, each in views.items()}
    hashes |= {"overwrite": fingerprint(spark.read.format("delta").load(targets["overwrite"]), columns),
               "MERGE": fingerprint(spark.read.format("delta").load(targets["merge"]), columns),
               "query": fingerprint(query(), columns)}
    same = len({tuple(h) for h in hashes.values()}) == 1
    print(f"\n=== TPC-H {args.query} view: mvsink vs overwrite vs MERGE-sync vs the query alone ===")
    print(f"machine: {machine()}; load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    print(f"workload: scale {args.scale}, view {view_rows:,} rows, {args.rounds} rounds of +{new_orders:,} "
          f"orders and -{deleted_orders:,} orders with their lineitems"
          f"{f', {args.moved_customers:.2%} of customers moved segment' if args.moved_customers else ''}"
          f"{'; order and customer keys as strings' if args.string_keys else ''}; "
          f"mvsink strategy: {', '.join(sorted(strategies))}")
    for name, values in times.items():
        print(f"{name:13} p50 {percentile(values, 0.5):6.2f}s  p90 {percentile(values, 0.9):6.2f}s  "
              f"mean {statistics.mean(values):6.2f}s")
    for name in [*list(views)[1:], "overwrite", "MERGE", "query alone"]:
        print(f"ratio {name} / mvsink: p50 {percentile(times[name], 0.5) / percentile(times['mvsink'], 0.5):.2f}x, "
              f"p90 {percentile(times[name], 0.9) / percentile(times['mvsink'], 0.9):.2f}x")
    print(f"final contents identical (rows, hash): {same} "
          f"({', '.join(f'{n} {h[1]:,}' for n, h in hashes.items())})")
    spark.stop()
    if args.spark_work:
        print("mvsink's Spark work per round:")
        for round_, line in enumerate(summaries(event_log, stretches), 1):
            print(f"  round {round_}: {line}")
    return 0 if same else 1


def caught_up(view) -> list:
    """Steps of ``view`` until it holds the sources' latest versions; their reports."""
    reports = []
    while True:
        report = view.step()
        reports.append(report)
        if (report.desc is None and report.upper >= view.timeline.upper
                and view.timeline.last().versions == view.desired.latest_versions()):
            return reports


if __name__ == "__main__":
    sys.exit(main())
