"""The replica's gRPC service: one bidirectional command/response stream per controller.

Service ``mvsink.Replica``:

* ``CommandResponseStream`` (stream/stream): commands in, responses out, both encoded with
  :mod:`mvsink.replica.protocol`. Opening a stream makes its caller *the* controller (an earlier
  one is disconnected); commands are handled one at a time in the order sent. A message that
  does not decode is answered with an ``Error`` and skipped; the stream stays open.
* ``History`` (unary): the replica's reduced command history, a JSON array of encoded commands,
  so that a controller without its own record (a command line) can replay it and change nothing.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent import futures

import grpc

from mvsink.replica.protocol import Error, ProtocolError, decode_command, encode
from mvsink.replica.state import ComputeState, Connection

log = logging.getLogger(__name__)

SERVICE = "mvsink.Replica"
STREAM_METHOD = f"/{SERVICE}/CommandResponseStream"
HISTORY_METHOD = f"/{SERVICE}/History"
#: Peek results travel in one message; allow large ones (the peek's own limit applies first).
MAX_MESSAGE_BYTES = 512 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]


def _identity(data: bytes) -> bytes:
    return data


def serve(state: ComputeState, address: str) -> grpc.Server:
    """Start serving ``state`` on ``address`` (``host:port``); returns the running server."""

    def command_stream(requests, context):
        conn = Connection(context.peer())
        state.connect(conn)
        log.info("controller %s connected", conn.name)

        def pump():
            try:
                for data in requests:
                    try:
                        command = decode_command(data)
                    except ProtocolError as exc:
                        conn.send(Error("undecodable", str(exc)))
                        continue
                    state.handle(conn, command)
            except grpc.RpcError:
                pass  # the controller went away
            except Exception:
                log.exception("controller %s: command handling failed", conn.name)
            finally:
                state.disconnect(conn)

        threading.Thread(target=pump, name="mvsink-commands", daemon=True).start()
        context.add_callback(lambda: state.disconnect(conn))
        for response in conn:
            yield encode(response)

    def history(_request, _context):
        commands = [json.loads(encode(c)) for c in list(state.history)]
        return json.dumps(commands, sort_keys=True, separators=(",", ":")).encode()

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "CommandResponseStream": grpc.stream_stream_rpc_method_handler(
            command_stream, request_deserializer=_identity, response_serializer=_identity),
        "History": grpc.unary_unary_rpc_method_handler(
            history, request_deserializer=_identity, response_serializer=_identity),
    })
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=CHANNEL_OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    server.start()
    log.info("replica %s listening on %s", state.replica_id, address)
    return server
