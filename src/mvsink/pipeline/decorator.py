"""Python views by decorator: ``@materialized_view(name=..., key=(...))`` on a function in a
pipeline's ``*.py`` file, in the style of Spark declarative pipelines' ``@dp.materialized_view``.

The function takes the sources and views it reads as DataFrames, each parameter named after one,
and returns the view's rows as a DataFrame::

    from mvsink.pipeline import materialized_view

    @materialized_view(name="gold_x", key=("k",))
    def gold_x(silver_y, orders):
        return silver_y.join(orders, "k").groupBy("k").count()

The decorator only records the function (the name defaults to the function's) and returns it
unchanged. :func:`python_views` imports every ``*.py`` file under the pipeline folder, each
afresh, and collects the functions decorated in it; the job later finds each one again as
``path/file.py:function`` (:func:`mvsink.view.resolve_function`), the module imported here.

Invariants: every Python view knows its file and the line of its definition, so every later error
names them; a file that fails to import, a decorator used wrongly, a function that is not its
module's own top-level name, or a parameter that cannot name a source or view (``*args``,
``**kwargs``) is a :class:`PipelineError` here, before Spark runs anything.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from mvsink.pipeline.parse import PipelineError

_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


@dataclass(frozen=True)
class PythonView:
    name: str
    key: tuple[str, ...]
    function: Callable
    file: Path
    #: The line of the function's definition (its first decorator's).
    line: int
    #: The sources and views it reads: its parameters' names, in order.
    parameters: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def reference(self) -> str:
        """The function as :func:`mvsink.view.resolve_function` finds it."""
        return f"{self.file}:{self.function.__name__}"


#: The views decorated while a pipeline file is imported (None: no import under way).
_collected: list[PythonView] | None = None


def materialized_view(name: str | None = None, key: tuple[str, ...] | list[str] | str = ()) -> Callable:
    """Declare the decorated function a view of the pipeline (see the module doc)."""
    if callable(name):
        raise TypeError("materialized_view takes arguments: use @materialized_view() or "
                        "@materialized_view(name=..., key=(...))")

    def decorate(function: Callable) -> Callable:
        code = getattr(function, "__code__", None)
        if code is None:
            raise TypeError(f"@materialized_view decorates a function, not {function!r}")
        where = f"{code.co_filename}:{code.co_firstlineno}"
        view = name if name is not None else function.__name__
        if not isinstance(view, str) or not view or view[0].isdigit() or any(c not in _NAME_CHARS for c in view):
            raise PipelineError(f"{where}: view name {view!r} must be letters, digits and _")
        keys = (key,) if isinstance(key, str) else tuple(key)
        if not all(isinstance(k, str) and k for k in keys):
            raise PipelineError(f"{where}: view {view}: key must be column names, not {key!r}")
        parameters = []
        for parameter in inspect.signature(function).parameters.values():
            if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
                raise PipelineError(f"{where}: view {view}: parameter {parameter} cannot name a source or "
                                    "view: every parameter is one source or view, by its name")
            parameters.append(parameter.name)
        if _collected is not None:
            _collected.append(PythonView(view, keys, function, Path(code.co_filename), code.co_firstlineno,
                                         tuple(parameters)))
        return function

    return decorate


def python_views(folder: Path) -> list[PythonView]:
    """The views decorated in the ``*.py`` files under ``folder``, each file imported afresh."""
    global _collected
    views: list[PythonView] = []
    for file in sorted(p for p in folder.rglob("*.py") if p.is_file()):
        file = file.absolute()
        _collected = []
        try:
            _import(file)
            found = [v for v in _collected if v.file == file]  # not those of files it imports
        finally:
            _collected = None
        for view in found:
            if getattr(sys.modules[file.stem], view.function.__name__, None) is not view.function:
                raise PipelineError(f"{view.where}: view {view.name}: its function must be a top-level "
                                    f"function of {file.name}, defined once, named {view.function.__name__}")
        views += found
    return views


def _import(file: Path) -> None:
    """Import ``file`` as module ``file.stem`` (replacing any module of that name), its folder
    on the path as :func:`mvsink.view.resolve_function` puts it."""
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[file.stem] = module
    try:
        spec.loader.exec_module(module)
    except PipelineError:
        del sys.modules[file.stem]
        raise
    except Exception as exc:
        del sys.modules[file.stem]
        line = exc.lineno if isinstance(exc, SyntaxError) and exc.filename == str(file) else line_in(file, exc, 1)
        raise PipelineError(f"{file}:{line}: cannot import it: {failure(exc)}") from None


def line_in(file: Path, exc: BaseException, default: int) -> int:
    """The line of ``file`` nearest to where ``exc`` was raised (``default`` if none)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(file)]
    return frames[-1].lineno if frames else default


def failure(exc: BaseException) -> str:
    """``exc`` in one line: its type and its message's first line."""
    message = str(exc).strip()
    return f"{type(exc).__name__}: {message.splitlines()[0]}" if message else type(exc).__name__
