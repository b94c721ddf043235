"""Views over several sources, shared by the timeline tests: the views and their independent
computation from the sources (delta-rs, plain Python) at the versions a time stands for."""

from __future__ import annotations

from collections import Counter

from pyspark.sql import functions as F

from mvsink.check import TimelineReader, table_at

ORDERS = "id BIGINT, customer BIGINT, amount BIGINT"
CUSTOMERS = "id BIGINT, name STRING, nation STRING"
LINEITEM = "order_id BIGINT, line BIGINT, price BIGINT"

ORDERS_WITH_CUSTOMERS_SQL = (
    "SELECT o.id, c.name, c.nation, o.amount FROM orders o JOIN customers c ON o.customer = c.id"
)
ORDERS_WITH_CUSTOMERS_COLUMNS = ["id", "name", "nation", "amount"]
#: Every order, with its customer's name and nation where there is one (a key join).
ORDERS_LEFT_CUSTOMERS_SQL = (
    "SELECT o.id, c.name, c.nation, o.amount FROM orders o LEFT JOIN customers c ON o.customer = c.id"
)
REVENUE_COLUMNS = ["customer", "orders", "revenue"]


def revenue_per_customer(orders, lineitem, customers=None):
    """Revenue per customer over orders joined with their lines (a Python query by name)."""
    return (orders.join(lineitem, orders.id == lineitem.order_id)
            .groupBy(orders.customer.alias("customer"))
            .agg(F.countDistinct(orders.id).alias("orders"), F.sum("price").alias("revenue")))


def rows(path: str, version: int) -> list[dict]:
    return table_at(path, version).to_pyarrow_table().to_pylist()


class Independent:
    """expected(t) for the two views, from the sources at the versions time t stands for."""

    def __init__(self, timeline: str, sources: dict[str, str]):
        self.timeline = TimelineReader(timeline)
        self.sources = sources

    def _at(self, t: int, name: str) -> list[dict]:
        return rows(self.sources[name], self.timeline.versions(t)[name])

    def orders_with_customers(self, t: int, left: bool = False) -> Counter:
        customers = {c["id"]: c for c in self._at(t, "customers")}
        out = Counter()
        for o in self._at(t, "orders"):
            c = customers.get(o["customer"])
            if c is not None or left:
                c = c or {"name": None, "nation": None}
                out[(o["id"], c["name"], c["nation"], o["amount"])] += 1
        return out

    def orders_left_customers(self, t: int) -> Counter:
        return self.orders_with_customers(t, left=True)

    def revenue(self, t: int) -> Counter:
        lines: dict[int, list[int]] = {}
        for line in self._at(t, "lineitem"):
            lines.setdefault(line["order_id"], []).append(line["price"])
        per: dict[int, list[int]] = {}
        for o in self._at(t, "orders"):
            if o["id"] in lines:
                acc = per.setdefault(o["customer"], [0, 0])
                acc[0] += 1
                acc[1] += sum(lines[o["id"]])
        return Counter({(customer, n, revenue): 1 for customer, (n, revenue) in per.items()})
