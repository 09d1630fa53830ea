"""An in-memory EventStore that behaves like the Python SDK's example store
(examples/servers/simple-streamablehttp), written for this comparison.

One store for every session of the manager; each stream keeps its last 100
events in a deque; ids are random UUIDs; a replay looks the cursor up,
takes its stream, and sends the events after it by iterating the stream's
live deque. An unknown or expired cursor replays nothing (an empty 200),
and the store's stream ids are whatever the transport passes (the bare
JSON-RPC request id), shared by every session.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from uuid import uuid4

from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp_types import JSONRPCMessage

log = logging.getLogger(__name__)


@dataclass
class Entry:
    event_id: EventId
    stream_id: StreamId
    message: JSONRPCMessage | None


class ExampleStyleEventStore(EventStore):
    def __init__(self, max_events_per_stream: int = 100) -> None:
        self.max_events_per_stream = max_events_per_stream
        self.streams: dict[StreamId, deque[Entry]] = {}
        self.index: dict[EventId, Entry] = {}

    async def store_event(self, stream_id: StreamId, message: JSONRPCMessage | None) -> EventId:
        entry = Entry(str(uuid4()), stream_id, message)
        stream = self.streams.setdefault(stream_id, deque(maxlen=self.max_events_per_stream))
        if len(stream) == self.max_events_per_stream:
            self.index.pop(stream[0].event_id, None)
        stream.append(entry)
        self.index[entry.event_id] = entry
        return entry.event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        last = self.index.get(last_event_id)
        if last is None:
            log.warning("event id %s not found", last_event_id)
            return None
        found = False
        for entry in self.streams.get(last.stream_id, deque()):
            if found and entry.message is not None:
                await send_callback(EventMessage(entry.message, entry.event_id))
            elif entry.event_id == last_event_id:
                found = True
        return last.stream_id
