"""Random SQL views over :mod:`.tables`' sources, one family of operators at a time.

Every family (:data:`FAMILIES`) builds its query from random parts (which tables, which join
path, predicates, projections, aggregates), so that together they reach every operator mvsink's
strategies maintain or refuse: filters and projections, inner joins, left/right/full outer joins
(with an extra ``ON`` condition on the padded side or not), semi and anti joins (``EXISTS``,
``NOT EXISTS``, ``IN``, ``NOT IN`` over a column holding NULLs, ``LEFT JOIN ... IS NULL``),
aggregates (count, sum, avg, min, max, count(DISTINCT), grouped or not, ``HAVING``, an
expression of an aggregate) over one source or a join, ``DISTINCT``, ``UNION ALL`` and
``UNION``, a source read twice, scalar subqueries, ``IN`` a grouped subquery with ``HAVING``
and a ``row_number() ... = 1`` dedup.

Every query is deterministic: a window orders by every column of its rows, so rows it cannot
tell apart are equal; no floating-point sums.
"""

from __future__ import annotations

import random
import re
from typing import Callable

from .tables import FLAGS, SCHEMAS, SEGMENTS, STATUSES

ALIAS = {"nation": "n", "customer": "c", "orders": "o", "lineitem": "l"}
#: Foreign keys, child to parent: (child, its column, parent, the parent's key).
EDGES = (("customer", "c_nationkey", "nation", "n_nationkey"),
         ("orders", "o_custkey", "customer", "c_custkey"),
         ("lineitem", "l_orderkey", "orders", "o_orderkey"))
#: Per table, columns of one shape for union branches: (a key, a string, a number).
UNION_SHAPE = {"nation": ("n_nationkey", "n_name", "n_region"), "customer": ("c_custkey", "c_segment", "c_acctbal"),
               "orders": ("o_custkey", "o_status", "o_total"), "lineitem": ("l_orderkey", "l_flag", "l_price")}
_STRINGS = {"n_name": ("ASIA", "EU", "US"), "c_segment": SEGMENTS, "o_status": STATUSES, "l_flag": FLAGS}


def columns(table: str, alias: str | None = None) -> list[tuple[str, str]]:
    """``table``'s columns as ``alias.name`` with their kind."""
    alias = alias or ALIAS[table]
    return [(f"{alias}.{name}", kind) for name, _, kind in SCHEMAS[table]]


def _of(cols: list[tuple[str, str]], *kinds: str) -> list[str]:
    return [c for c, k in cols if k in kinds]


def predicate(rng: random.Random, cols: list[tuple[str, str]]) -> str:
    """A predicate on one of ``cols`` (some true of NULLs, most not)."""
    col, kind = rng.choice(cols)
    name = col.split(".")[-1]
    if kind == "str":
        value = rng.choice(_STRINGS[name])
        return rng.choice([f"{col} = '{value}'", f"{col} <> '{value}'", f"{col} IS NULL",
                           f"coalesce({col}, '?') IN ('{value}', '?')"])
    if kind == "dec":
        return rng.choice([f"{col} > {rng.randint(0, 500)}", f"{col} <= {rng.randint(10, 400)}",
                           f"{col} IS NOT NULL"])
    if kind == "date":
        return f"{col} >= DATE '2024-01-{rng.randint(1, 28):02d}'"
    if kind == "key":
        return rng.choice([f"{col} < {rng.randint(2, 30)}", f"{col} % 3 <> {rng.randrange(3)}", f"{col} IS NOT NULL"])
    return rng.choice([f"{col} > {rng.randint(0, 5)}", f"{col} BETWEEN {rng.randint(0, 3)} AND {rng.randint(3, 8)}",
                       f"{col} IS NULL"])


