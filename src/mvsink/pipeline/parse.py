"""SQL files to view statements: ``CREATE MATERIALIZED VIEW name [KEY (col, ...)] AS <query>``.

A file holds one or more statements separated by ``;``; comments (``-- ...``, ``/* ... */``) and
blank statements are allowed anywhere. Only the header (up to ``AS``) is read here, by a small
tokenizer that knows Spark's comments, string literals and backquoted identifiers (so a ``;`` or
a keyword inside them is not one); the query after ``AS`` is Spark's to parse and analyze
(:mod:`mvsink.pipeline.graph`).

Invariants: every statement knows its file and the line and column where its query starts, so
every later error names the file and line; :meth:`ViewStatement.located_query` gives Spark the
query at its own place in the file, so the line numbers Spark reports are the file's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from mvsink.view import ConfigError


class PipelineError(ConfigError):
    """The pipeline cannot run as defined; nothing has been written."""


@dataclass(frozen=True)
class ViewStatement:
    name: str
    key: tuple[str, ...]
    #: The query after ``AS``, as written.
    query: str
    file: Path
    #: Where the statement starts (1-based line), and where its query starts (line, 0-based column).
    line: int
    query_line: int
    query_column: int

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def located_query(self) -> str:
        """The query preceded by blank space up to its place in the file (Spark's error positions
        are then the file's lines)."""
        return "\n" * (self.query_line - 1) + " " * self.query_column + self.query


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _skip_quoted(text: str, i: int) -> int:
    """The index after the quoted literal or identifier starting at ``text[i]``."""
    quote = text[i]
    i += 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            if quote == "`" and text[i + 1:i + 2] == "`":  # `` inside a backquoted identifier
                i += 2
                continue
            return i + 1
        i += 1
    return i


def _skip_comment(text: str, i: int) -> int:
    """The index after the comment starting at ``text[i]`` (``i`` itself if none starts there)."""
    if text.startswith("--", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end + 1
    if text.startswith("/*", i):
        depth, i = 1, i + 2
        while i < len(text) and depth:
            if text.startswith("/*", i):
                depth, i = depth + 1, i + 2
            elif text.startswith("*/", i):
                depth, i = depth - 1, i + 2
            else:
                i += 1
        return i
    return i


def split_statements(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of the ``;``-separated statements that hold more than comments."""
    spans, start, i, content = [], 0, 0, False
    while i < len(text):
        after = _skip_comment(text, i)
        if after != i:
            i = after
        elif text[i] in "'\"`":
            i, content = _skip_quoted(text, i), True
        elif text[i] == ";":
            if content:
                spans.append((start, i))
            start, i, content = i + 1, i + 1, False
        else:
            content = content or not text[i].isspace()
            i += 1
    if content:
        spans.append((start, len(text)))
    return spans


def _tokens(text: str, i: int):
    """Header tokens from ``text[i]`` on: (token, start, end); words, backquoted names, ( ) ,"""
    while i < len(text):
        after = _skip_comment(text, i)
        if after != i:
            i = after
        elif text[i].isspace():
            i += 1
        elif text[i] == "`":
            end = _skip_quoted(text, i)
            yield text[i + 1:end - 1].replace("``", "`"), i, end
            i = end
        elif (word := _WORD.match(text, i)) is not None:
            yield word.group(), i, word.end()
            i = word.end()
        else:
            yield text[i], i, i + 1
            i += 1


def _line_column(text: str, offset: int) -> tuple[int, int]:
    return text.count("\n", 0, offset) + 1, offset - (text.rfind("\n", 0, offset) + 1)


def parse_file(path: Path) -> list[ViewStatement]:
    """The view statements of one SQL file; a statement that is not one is a :class:`PipelineError`."""
    text = path.read_text()
    return [_statement(text, start, end, path) for start, end in split_statements(text)]


def _statement(text: str, start: int, end: int, path: Path) -> ViewStatement:
    first = next(_tokens(text[:end], start))  # the statement holds more than comments: a token
    line = _line_column(text, first[1])[0]
    tokens = _tokens(text[:end], first[1])

    def fail(message: str, offset: int | None = None) -> PipelineError:
        return PipelineError(f"{path}:{_line_column(text, offset)[0] if offset is not None else line}: {message}")

    def expect(*words: str) -> tuple[str, int, int]:
        token = next(tokens, None)
        if token is None or token[0].upper() not in words:
            found = repr(token[0]) if token else "the end of the statement"
            raise fail(f"expected {' or '.join(words)}, found {found} (a statement is "
                       f"CREATE MATERIALIZED VIEW name [KEY (column, ...)] AS SELECT ...)",
                       token[1] if token else end)
        return token

    def name(what: str) -> str:
        token = next(tokens, None)
        if token is None or not _WORD.fullmatch(token[0]):
            raise fail(f"expected {what} (a name of letters, digits and _), found "
                       f"{repr(token[0]) if token else 'the end of the statement'}", token[1] if token else end)
        return token[0]

    expect("CREATE")
    expect("MATERIALIZED")
    expect("VIEW")
    view = name("the view's name")
    key: list[str] = []
    word = expect("KEY", "AS")
    if word[0].upper() == "KEY":
        expect("(")
        while True:
            key.append(name("a key column"))
            if expect(",", ")")[0] == ")":
                break
        word = expect("AS")
    query = text[word[2]:end]
    if not query.strip():
        raise fail(f"view {view}: no query after AS", word[1])
    query_line, query_column = _line_column(text, word[2])
    return ViewStatement(view, tuple(key), query, path, line, query_line, query_column)
