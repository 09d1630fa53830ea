// Interop across a server restart: the official TypeScript SDK client's old
// session gets HTTP 404 on its next request (never a replay from the new
// incarnation), and a fresh initialize works.
//
//   node restart.mjs --url http://127.0.0.1:PORT/mcp \
//       --server-cmd "/path/to/rewind serve --listen 127.0.0.1:PORT --admin-listen 127.0.0.1:PORT2"
//
// The script runs the server itself (twice, same port) so that one Client
// object lives across the restart; the command is split on spaces. The server
// is stopped with SIGTERM (SIGKILL after 10 s) and always stopped on exit.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { Report, http, messages, options, progressProblem, resultText, serverProcess, sleep, watchdog, within } from './lib.mjs';

const opt = options({ url: undefined, 'server-cmd': undefined, 'start-timeout-ms': '60000' });
const url = new URL(opt.url);
const startTimeout = Number(opt['start-timeout-ms']);
watchdog('restart', 2 * startTimeout + 60000);
const rep = new Report('restart');

const server = serverProcess(url, opt['server-cmd'], startTimeout);
const startServer = server.start;
const stopServer = server.stop;

// --- a fetch that records every request the SDK makes -------------------------

function recordingFetch(log) {
    return async (input, init = {}) => {
        const h = new Headers(init.headers);
        const entry = { t: Date.now(), method: init.method ?? 'GET', session: h.get('mcp-session-id'), lastEventId: h.get('last-event-id'), status: null, error: null };
        log.push(entry);
        try {
            const res = await fetch(input, init);
            entry.status = res.status;
            return res;
        } catch (e) {
            entry.error = e?.cause?.code ?? e?.name ?? String(e);
            throw e;
        }
    };
}
const fmt = e => `${e.method} session=${e.session ?? '-'}${e.lastEventId ? ` last-event-id=${e.lastEventId}` : ''} -> ${e.status ?? e.error}`;

// --- the test -------------------------------------------------------------------