def where(rng: random.Random, cols: list[tuple[str, str]], most: int = 2) -> list[str]:
    """0 to ``most`` conjuncts, one of them sometimes an ``OR`` of two predicates."""
    conjuncts = [predicate(rng, cols) for _ in range(rng.randint(0, most))]
    if conjuncts and rng.random() < 0.25:
        conjuncts[0] = f"({conjuncts[0]} OR {predicate(rng, cols)})"
    return conjuncts


def where_sql(conjuncts: list[str]) -> str:
    return f" WHERE {' AND '.join(conjuncts)}" if conjuncts else ""


def projection(rng: random.Random, cols: list[tuple[str, str]], most: int = 3) -> list[str]:
    """1 to ``most`` of ``cols`` (distinct names), sometimes an expression of one."""
    picked = rng.sample([c for c, _ in cols], rng.randint(1, min(most, len(cols))))
    if rng.random() < 0.4:
        col, kind = rng.choice(cols)
        picked.append({"dec": f"{col} * 2 AS x_twice", "int": f"{col} + 1 AS x_next",
                       "key": f"{col} % 4 AS x_mod", "date": f"month({col}) AS x_month",
                       "str": f"coalesce({col}, 'none') AS x_text"}[kind])
    return picked


def join_path(rng: random.Random, length: int) -> list[str]:
    """``length`` tables joined along foreign keys, in order (each next to the one before)."""
    start = rng.randrange(len(EDGES) + 1 - (length - 1))
    chain = ["nation", "customer", "orders", "lineitem"][start:start + length]
    return chain if rng.random() < 0.5 else chain[::-1]


def _edge(a: str, b: str) -> str:
    for child, fk, parent, key in EDGES:
        if {a, b} == {child, parent}:
            return f"{ALIAS[child]}.{fk} = {ALIAS[parent]}.{key}"
    raise ValueError(f"no edge between {a} and {b}")


def inner_from(rng: random.Random, length: int) -> tuple[str, list[tuple[str, str]]]:
    """``FROM`` an inner join of ``length`` tables, and their columns."""
    chain = join_path(rng, length)
    sql = f"{chain[0]} {ALIAS[chain[0]]}"
    for before, table in zip(chain, chain[1:]):
        sql += f" JOIN {table} {ALIAS[table]} ON {_edge(before, table)}"
        if rng.random() < 0.2:
            sql += f" AND {predicate(rng, columns(table))}"
    return sql, [c for t in chain for c in columns(t)]


def filter_project(rng: random.Random) -> str:
    table = rng.choice(list(SCHEMAS))
    cols = columns(table)
    return f"SELECT {', '.join(projection(rng, cols))} FROM {table} {ALIAS[table]}{where_sql(where(rng, cols))}"


def inner_join(rng: random.Random) -> str:
    from_, cols = inner_from(rng, rng.choice([2, 2, 3]))
    return f"SELECT {', '.join(projection(rng, cols, 4))} FROM {from_}{where_sql(where(rng, cols))}"


def outer_from(rng: random.Random, kind: str | None = None) -> tuple[str, list[tuple[str, str]], str, str]:
    """``FROM`` an outer join of two tables along a foreign key, sometimes with a condition on the
    padded side in its ``ON``; their columns, the join kind and the padded table."""
    child, _, parent, _ = rng.choice(EDGES)
    left, right = (child, parent) if rng.random() < 0.5 else (parent, child)
    kind = kind or rng.choice(["LEFT", "RIGHT", "FULL"])
    padded = right if kind == "LEFT" else left if kind == "RIGHT" else rng.choice([left, right])
    on = _edge(left, right)
    if rng.random() < 0.5:
        on += f" AND {predicate(rng, columns(padded))}"
    sql = f"{left} {ALIAS[left]} {kind} JOIN {right} {ALIAS[right]} ON {on}"
    return sql, columns(left) + columns(right), kind, padded


def outer_join(rng: random.Random) -> str:
    from_, cols, kind, padded = outer_from(rng)
    kept = [c for c in cols if not c[0].startswith(ALIAS[padded] + ".")] if kind != "FULL" else cols
    return f"SELECT {', '.join(projection(rng, cols, 4))} FROM {from_}{where_sql(where(rng, kept, 1))}"


