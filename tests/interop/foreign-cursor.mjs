// Tenant boundary over plain HTTP: session B presenting session A's event ids
// as Last-Event-ID gets 409 and not one byte of A's events.
//
//   node foreign-cursor.mjs --url http://127.0.0.1:PORT/mcp
//
// A runs `progress_stream` with a progressToken that is a random marker, so any
// of A's progress notifications in B's answer is detectable. As a control, A
// itself resuming from one of its own ids gets 200 and the rest of its stream,
// which shows the ids B presents are live, in-window cursors.

import { randomUUID } from 'node:crypto';
import { Report, http, initialize, isResponseTo, messages, options, watchdog } from './lib.mjs';

const opt = options({ url: undefined });
const url = opt.url;
watchdog('foreign-cursor', 60000);
const rep = new Report('foreign-cursor');

const marker = `tenant-A-secret-${randomUUID()}`;
const count = 5;

async function main() {
    const a = await initialize(url, 'rewind-interop-tenant-a');
    const b = await initialize(url, 'rewind-interop-tenant-b');
    rep.check('distinct-sessions', a.session !== b.session ? `A=${a.session} B=${b.session}` : false, `both sessions got id ${a.session}`);

    const call = await http(url, {
        session: a.session,
        protocolVersion: a.protocolVersion,
        body: { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'progress_stream', arguments: { count, interval_ms: 10 }, _meta: { progressToken: marker } } },
        until: isResponseTo(7),
        ms: 10000
    });
    const aIds = call.events.map(e => e.id).filter(id => id);
    const aData = call.events.map(e => e.data).filter(d => d && d.length > 0);
    const progress = messages(call).filter(m => m.method === 'notifications/progress');
    if (!rep.check('tenant-a-stream', call.status === 200 && aIds.length >= 2 && progress.length === count && messages(call).some(m => m.id === 7) ? `${aIds.length} event ids, ${progress.length} progress notifications, result` : false, `A's tools/call answered HTTP ${call.status}, content-type ${call.headers?.get('content-type')}, ${aIds.length} ids, ${progress.length} progress; body: ${call.raw.slice(0, 500)}`)) return;

    // Every id A was given: the priming event's, each notification's, the result's.
    for (const [i, id] of aIds.entries()) {
        const ans = await http(url, { method: 'GET', session: b.session, protocolVersion: b.protocolVersion, lastEventId: id, headers: { accept: 'text/event-stream' }, ms: 1500 });
        const leaked = ans.raw.includes(marker) || aData.some(d => ans.raw.includes(d));
        const what = `B GET Last-Event-ID=${id} (A's event ${i + 1}/${aIds.length}) -> HTTP ${ans.status}${ans.timedOut ? ' (stream held open)' : ''}, ${ans.raw.length} body bytes`;
        rep.check(`b-presents-a-cursor-${i + 1}`, ans.status === 409 && !leaked ? what : false, `${what}; expected 409${leaked ? '; BODY CONTAINS A\'S EVENT DATA' : ''}; body: ${ans.raw.slice(0, 400)}`);
    }

    // Control: the same cursor is honoured for its owner (replay after it, then the result).
    const own = aIds[1];
    const ctl = await http(url, { method: 'GET', session: a.session, protocolVersion: a.protocolVersion, lastEventId: own, headers: { accept: 'text/event-stream' }, until: isResponseTo(7), ms: 3000 });
    const replayed = messages(ctl).filter(m => m.method === 'notifications/progress').map(m => m.params.progress);
    const ownIdx = call.events.findIndex(e => e.id === own);
    const afterOwn = messages({ events: call.events.slice(ownIdx + 1) }).filter(m => m.method === 'notifications/progress').map(m => m.params.progress);
    const sameReplay = replayed.length === afterOwn.length && replayed.every((v, k) => v === afterOwn[k]);
    rep.check('a-resumes-own-cursor', ctl.status === 200 && sameReplay && messages(ctl).some(m => m.id === 7) ? `A GET Last-Event-ID=${own} -> 200, replayed progress [${replayed}] and the result` : false, `A GET Last-Event-ID=${own} -> HTTP ${ctl.status}, replayed progress [${replayed}] (expected [${afterOwn}] then the result); body: ${ctl.raw.slice(0, 400)}`);

    // The other rows reachable from outside without knowing the id format.
    const noSession = await http(url, { method: 'GET', lastEventId: aIds[1], headers: { accept: 'text/event-stream' }, ms: 1500 });
    rep.check('no-session-with-cursor', noSession.status === 400 && !noSession.raw.includes(marker) ? 'GET without Mcp-Session-Id, with A\'s cursor -> 400' : false, `GET without session, Last-Event-ID=${aIds[1]} -> HTTP ${noSession.status}, expected 400; body: ${noSession.raw.slice(0, 300)}`);
    const malformed2 = await http(url, { method: 'GET', session: b.session, protocolVersion: b.protocolVersion, lastEventId: 'garbage', headers: { accept: 'text/event-stream' }, ms: 1500 });
    rep.check('malformed-cursor', malformed2.status === 400 ? 'Last-Event-ID=garbage -> 400' : false, `B GET Last-Event-ID=garbage -> HTTP ${malformed2.status}, expected 400; body: ${malformed2.raw.slice(0, 300)}`);
    // A well-formed id that names no session (A's id with its last character changed), and an ended session.
    const unknown = a.session.slice(0, -1) + (a.session.endsWith('0') ? '1' : '0');
    const gone = await http(url, { method: 'GET', session: unknown, protocolVersion: a.protocolVersion, lastEventId: aIds[1], headers: { accept: 'text/event-stream' }, ms: 1500 });
    rep.check('unknown-session-with-cursor', gone.status === 404 && !gone.raw.includes(marker) ? `unknown Mcp-Session-Id ${unknown} with A's cursor -> 404` : false, `GET with unknown session ${unknown}, Last-Event-ID=${aIds[1]} -> HTTP ${gone.status}, expected 404; body: ${gone.raw.slice(0, 300)}`);
    const c = await initialize(url, 'rewind-interop-tenant-c');
    const cCall = await http(url, { session: c.session, protocolVersion: c.protocolVersion, body: { jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'progress_stream', arguments: { count: 2, interval_ms: 10 }, _meta: { progressToken: marker } } }, until: isResponseTo(3), ms: 5000 });
    const cId = cCall.events.map(e => e.id).filter(id => id)[1];
    const del = await http(url, { method: 'DELETE', session: c.session, protocolVersion: c.protocolVersion, ms: 3000 });
    const ended = await http(url, { method: 'GET', session: c.session, protocolVersion: c.protocolVersion, lastEventId: cId, headers: { accept: 'text/event-stream' }, ms: 1500 });
    rep.check('ended-session-with-cursor', del.status >= 200 && del.status < 300 && ended.status === 404 && !ended.raw.includes(marker) ? `DELETE -> ${del.status}; then GET with its own cursor ${cId} -> 404` : false, `DELETE session C -> HTTP ${del.status}; GET with C's ended session and cursor ${cId} -> HTTP ${ended.status}, expected 404; body: ${ended.raw.slice(0, 300)}`);

    // B is still usable afterwards, and A's session too.
    for (const [who, s] of [['a', a], ['b', b]]) {
        const ping = await http(url, { session: s.session, protocolVersion: s.protocolVersion, body: { jsonrpc: '2.0', id: 99, method: 'ping' }, until: isResponseTo(99) });
        rep.check(`session-${who}-still-works`, ping.status === 200 && messages(ping).some(m => m.id === 99 && m.result) ? `ping on ${who.toUpperCase()} -> 200` : false, `ping on ${who.toUpperCase()} -> HTTP ${ping.status}: ${ping.raw.slice(0, 300)}`);
    }
}

await rep.run('main', main);
rep.finish();