async function main() {
    const started1 = await startServer('first start');
    rep.pass('server-start', `port ${url.port} open after ${started1} ms`);

    const log = [];
    const transport = new StreamableHTTPClientTransport(url, { fetch: recordingFetch(log) });
    const client = new Client({ name: 'rewind-interop-restart', version: '0.0.0' });
    const errors = [];
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    await within(10000, 'initialize (first incarnation)', client.connect(transport));
    const oldSession = transport.sessionId;
    if (!oldSession) throw new Error('no Mcp-Session-Id from the first incarnation');
    const oldIds = [];
    const seen = [];
    const r1 = await within(10000, 'progress_stream (first incarnation)', client.callTool({ name: 'progress_stream', arguments: { count: 3, interval_ms: 10 } }, CallToolResultSchema, { onprogress: p => seen.push(p.progress), onresumptiontoken: t => oldIds.push(t) }));
    const p1 = progressProblem(seen, 3);
    rep.check('before-restart-tool-call', !p1 && !r1.isError ? `session ${oldSession}: "${resultText(r1).slice(0, 60)}", ${oldIds.length} event ids` : false, `${p1 ?? ''} result ${JSON.stringify(r1)}`);
    await sleep(300); // let the SDK open its standalone GET stream, as a real client has

    const stop = await stopServer();
    rep.check('graceful-shutdown', stop.graceful ? `SIGTERM -> exit ${stop.code ?? stop.signal} in ${stop.ms} ms` : false, `server still running 10 s after SIGTERM (killed); output: ${server.log.slice(-10).join(' | ')}`);
    const restartAt = Date.now();
    const started2 = await startServer('restart');
    rep.pass('server-restart', `port ${url.port} open again after ${started2} ms`);

    // The old client's next request.
    let outcome;
    try {
        const r = await within(10000, 'tools/call with the old session', client.callTool({ name: 'progress_stream', arguments: { count: 2, interval_ms: 10 } }, CallToolResultSchema));
        outcome = `succeeded: ${JSON.stringify(r).slice(0, 200)}`;
    } catch (e) {
        outcome = e;
    }
    rep.check('old-session-404', outcome instanceof StreamableHTTPError && outcome.code === 404 ? `SDK callTool rejected: ${outcome.message.slice(0, 100)}` : false, `expected the SDK to reject with StreamableHTTPError 404, got ${outcome instanceof Error ? `${outcome.constructor.name} code=${outcome.code}: ${outcome.message}` : outcome}`);

    // Whatever else the SDK sent on the old session after the restart (its own GET reconnects) must be 404 too.
    await sleep(200);
    const after = log.filter(e => e.t >= restartAt && e.session === oldSession && e.status !== null);
    const wrong = after.filter(e => e.status !== 404);
    rep.check('old-session-every-request-404', wrong.length === 0 ? `${after.length} request(s) on the old session after the restart: ${after.map(fmt).join('; ')}` : false, `non-404 answers on the old session: ${wrong.map(fmt).join('; ')}`);

    // The old cursor from the previous incarnation, with the old session, over plain HTTP.
    const oldCursor = oldIds[oldIds.length - 2] ?? oldIds[0];
    const stale = await http(url, { method: 'GET', session: oldSession, lastEventId: oldCursor, headers: { accept: 'text/event-stream' }, ms: 1500 });
    rep.check('old-session-old-cursor-404', stale.status === 404 ? `GET session=${oldSession} Last-Event-ID=${oldCursor} -> 404` : false, `GET with the old session and cursor ${oldCursor} -> HTTP ${stale.status}, expected 404; body: ${stale.raw.slice(0, 300)}`);
    await client.close().catch(() => {});

    // A fresh initialize works, on a new session whose ids never repeat the old ones.
    const transport2 = new StreamableHTTPClientTransport(url);
    const client2 = new Client({ name: 'rewind-interop-restart-fresh', version: '0.0.0' });
    await within(10000, 'fresh initialize after the restart', client2.connect(transport2));
    const newSession = transport2.sessionId;
    rep.check('fresh-initialize', newSession && newSession !== oldSession ? `new session ${newSession}` : false, `fresh initialize gave session ${newSession} (old ${oldSession})`);
    const newIds = [];
    const seen2 = [];
    const r2 = await within(10000, 'progress_stream on the fresh session', client2.callTool({ name: 'progress_stream', arguments: { count: 3, interval_ms: 10 } }, CallToolResultSchema, { onprogress: p => seen2.push(p.progress), onresumptiontoken: t => newIds.push(t) }));
    const p2 = progressProblem(seen2, 3);
    rep.check('fresh-session-tool-call', !p2 && !r2.isError ? `"${resultText(r2).slice(0, 60)}"` : false, `${p2 ?? ''} result ${JSON.stringify(r2)}`);
    const reused = newIds.filter(id => oldIds.includes(id));
    rep.check('event-ids-not-reused', reused.length === 0 && newIds.length > 0 ? `old ids [${oldIds.join(', ')}], new ids [${newIds.join(', ')}]` : false, `ids of the new incarnation repeat old ones: [${reused.join(', ')}] (new: [${newIds.join(', ')}])`);

    // The fresh session presenting the previous incarnation's cursor: another session's cursor.
    const pv = transport2.protocolVersion;
    const foreign = await http(url, { method: 'GET', session: newSession, protocolVersion: pv, lastEventId: oldCursor, headers: { accept: 'text/event-stream' }, ms: 1500 });
    const leak = messages(foreign).some(m => m.method !== undefined || m.result !== undefined); // a JSON-RPC error body is fine
    rep.check('fresh-session-old-cursor-409', foreign.status === 409 && !leak ? `GET session=${newSession} Last-Event-ID=${oldCursor} -> 409` : false, `fresh session presenting the old incarnation's cursor ${oldCursor} -> HTTP ${foreign.status}${leak ? ' WITH MESSAGES' : ''}, expected 409; body: ${foreign.raw.slice(0, 300)}`);
    await client2.close().catch(() => {});

    const stop2 = await stopServer();
    rep.check('graceful-shutdown-2', stop2.graceful ? `SIGTERM -> exit ${stop2.code ?? stop2.signal} in ${stop2.ms} ms` : false, `server still running 10 s after SIGTERM (killed)`);
    const unexpectedErrors = errors.filter(e => !/404|Not Found|Session not found|SSE stream disconnected|reconnect|ECONNREFUSED|fetch failed|terminated|aborted/i.test(e));
    if (unexpectedErrors.length) console.log(`note: SDK onerror reported: ${unexpectedErrors.join(' | ')}`);
}

await rep.run('main', main);
if (rep.failed && server.log.length) console.log(`--- last server output ---\n${server.log.slice(-30).join('\n')}`);
server.killOnExit();
rep.finish();