def semi_anti_condition(rng: random.Random, outer: str) -> tuple[str, str]:
    """A semi or anti join of ``outer`` with a table it has a foreign key with, as a ``WHERE``
    conjunct (``EXISTS``, ``NOT EXISTS``, ``IN``, ``NOT IN``), or as ``LEFT JOIN ... IS NULL``
    (then the join to add to ``FROM`` and the conjunct)."""
    other = rng.choice([p if c == outer else c for c, _, p, _ in EDGES if outer in (c, p)])
    inner = "i_" + ALIAS[other]
    corr = _edge(outer, other).replace(f"{ALIAS[other]}.", f"{inner}.")
    extra = f" AND {predicate(rng, columns(other, inner))}" if rng.random() < 0.5 else ""
    form = rng.choice(["EXISTS", "NOT EXISTS", "IN", "NOT IN", "LEFT IS NULL"])
    if form in ("EXISTS", "NOT EXISTS"):
        return "", f"{form} (SELECT 1 FROM {other} {inner} WHERE {corr}{extra})"
    mine, theirs = (part.strip() for part in corr.split("="))
    if not mine.startswith(ALIAS[outer] + "."):
        mine, theirs = theirs, mine
    if form == "LEFT IS NULL":
        return (f" LEFT JOIN {other} {inner} ON {corr}{extra}", f"{theirs} IS NULL")
    nulls = "" if rng.random() < 0.5 else f" AND {theirs} IS NOT NULL"  # NOT IN over a NULL: no row
    return "", f"{mine} {form} (SELECT {theirs} FROM {other} {inner} WHERE true{extra}{nulls})"


def semi_anti(rng: random.Random) -> str:
    outer = rng.choice(list(SCHEMAS))
    cols = columns(outer)
    join, condition = semi_anti_condition(rng, outer)
    conjuncts = [condition, *where(rng, cols, 1)]
    return f"SELECT {', '.join(projection(rng, cols))} FROM {outer} {ALIAS[outer]}{join}{where_sql(conjuncts)}"


def aggregates(rng: random.Random, cols: list[tuple[str, str]]) -> list[str]:
    """1 to 3 aggregates of ``cols``, named ``agg0``..., one sometimes an expression of aggregates."""
    numbers, anything = _of(cols, "int", "dec"), [c for c, _ in cols]
    made = []
    for i in range(rng.randint(1, 3)):
        form = rng.choice(["count(*)", "count", "sum", "avg", "min", "max", "count(DISTINCT)"])
        if form == "count(*)":
            expr = "count(*)"
        elif form in ("sum", "avg"):
            expr = f"{form}({rng.choice(numbers)})"
        elif form == "count(DISTINCT)":
            expr = f"count(DISTINCT {rng.choice(anything)})"
        else:
            expr = f"{form}({rng.choice(anything)})"
        made.append(expr)
    if rng.random() < 0.3:
        made[0] = rng.choice([f"avg({rng.choice(numbers)}) * 2", f"sum({rng.choice(numbers)}) / count(*)",
                              f"count(*) + max({rng.choice(numbers)})"])
    return [f"{expr} AS agg{i}" for i, expr in enumerate(made)]


def grouped(rng: random.Random, from_: str, cols: list[tuple[str, str]], conjuncts: list[str],
            grouping: list[tuple[str, str]] | None = None) -> str:
    """An aggregate over ``from_``: by 0-2 of ``grouping`` (default: ``cols``' keys and strings),
    sometimes with ``HAVING``."""
    grouping = grouping if grouping is not None else [c for c in cols if c[1] in ("key", "str")]
    by = rng.sample([c for c, _ in grouping], rng.choice([0, 1, 1, 2])) if grouping else []
    aggs = aggregates(rng, cols)
    having = f" HAVING count(*) > {rng.randint(1, 3)}" if by and rng.random() < 0.3 else ""
    group_by = f" GROUP BY {', '.join(by)}" if by else ""
    return f"SELECT {', '.join(by + aggs)} FROM {from_}{where_sql(conjuncts)}{group_by}{having}"


