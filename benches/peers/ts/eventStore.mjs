// An in-memory EventStore that behaves like the TypeScript SDK's example
// store (the SDK example `InMemoryEventStore`), written for this comparison:
// every event is kept (nothing is ever dropped), its id is
// `${streamId}_${Date.now()}_${random}`, and a replay sorts every stored
// event by id and sends those of the cursor's stream that sort after the
// cursor. Events stored in the same millisecond therefore replay in the
// order of their random suffixes, not the order they were sent, and an
// unknown cursor replays nothing (an empty 200).

export class ExampleStyleEventStore {
    constructor() {
        this.events = new Map();
    }

    async storeEvent(streamId, message) {
        const eventId = `${streamId}_${Date.now()}_${Math.random().toString(36).slice(2, 10)}`;
        this.events.set(eventId, { streamId, message });
        return eventId;
    }

    async replayEventsAfter(lastEventId, { send }) {
        const known = lastEventId && this.events.get(lastEventId);
        if (!known) return '';
        const streamId = lastEventId.split('_')[0];
        const ordered = [...this.events.entries()].sort((a, b) => a[0].localeCompare(b[0]));
        let after = false;
        for (const [eventId, { streamId: s, message }] of ordered) {
            if (s !== streamId) continue;
            if (eventId === lastEventId) {
                after = true;
                continue;
            }
            if (after) await send(eventId, message);
        }
        return streamId;
    }
}
