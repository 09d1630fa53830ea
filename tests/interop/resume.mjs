// Interop: the official TypeScript SDK client resumes a `progress_stream`
// call through `rewind serve` after its connection is cut mid-stream, and
// sees every progress notification exactly once, in order, then the result.
//
//   node resume.mjs --url http://127.0.0.1:PORT/mcp [--count 20] [--interval-ms 50] [--cut-after 5]
//
// Cases (each on its own session):
//   same-client-live   the POST stream's socket is aborted after `cut-after`
//                      notifications; the same Client resumes at once with the
//                      SDK's resumption token (request option `resumptionToken`,
//                      a GET with Last-Event-ID): replay, then live delivery.
//   same-client-late   as above, but resumes only after the tool has finished:
//                      the rest of the notifications and the result all come
//                      from the server's buffer.
//   new-client         the first Client is closed (the SDK aborts all its
//                      fetches); a new transport on the same session id and a
//                      new Client resume with the recorded token, as the SDK's
//                      own `simpleStreamableHttp` example does.
//   sdk-auto           the socket is cut and the SDK reconnects by itself
//                      (its default reconnection: GET with the last event id,
//                      after the server's `retry` delay); the original
//                      callTool promise resolves.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { Report, options, progressProblem, resultText, sleep, watchdog, within } from './lib.mjs';

const opt = options({ url: undefined, count: '20', 'interval-ms': '50', 'cut-after': '5' });
const url = new URL(opt.url);
const count = Number(opt.count);
const intervalMs = Number(opt['interval-ms']);
const cutAfter = Number(opt['cut-after']);
const toolArgs = { count, interval_ms: intervalMs };
const toolMs = count * intervalMs;
const step = Math.max(5000, 3 * toolMs); // deadline of each awaited step
watchdog('resume', 8 * step + 30000);

const rep = new Report('resume');
const noRetry = { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 };
// Errors the SDK reports through `onerror` when we cut a connection on purpose.
const expectedError = /SSE stream disconnected|Maximum reconnection attempts|AbortError|aborted/i;

/** A fetch whose `progress_stream` POSTs can be aborted from outside (a real socket cut). */
function cuttableFetch() {
    const state = { controllers: [], cuts: 0 };
    state.fetch = (input, init = {}) => {
        const isTool = init.method === 'POST' && typeof init.body === 'string' && init.body.includes('"progress_stream"');
        if (!isTool) return fetch(input, init);
        const ctrl = new AbortController();
        state.controllers.push(ctrl);
        const signal = init.signal ? AbortSignal.any([init.signal, ctrl.signal]) : ctrl.signal;
        return fetch(input, { ...init, signal });
    };
    state.cut = () => {
        state.cuts++;
        for (const c of state.controllers) c.abort(new Error('interop test: connection cut'));
    };
    return state;
}

async function connect(name, transportOpts) {
    const transport = new StreamableHTTPClientTransport(url, transportOpts);
    const client = new Client({ name: `rewind-interop-${name}`, version: '0.0.0' });
    const errors = [];
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    await within(step, `${name}: initialize`, client.connect(transport));
    if (!transport.sessionId) throw new Error(`${name}: server gave no Mcp-Session-Id on initialize`);
    return { transport, client, errors };
}

function unexpected(errors) {
    return errors.filter(e => !expectedError.test(e));
}

/** Checks shared by every case; `seen` is the list of progress values in arrival order. */
async function verdict(name, { seen, result, errors, token, seenAtCut }) {
    await sleep(Math.max(300, 4 * intervalMs)); // late duplicates would land here
    const problem = progressProblem(seen, count);
    rep.check(`${name}/progress-exactly-once`, problem ? false : `1..${count} in order (${seenAtCut} before the cut, ${count - seenAtCut} after)`, problem);
    rep.check(`${name}/result`, result && !result.isError ? `"${resultText(result).slice(0, 80)}"` : false, `no successful result: ${JSON.stringify(result)}`);
    rep.check(`${name}/resumption-token`, token ? `last event id before the cut: ${token}` : false, 'the SDK reported no event id (onresumptiontoken) before the cut');
    const bad = unexpected(errors);
    rep.check(`${name}/no-client-errors`, bad.length === 0, `SDK onerror reported: ${bad.join(' | ')}`);
}

async function sameClient(name, resumeDelayMs) {
    const cut = cuttableFetch();
    const { client, errors } = await connect(name, { fetch: cut.fetch, reconnectionOptions: noRetry });
    const seen = [];
    let token;
    let cutReached;
    const reached = new Promise(r => (cutReached = r));
    const first = client.callTool({ name: 'progress_stream', arguments: toolArgs }, CallToolResultSchema, {
        onprogress: p => {
            seen.push(p.progress);
            if (seen.length === cutAfter) {
                cut.cut();
                cutReached();
            }
        },
        onresumptiontoken: t => (token = t),
        timeout: 4 * step
    });
    first.catch(() => {}); // superseded by the resumed request; rejected at close
    const early = await within(step, `${name}: first ${cutAfter} progress notifications`, Promise.race([reached.then(() => null), first.then(r => r)]));
    if (early) throw new Error(`${name}: the tool finished (${resultText(early)}) before ${cutAfter} progress notifications arrived; seen [${seen}]`);
    await sleep(resumeDelayMs);
    const seenAtCut = seen.length;
    const cutToken = token;
    if (!token) throw new Error(`${name}: no resumption token recorded before the cut`);
    // The SDK's resume: the request is not re-sent; a GET with Last-Event-ID is opened and the
    // result that comes back on it is matched to this request.
    const resumed = client.callTool({ name: 'progress_stream', arguments: toolArgs }, CallToolResultSchema, {
        resumptionToken: token,
        onresumptiontoken: t => (token = t),
        timeout: 4 * step
    });
    let result;
    try {
        result = await within(step + toolMs, `${name}: result after resuming from ${token}`, resumed);
    } catch (e) {
        rep.fail(`${name}/result`, `${e.message}; progress seen [${seen}]; SDK errors: ${errors.join(' | ')}`);
        await client.close().catch(() => {});
        return;
    }
    await verdict(name, { seen, result, errors, token: cutToken, seenAtCut });
    await client.close().catch(() => {});
}