def aggregate(rng: random.Random) -> str:
    table = rng.choice(list(SCHEMAS))
    cols = columns(table)
    return grouped(rng, f"{table} {ALIAS[table]}", cols, where(rng, cols, 1))


def aggregate_over_join(rng: random.Random) -> str:
    """An aggregate over an inner, outer, semi or anti join (``LEFT JOIN ... IS NULL`` too)."""
    shape = rng.choice(["inner", "outer", "semi_anti", "semi_anti"])
    if shape == "inner":
        from_, cols = inner_from(rng, rng.choice([2, 3]))
        return grouped(rng, from_, cols, where(rng, cols, 1))
    if shape == "outer":
        from_, cols, kind, padded = outer_from(rng)
        kept = [c for c in cols if not c[0].startswith(ALIAS[padded] + ".")] if kind != "FULL" else cols
        return grouped(rng, from_, cols, [], [c for c in kept if c[1] in ("key", "str")])
    outer = rng.choice(list(SCHEMAS))
    base, cols = ((f"{outer} {ALIAS[outer]}", columns(outer)) if rng.random() < 0.5
                  else inner_from(rng, 2))
    outer = next(t for t, a in ALIAS.items() if base.split()[0] == t)
    join, condition = semi_anti_condition(rng, outer)
    if join:
        base = f"{outer} {ALIAS[outer]}{join}" + base[len(f"{outer} {ALIAS[outer]}"):]
    return grouped(rng, base, cols, [condition])


def distinct(rng: random.Random) -> str:
    if rng.random() < 0.5:
        table = rng.choice(list(SCHEMAS))
        from_, cols = f"{table} {ALIAS[table]}", columns(table)
    else:
        from_, cols = inner_from(rng, 2)
    picked = rng.sample([c for c, k in cols if k != "dec"], rng.randint(1, 2))
    return f"SELECT DISTINCT {', '.join(picked)} FROM {from_}{where_sql(where(rng, cols, 1))}"


def _branch(rng: random.Random, table: str, join: bool) -> str:
    key, text, number = (f"{ALIAS[table]}.{c}" for c in UNION_SHAPE[table])
    cols = columns(table)
    if join:
        other = rng.choice([p if c == table else c for c, _, p, _ in EDGES if table in (c, p)])
        from_ = f"{table} {ALIAS[table]} JOIN {other} {ALIAS[other]} ON {_edge(table, other)}"
        cols = cols + columns(other)
    else:
        from_ = f"{table} {ALIAS[table]}"
    return f"SELECT {key} AS u_key, {text} AS u_text, {number} AS u_number FROM {from_}{where_sql(where(rng, cols, 1))}"


def union(rng: random.Random) -> str:
    """``UNION ALL`` or ``UNION`` of 2-3 branches (a source in two of them at times, a join in
    one), sometimes under an aggregate."""
    tables = [rng.choice(list(SCHEMAS)) for _ in range(rng.choice([2, 2, 3]))]
    branches = [_branch(rng, t, rng.random() < 0.25) for t in tables]
    op = rng.choice([" UNION ALL ", " UNION ALL ", " UNION "])
    body = op.join(branches)
    if rng.random() < 0.3:
        return (f"SELECT u_text, count(*) AS n, sum(u_number) AS total FROM ({body}) u GROUP BY u_text")
    return body


