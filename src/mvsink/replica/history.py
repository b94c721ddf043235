"""A replica's command history, kept reduced.

The history is what a controller would have to send to bring a fresh replica to the same state.
:meth:`CommandHistory.reduce` keeps it small without changing that state:

* peeks, peek cancellations and plans are dropped (they change nothing that lasts);
* a view's compactions collapse into the latest one (frontiers only advance);
* a dropped view (compaction to the empty frontier) loses all its commands;
* configuration updates merge into one, later settings winning;
* ``AllowWrites`` is kept once; ``InitializationComplete`` is not history (it ends a connection's
  initialization, the replayer adds it).

The reduced order is: ``CreateTimely``, ``CreateInstance``, then per live view (in creation order)
``CreateDataflow``, ``Schedule``, ``AllowCompaction``, then ``UpdateConfiguration``, then
``AllowWrites``. Replaying it to a replica that runs those views changes nothing.
"""

from __future__ import annotations

from mvsink.replica.protocol import (AllowCompaction, AllowWrites, CancelPeek, CreateDataflow,
                                     CreateInstance, CreateTimely, InitializationComplete, Peek,
                                     Plan, Schedule, UpdateConfiguration)


class CommandHistory:
    def __init__(self, commands=()):
        self.commands: list = []
        for command in commands:
            self.push(command)

    def push(self, command) -> None:
        if not isinstance(command, InitializationComplete):
            self.commands.append(command)

    def __iter__(self):
        return iter(self.commands)

    def __len__(self) -> int:
        return len(self.commands)

    def reduce(self) -> None:
        creation: dict[type, object] = {}
        dataflows: dict[str, CreateDataflow] = {}
        scheduled: set[str] = set()
        compaction: dict[str, AllowCompaction] = {}
        params: dict = {}
        allow_writes = False
        for command in self.commands:
            if isinstance(command, (CreateTimely, CreateInstance)):
                creation[type(command)] = command
            elif isinstance(command, CreateDataflow):
                view_id = command.view["view_id"]
                dataflows.pop(view_id, None)  # a re-created view moves to the end
                dataflows[view_id] = command
                scheduled.discard(view_id)
                compaction.pop(view_id, None)
            elif isinstance(command, Schedule):
                scheduled.add(command.view_id)
            elif isinstance(command, AllowCompaction):
                if command.frontier is None:
                    dataflows.pop(command.view_id, None)
                    scheduled.discard(command.view_id)
                    compaction.pop(command.view_id, None)
                else:
                    previous = compaction.get(command.view_id)
                    if previous is None or previous.frontier < command.frontier:
                        compaction[command.view_id] = command
            elif isinstance(command, UpdateConfiguration):
                params.update(command.params)
            elif isinstance(command, AllowWrites):
                allow_writes = True
            elif not isinstance(command, (Peek, CancelPeek, Plan)):
                raise TypeError(f"not a command: {command!r}")
        reduced = [creation[cls] for cls in (CreateTimely, CreateInstance) if cls in creation]
        for view_id, dataflow in dataflows.items():
            reduced.append(dataflow)
            if view_id in scheduled:
                reduced.append(Schedule(view_id))
            if view_id in compaction:
                reduced.append(compaction[view_id])
        if params:
            reduced.append(UpdateConfiguration(params))
        if allow_writes:
            reduced.append(AllowWrites())
        self.commands = reduced