async function newClient(name) {
    const a = await connect(`${name}-a`, { reconnectionOptions: noRetry });
    const sessionId = a.transport.sessionId;
    const protocolVersion = a.transport.protocolVersion;
    const seen = [];
    let token;
    let cutReached;
    const reached = new Promise(r => (cutReached = r));
    const first = a.client.callTool({ name: 'progress_stream', arguments: toolArgs }, CallToolResultSchema, {
        onprogress: p => {
            seen.push(p.progress);
            if (seen.length === cutAfter) cutReached();
        },
        onresumptiontoken: t => (token = t),
        timeout: 4 * step
    });
    first.catch(() => {});
    const early = await within(step, `${name}: first ${cutAfter} progress notifications`, Promise.race([reached.then(() => null), first.then(r => r)]));
    if (early) throw new Error(`${name}: the tool finished before ${cutAfter} progress notifications arrived`);
    await a.client.close(); // aborts every fetch of this transport; sends no DELETE
    const seenAtCut = seen.length;
    const cutToken = token;
    if (!token) throw new Error(`${name}: no resumption token recorded before the cut`);

    const transport = new StreamableHTTPClientTransport(url, { sessionId, reconnectionOptions: noRetry });
    if (protocolVersion) transport.setProtocolVersion(protocolVersion);
    const client = new Client({ name: `rewind-interop-${name}-b`, version: '0.0.0' });
    const errors = [...a.errors];
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    const tokensSeen = new Set();
    // The new Client has no handler registered for the first call's progressToken: take them all.
    client.setNotificationHandler(ProgressNotificationSchema, n => {
        tokensSeen.add(JSON.stringify(n.params.progressToken));
        seen.push(n.params.progress);
    });
    await within(step, `${name}: connect on session ${sessionId}`, client.connect(transport)); // no initialize: session id set
    let result;
    try {
        result = await within(step + toolMs, `${name}: result after resuming from ${token}`, client.request({ method: 'tools/call', params: { name: 'progress_stream', arguments: toolArgs } }, CallToolResultSchema, { resumptionToken: token, onresumptiontoken: t => (token = t), timeout: 4 * step }));
    } catch (e) {
        rep.fail(`${name}/result`, `${e.message}; progress seen [${seen}]; SDK errors: ${errors.join(' | ')}`);
        await client.close().catch(() => {});
        return;
    }
    rep.check(`${name}/same-progress-token`, tokensSeen.size <= 1 ? `progressToken ${[...tokensSeen][0] ?? '(none after cut)'}` : false, `progress notifications after the resume carried several tokens: ${[...tokensSeen]}`);
    await verdict(name, { seen, result, errors, token: cutToken, seenAtCut });
    await client.close().catch(() => {});
}

async function sdkAuto(name) {
    const cut = cuttableFetch();
    // The SDK's own reconnection, as an application gets it by default (delay: the server's `retry`).
    const { client, errors } = await connect(name, { fetch: cut.fetch, reconnectionOptions: { maxRetries: 2, initialReconnectionDelay: 200, maxReconnectionDelay: 2000, reconnectionDelayGrowFactor: 1.5 } });
    const seen = [];
    let token;
    let cutToken;
    let seenAtCut = 0;
    const first = client.callTool({ name: 'progress_stream', arguments: toolArgs }, CallToolResultSchema, {
        onprogress: p => {
            seen.push(p.progress);
            if (seen.length === cutAfter) {
                seenAtCut = seen.length;
                cutToken = token;
                cut.cut();
            }
        },
        onresumptiontoken: t => (token = t),
        timeout: 4 * step
    });
    let result;
    try {
        // The server's retry field may be a few seconds; allow for it.
        result = await within(2 * step + toolMs + 10000, `${name}: result through the SDK's automatic reconnection`, first);
    } catch (e) {
        rep.fail(`${name}/result`, `${e.message}; progress seen [${seen}]; SDK errors: ${errors.join(' | ')}`);
        await client.close().catch(() => {});
        return;
    }
    rep.check(`${name}/cut-happened`, cut.cuts === 1 ? `cut after ${seenAtCut}` : false, `the connection was cut ${cut.cuts} times (tool ended before ${cutAfter} notifications?)`);
    await verdict(name, { seen, result, errors, token: cutToken, seenAtCut });
    await client.close().catch(() => {});
}

console.log(`resume: ${url} progress_stream count=${count} interval_ms=${intervalMs}, cut after ${cutAfter}`);
await rep.run('same-client-live', () => sameClient('same-client-live', 0));
await rep.run('same-client-late', () => sameClient('same-client-late', toolMs + 500));
await rep.run('new-client', () => newClient('new-client'));
await rep.run('sdk-auto', () => sdkAuto('sdk-auto'));
rep.finish();