def self_join(rng: random.Random) -> str:
    """A source joined with itself (inner or left), sometimes counted."""
    table, key, order = rng.choice([("orders", "o_custkey", "o_orderkey"), ("lineitem", "l_orderkey", "l_linenumber"),
                                    ("customer", "c_nationkey", "c_custkey")])
    a, b = ALIAS[table] + "1", ALIAS[table] + "2"
    kind = rng.choice(["JOIN", "JOIN", "LEFT JOIN"])
    from_ = f"{table} {a} {kind} {table} {b} ON {a}.{key} = {b}.{key} AND {a}.{order} < {b}.{order}"
    cols = columns(table, a)
    if rng.random() < 0.4:
        return f"SELECT {a}.{key} AS k, count({b}.{order}) AS n FROM {from_}{where_sql(where(rng, cols, 1))} GROUP BY {a}.{key}"
    return (f"SELECT {a}.{key} AS k, {a}.{order} AS first, {b}.{order} AS second FROM {from_}"
            f"{where_sql(where(rng, cols, 1))}")


def scalar_subquery(rng: random.Random) -> str:
    """An uncorrelated scalar subquery in ``WHERE``, or a correlated one in ``SELECT`` or ``WHERE``."""
    form = rng.choice(["uncorrelated", "select", "where"])
    if form == "uncorrelated":
        table = rng.choice(["orders", "lineitem", "customer"])
        cols = columns(table)
        number = rng.choice(_of(cols, "int", "dec"))
        inner = number.replace(f"{ALIAS[table]}.", "s.")
        agg = rng.choice(["avg", "max", "min"])
        return (f"SELECT {', '.join(projection(rng, cols))} FROM {table} {ALIAS[table]} "
                f"WHERE {number} >= (SELECT {agg}({inner}) FROM {table} s){' AND ' + predicate(rng, cols) if rng.random() < 0.5 else ''}")
    child, fk, parent, key = rng.choice(EDGES)
    if form == "select":
        cols = columns(parent)
        agg = rng.choice(["count(*)", f"max(s.{fk})", "count(DISTINCT s." + SCHEMAS[child][0][0] + ")"])
        return (f"SELECT {', '.join(projection(rng, cols, 2))}, (SELECT {agg} FROM {child} s "
                f"WHERE s.{fk} = {ALIAS[parent]}.{key}) AS related FROM {parent} {ALIAS[parent]}"
                f"{where_sql(where(rng, cols, 1))}")
    cols = columns(child)
    number = rng.choice(_of(cols, "int", "dec"))
    inner = number.replace(f"{ALIAS[child]}.", "s.")
    return (f"SELECT {', '.join(projection(rng, cols))} FROM {child} {ALIAS[child]} WHERE {number} > "
            f"(SELECT avg({inner}) FROM {child} s WHERE s.{fk} = {ALIAS[child]}.{fk})")


def grouped_in(rng: random.Random) -> str:
    """An aggregate over an inner join whose key is ``IN`` a grouped subquery with ``HAVING``
    (TPC-H Q18's shape): the subquery groups a table by its foreign key, a table of the join again
    or the one that key reaches."""
    from_, cols = inner_from(rng, rng.choice([2, 3]))
    tables = [t for t, a in ALIAS.items() if re.search(rf"\b{t} {a}\b", from_)]
    child, fk, parent, key = rng.choice([e for e in EDGES if e[0] in tables or e[2] in tables])
    mine = f"{ALIAS[parent]}.{key}" if parent in tables else f"{ALIAS[child]}.{fk}"
    number = rng.choice([n for n, _, k in SCHEMAS[child] if k in ("int", "dec")])
    having = rng.choice([f"count(*) > {rng.randint(1, 3)}", f"sum(s.{number}) > {rng.randint(5, 60)}"])
    condition = f"{mine} IN (SELECT s.{fk} FROM {child} s GROUP BY s.{fk} HAVING {having})"
    return grouped(rng, from_, cols, [condition, *where(rng, cols, 1)])


