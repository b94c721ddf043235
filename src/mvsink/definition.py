"""A view's *definition id*: which version of a view a replica computes, as a short stable hash.

Two replicas compute the same rows at every time exactly when they agree on everything that
decides those rows. The definition id is the SHA-256 (first 16 hex digits) of a canonical JSON
document of exactly these parts (:func:`definition_parts`):

* ``input``: the input's kind (``changes`` or ``snapshot``) and its code:

  - a snapshot view's SQL text, as written (whitespace and comments count);
  - a snapshot view's ``query`` function, or a changes view's ``map_row`` function: the function's
    source text (:func:`inspect.getsource`, dedented), or, where there is no source file (a lambda
    typed into a REPL), its code object: bytecode, constants (nested code objects included) and
    the names it uses; in both cases also its default argument values and the values of the
    variables it closes over (their ``repr``). So editing its body, a comment in it or its name
    (on its ``def`` line) makes a new definition; moving it to another module does not;
  - the input's one ``source`` path (where it has one) and a changes view's declared
    ``output_schema``;
  - where a snapshot query reads views (a pipeline's views over views), each view's name and its
    SQL text or function, as above: a change to a view the query reads is a new definition;
* ``sources``: the view's sources, name -> table path;
* ``key``: the key columns, in order;
* ``schema``: the table schema the view writes, as Spark resolves its output (column names, order
  and types, with mvsink's own columns), so that a source whose columns changed under
  ``SELECT *`` is a new version too;
* ``as_of``: the first time the view writes.

Not part of it, because they do not decide the rows: the view id (the same for every version of a
view: it names the Delta ``txn`` appId), the target, the replica id, read-only, the timeline's
path, ``retain_history``, Spark settings, mvsink's own version. Nor is what a function *calls*:
a helper function, a module-level constant, a library. A change there that changes the rows is a
new version of the view that the id does not see: change the function's own text too (a comment
will do), so that the cutover fences the old version.

The id is computed the same way in every process from the same definition (no addresses, no
hash randomization, no dict order), so replicas of one definition agree on it wherever they run.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import textwrap
import types
from typing import Any, Callable

from pyspark.sql import types as T

from mvsink.view import ChangesInput, ViewDefinition

#: The length in hex digits of a definition id.
ID_LENGTH = 16


def definition_id(view: ViewDefinition, schema: T.StructType) -> str:
    """The definition id of ``view`` whose output schema is ``schema`` (see the module doc)."""
    canonical = json.dumps(definition_parts(view, schema), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:ID_LENGTH]


def definition_parts(view: ViewDefinition, schema: T.StructType) -> dict[str, Any]:
    """What the definition id is a hash of: plain JSON values (see the module doc)."""
    source = view.input
    if isinstance(source, ChangesInput):
        output_schema = source.output_schema
        if isinstance(output_schema, T.StructType):
            output_schema = output_schema.simpleString()
        view_input = {"kind": "changes", "source": source.source,
                      "map_row": function_code(source.map_row) if source.map_row else None,
                      "output_schema": output_schema}
    else:
        view_input = {"kind": "snapshot", "source": source.source, "sql": source.sql,
                      "query": function_code(source.query) if source.query else None}
        if source.views:  # absent otherwise: the ids of views reading no view stay as they were
            view_input["views"] = [{"name": v.name, "sql": v.sql,
                                    "query": function_code(v.query) if v.query else None} for v in source.views]
    return {
        "input": view_input,
        "sources": dict(sorted(view.sources.items())),
        "key": list(view.key),
        "schema": json.loads(schema.json()),
        "as_of": view.as_of,
    }


def function_code(fn: Callable) -> dict[str, Any]:
    """What of a function decides what it computes: its source (or code) and the values it was
    given (defaults, closure), never its name or where it lives."""
    target = inspect.unwrap(fn)
    code = {}
    try:
        code["source"] = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        code["code"] = _code_digest(getattr(target, "__code__", None)) if hasattr(target, "__code__") \
            else repr(target)
    defaults = getattr(target, "__defaults__", None)
    kwdefaults = getattr(target, "__kwdefaults__", None)
    if defaults:
        code["defaults"] = [_value(v) for v in defaults]
    if kwdefaults:
        code["kwdefaults"] = {k: _value(v) for k, v in sorted(kwdefaults.items())}
    closure = getattr(target, "__closure__", None)
    if closure:
        names = target.__code__.co_freevars
        code["closure"] = {name: _value(_cell(cell)) for name, cell in zip(names, closure)}
    return code


def _cell(cell) -> Any:
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _value(value: Any) -> Any:
    """A value a function was given, as stable text: a function by its code, anything else by
    ``repr`` (an object whose repr holds its address is unstable across processes: such a value
    makes replicas disagree, which is refused, never silently accepted)."""
    if isinstance(value, types.FunctionType):
        return function_code(value)
    return repr(value)


def _code_digest(code: types.CodeType) -> str:
    """A digest of a code object that does not depend on its file or line numbers."""
    digest = hashlib.sha256()

    def add(c: types.CodeType) -> None:
        digest.update(c.co_code)
        digest.update(repr(c.co_names).encode())
        digest.update(repr(c.co_varnames).encode())
        for const in c.co_consts:
            if isinstance(const, types.CodeType):
                add(const)
            else:
                digest.update(repr(const).encode())

    add(code)
    return digest.hexdigest()
