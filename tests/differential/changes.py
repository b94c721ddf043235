"""Random source changes: the commits of each time, as SQL statements on one source each.

A statement names its source ``{t}`` (the runner puts in ``delta.`path```). Kinds: inserts (new
keys and known ones, NULL keys, a row twice), updates of values, key moves (to another key or to
NULL), deletes, a row deleted and inserted again within one time (two commits, or one
``INSERT ... REPLACE WHERE``), ``MERGE`` (delete, update and insert in one commit), ``OPTIMIZE``,
and the change data feed turned off or on. A time has 1-4 commits, to one source or several.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from .tables import CUSTOMERS, NATIONS, ORDERS, SCHEMAS, TableSpec, random_row, sql_literal, values_sql

#: Each table's first column (the key a MERGE matches on, a delete and re-insert picks).
KEY = {table: cols[0][0] for table, cols in SCHEMAS.items()}
_DOMAIN = {"nation": NATIONS + 1, "customer": CUSTOMERS + 2, "orders": ORDERS + 3, "lineitem": ORDERS + 3}


@dataclass(frozen=True)
class Change:
    """One commit: ``sql`` on the source ``table`` (named ``{t}`` in it), of ``kind``."""

    table: str
    kind: str
    sql: str

    def on(self, path: str) -> str:
        return self.sql.replace("{t}", f"delta.`{path}`")

    def __str__(self) -> str:
        return self.sql.replace("{t}", self.table)


class ChangeMaker:
    """Makes random commits for the sources of ``tables``, knowing whether each one's change
    data feed is on now (to turn it the other way)."""

    def __init__(self, rng: random.Random, tables: dict[str, TableSpec]):
        self.rng = rng
        self.feed = {table: spec.change_feed for table, spec in tables.items()}
        self.next_key = 1000
        #: Sources in turn for each time's first commit, so that a few times change each one.
        self.turns = rng.sample(list(SCHEMAS), len(SCHEMAS))
        self.times = 0

    def time(self) -> list[Change]:
        """The commits of one time: the first to the next source in turn, more to any."""
        rng = self.rng
        made = self.commit(self.turns[self.times % len(self.turns)])
        self.times += 1
        while len(made) < 4 and rng.random() < 0.45:
            made += self.commit(rng.choice(list(SCHEMAS)))
        return made

    def commit(self, table: str) -> list[Change]:
        """One commit to ``table`` (two for a delete and re-insert)."""
        rng = self.rng
        kind = rng.choices(["insert", "update", "move", "delete", "reinsert", "replace", "merge", "optimize", "feed"],
                           [4, 3, 3, 3, 2, 1, 2, 1, 1])[0]
        key = KEY[table]
        if kind == "insert":
            rows = [self._row(table) for _ in range(rng.randint(1, 4))]
            if rng.random() < 0.3:
                rows.append(rows[0])
            return [Change(table, kind, f"INSERT INTO {{t}} VALUES {values_sql(rows)}")]
        if kind == "update":
            name = rng.choice(SCHEMAS[table][1:])[0]
            value = sql_literal(random_row(rng, table)[[c[0] for c in SCHEMAS[table]].index(name)])
            return [Change(table, kind, f"UPDATE {{t}} SET {name} = {value} WHERE {self._rows_of(table)}")]
        if kind == "move":
            moved = [c[0] for c in SCHEMAS[table] if c[2] == "key"][-1]  # a foreign key (or the key)
            to = "NULL" if rng.random() < 0.2 else str(rng.randrange(_DOMAIN["nation" if moved.endswith("nationkey")
                                                                              else "customer" if moved.endswith(
                                                                                  "custkey") else "orders"]))
            return [Change(table, kind, f"UPDATE {{t}} SET {moved} = {to} WHERE {self._rows_of(table)}")]
        if kind == "delete":
            return [Change(table, kind, f"DELETE FROM {{t}} WHERE {self._rows_of(table)}")]
        if kind in ("reinsert", "replace"):
            k = rng.randrange(_DOMAIN[table])
            if kind == "replace":
                return [Change(table, kind, f"INSERT INTO {{t}} REPLACE WHERE {key} = {k} "
                                            f"SELECT * FROM {{t}} WHERE {key} = {k}")]
            row = random_row(rng, table, k)
            return [Change(table, kind, f"DELETE FROM {{t}} WHERE {key} = {k}"),
                    Change(table, kind, f"INSERT INTO {{t}} VALUES {values_sql([row])}")]
        if kind == "merge":
            return [Change(table, kind, self._merge(table))]
        if kind == "optimize":
            return [Change(table, kind, "OPTIMIZE {t}")]
        self.feed[table] = not self.feed[table]
        return [Change(table, kind, f"ALTER TABLE {{t}} SET TBLPROPERTIES "
                                    f"(delta.enableChangeDataFeed = {str(self.feed[table]).lower()})")]

    def _row(self, table: str) -> tuple:
        """A new row: a key of the domain (joins hit), a new one, or NULL."""
        rng = self.rng
        if table == "orders" and rng.random() < 0.3:
            self.next_key += 1
            return random_row(rng, table, self.next_key)
        return random_row(rng, table)

    def _rows_of(self, table: str) -> str:
        """A predicate picking some of ``table``'s rows (by its key, NULL keys too at times)."""
        rng = self.rng
        key = KEY[table]
        modulus = rng.choice([3, 4, 5, 7])
        picked = f"pmod({key}, {modulus}) = {rng.randrange(modulus)}"
        if rng.random() < 0.3:
            name = rng.choice(SCHEMAS[table][1:])[0]
            picked = f"({picked} AND {name} IS NOT NULL)" if rng.random() < 0.5 else f"({picked} OR {name} IS NULL)"
        return picked

    def _merge(self, table: str) -> str:
        """A MERGE of a few rows of unique keys: matched ones deleted or updated, others inserted."""
        rng = self.rng
        keys = rng.sample(range(_DOMAIN[table]), rng.randint(2, 4))
        rows = [random_row(rng, table, k) for k in keys]
        names = [c[0] for c in SCHEMAS[table]]
        typed = ", ".join(f"CAST(c{i} AS {type_}) AS {name}" for i, (name, type_, _) in enumerate(SCHEMAS[table]))
        aliases = ", ".join(f"c{i}" for i in range(len(names)))
        value = names[-1]
        return (f"MERGE INTO {{t}} AS t USING (SELECT {typed} FROM VALUES {values_sql(rows)} AS v({aliases})) AS s "
                f"ON t.{names[0]} = s.{names[0]} WHEN MATCHED AND s.{value} IS NULL THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET t.{value} = s.{value} WHEN NOT MATCHED THEN INSERT *")


def random_times(rng: random.Random, tables: dict[str, TableSpec], count: int) -> list[list[Change]]:
    """``count`` times of commits to ``tables``."""
    maker = ChangeMaker(rng, tables)
    return [maker.time() for _ in range(count)]
