"""What a Delta file's statistics of a column bound: the values its rows can hold, as Python compares them.

A file's ``minValues``/``maxValues`` bound the column's values in its rows, and its ``nullCount``
says whether it holds a null; a bound may be missing (no statistics for the column). Integers,
dates and decimals are their values. A string's statistics may be cut: the protocol asks for a
minimum below every value and a maximum above, and writers keep a prefix of the least value and a
prefix of the greatest with a character after it that no value's next character passes (Delta's
``U+FFFF``, or the greatest code point). So a string statistic bounds only where it is plainly a
value, compared in code point order, which is the order of UTF-8 bytes Spark's binary collation
compares in (and Python's): a minimum below ``U+D800`` (no surrogate, private use or
supplementary character: where a writer orders strings by UTF-16 code units, as the JVM does,
those orders differ), and a maximum that also is shorter than :data:`STRING_PREFIX` characters
(the prefix Delta keeps by default); a longer maximum bounds nothing above.

Whoever leaves a file out by these bounds only skips rows none of which is asked for: the rows
read are still filtered by the values asked for.
"""

from __future__ import annotations

#: The characters Delta keeps of a string statistic (``delta.dataSkippingStringPrefixLength``'s default).
STRING_PREFIX = 32
#: The first character a string statistic that is plainly a value does not hold (surrogates and above).
_PLAIN_BELOW = "\ud800"


def bounds(low, high) -> tuple[object, object]:
    """A file's minimum and maximum statistics of a column as the least and greatest value its
    rows can hold (None: no bound that way), string statistics as the module doc says."""
    if isinstance(low, str) and not _plain_string(low):
        low = None
    if isinstance(high, str) and not _plain_string(high, STRING_PREFIX):
        high = None
    return low, high


def overlaps(low, high, ranges: list[tuple]) -> bool:
    """Whether values from ``low`` to ``high`` (of :func:`bounds`; None: no bound that way) meet
    one of the closed ``ranges`` (a bound None: none that way). Raises TypeError where they do
    not compare."""
    return any((least is None or high is None or least <= high) and (greatest is None or low is None or low <= greatest)
               for least, greatest in ranges)


def _plain_string(value: str, shorter_than: int | None = None) -> bool:
    """Whether a string statistic is plainly a value: no character at or above ``U+D800``, and
    fewer than ``shorter_than`` characters where given."""
    return (not value or max(value) < _PLAIN_BELOW) and (shorter_than is None or len(value) < shorter_than)
