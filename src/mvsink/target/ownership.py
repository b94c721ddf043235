"""Whose the target is: a view writes only a target it made, or one its user told it to adopt.

Checked once, when a replica starts, before anything is read from the sources or written:

* no file or folder at the target path, or an empty folder: the view creates its table;
* a Delta table mvsink made or wrote for this view: the table property ``mvsink.fence.<view
  id>`` (set when mvsink creates it), the view's ``txn`` (appId ``mvsink:<view id>``, set by its
  commits), or the ``mvsink.layout`` property with the table named after the view (a table
  created by an mvsink from before fences) says so. Restarts, replicas and cutovers find it so;
* any other Delta table (made by delta-rs, Spark or another view): taking it over would retract
  whatever rows it holds that the view does not, so it is refused (:class:`ForeignTarget`)
  unless the view says ``adopt`` (``adopt: true``, ``--adopt-existing``, ``adopt=True``);
* a regular file, or a folder holding files but no Delta table: refused whatever ``adopt``
  says (:class:`NotATarget`): mvsink would write its table among someone's files.
"""

from __future__ import annotations

from pyarrow import fs as pafs
from deltalake import DeltaTable

from mvsink import storage
from mvsink.append.fence import fence_property
from mvsink.target.layout import LAYOUT_PROPERTY
from mvsink.table import latest_version
from mvsink.view import ConfigError, ViewDefinition

#: How a user says a foreign table may be taken over, for the error.
HOW_TO_ADOPT = ("to let the view take it over (its rows not in the view are retracted), give the view "
                "'adopt: true' (view YAML, or pipeline.yaml views.<name> / defaults), run the job with "
                "--adopt-existing, or pass ViewDefinition(..., adopt=True); otherwise give the view "
                "another target")


class ForeignTarget(ConfigError):
    """The target is a Delta table this view did not write, and the view does not adopt it."""


class NotATarget(ConfigError):
    """The target path is a file, or a folder of files that is not a Delta table."""


def check_target_owned(view: ViewDefinition) -> None:
    """Raise :class:`NotATarget` or :class:`ForeignTarget` if ``view`` may not write its target
    (see the module doc); returns quietly where it may."""
    filesystem, root = storage.filesystem(view.target)
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File:
        raise NotATarget(f"target {view.target} of view {view.view_id!r} is a file, not a Delta table or "
                         "a folder; give the view a folder (new or a Delta table) as its target")
    if latest_version(view.target) is None:
        if info.type == pafs.FileType.Directory:
            held = filesystem.get_file_info(pafs.FileSelector(root, recursive=False))
            if held:
                names = sorted(i.base_name for i in held)
                raise NotATarget(
                    f"target {view.target} of view {view.view_id!r} is a folder holding {len(names)} "
                    f"entries ({', '.join(names[:5])}{', ...' if len(names) > 5 else ''}) but no Delta table "
                    "(no _delta_log); mvsink writes its table only into a new or empty folder: give the view "
                    "another target, or empty this one")
        return
    table = DeltaTable(storage.delta_uri(view.target), storage_options=storage.storage_options(view.target))
    if _written_for(table, view) or view.adopt:
        return
    configuration = table.metadata().configuration
    others = sorted(k[len(fence_property("")):] for k in configuration if k.startswith(fence_property("")))
    whose = f"mvsink view {', '.join(others)}" if others else "not mvsink (delta-rs, Spark or another writer)"
    raise ForeignTarget(
        f"target {view.target} of view {view.view_id!r} is an existing Delta table (version {table.version()}, "
        f"{len(table.file_uris())} data files) written by {whose}, not by this view (no txn {view.app_id!r}, "
        f"no table property {fence_property(view.view_id)}); nothing was written. {HOW_TO_ADOPT}")


def _written_for(table: DeltaTable, view: ViewDefinition) -> bool:
    """Whether mvsink made or wrote ``table`` for ``view`` (see the module doc)."""
    configuration = table.metadata().configuration
    if fence_property(view.view_id) in configuration or table.transaction_version(view.app_id) is not None:
        return True
    return LAYOUT_PROPERTY in configuration and table.metadata().name == view.view_id