def dedup(rng: random.Random) -> str:
    """The first row per key (``row_number() ... = 1``), ordered by a column and then by every
    other column, so that rows tied in the order are equal."""
    table = rng.choice(["orders", "lineitem", "customer"])
    names = [n for n, _, _ in SCHEMAS[table]]
    key = rng.choice([n for n, _, k in SCHEMAS[table] if k in ("key", "str")])
    first = rng.choice([n for n in names if n != key])
    order = [f"{first} {rng.choice(['ASC', 'DESC'])}"] + [n for n in names if n not in (key, first)]
    picked = rng.sample(names, rng.randint(2, len(names)))
    cols = [(n, k) for n, _, k in SCHEMAS[table]]
    return (f"SELECT {', '.join(picked)} FROM (SELECT *, row_number() OVER (PARTITION BY {key} ORDER BY "
            f"{', '.join(order)}) AS rn FROM {table}{where_sql(where(rng, cols, 1))}) WHERE rn = 1")


#: Each family of views, by name: a function of the generator making one query.
FAMILIES: dict[str, Callable[[random.Random], str]] = {
    "filter_project": filter_project, "inner_join": inner_join, "outer_join": outer_join,
    "semi_anti": semi_anti, "aggregate": aggregate, "aggregate_over_join": aggregate_over_join,
    "distinct": distinct, "union": union, "self_join": self_join, "scalar_subquery": scalar_subquery,
    "dedup": dedup, "grouped_in": grouped_in,
}


def random_view(rng: random.Random, family: str | None = None) -> tuple[str, str]:
    """A query of ``family`` (one at random if None), and the family."""
    family = family or rng.choice(list(FAMILIES))
    return FAMILIES[family](rng), family


#: What :func:`features` looks for in a query: an operator, by a pattern of its SQL.
FEATURES = {
    "filter": r"\bWHERE\b", "inner join": r"(?<!LEFT )(?<!RIGHT )(?<!FULL )\bJOIN\b",
    "left join": r"\bLEFT JOIN\b(?!.*IS NULL)", "right join": r"\bRIGHT JOIN\b", "full join": r"\bFULL JOIN\b",
    "padded-side ON condition": r"\b(LEFT|RIGHT|FULL) JOIN \w+ \w+ ON [^=]+=\s*\S+ AND",
    "exists": r"(?<!NOT )\bEXISTS\b", "not exists": r"\bNOT EXISTS\b", "in": r"(?<!NOT) IN \(SELECT",
    "not in": r"\bNOT IN \(SELECT", "not in over nulls": r"NOT IN \(SELECT(?:(?!IS NOT NULL\)).)*\)\s*(AND|$)",
    "left join is null": r"LEFT JOIN .* WHERE i_\w\.\w+ IS NULL", "count": r"\bcount\(\*\)",
    "sum": r"\bsum\(", "avg": r"\bavg\(", "min": r"\bmin\(", "max": r"\bmax\(", "count distinct": r"count\(DISTINCT",
    "global aggregate": r"^SELECT (?:(?!GROUP BY).)*\b(count|sum|avg|min|max)\((?:(?!GROUP BY).)*$",
    "group by": r"\bGROUP BY\b", "having": r"\bHAVING\b", "aggregate expression": r"\) (\*|/|\+) (2|count|max)",
    "distinct": r"SELECT DISTINCT", "union all": r"\bUNION ALL\b", "union": r"\bUNION (?!ALL)",
    "self-join": r"\b(\w+) (\w)1 (LEFT )?JOIN \1 \w2\b", "scalar subquery": r"\(SELECT (avg|max|min|count)",
    "row_number dedup": r"row_number\(\) OVER", "in a grouped subquery": r"IN \(SELECT s\.\w+ FROM \w+ s GROUP BY",
    "anti-join aggregate": r"LEFT JOIN .* IS NULL.*GROUP BY", "aggregate over exists": r"EXISTS.*\b(avg|sum|count)\(|"
                                                                                         r"(avg|sum|count)\(.*EXISTS",
}


def features(sql: str) -> set[str]:
    """The operators of :data:`FEATURES` that ``sql`` has."""
    return {name for name, pattern in FEATURES.items() if re.search(pattern, sql)}
