// Interop, cluster mode: the official TypeScript SDK client initializes
// against node A of a `rewind serve --cluster` group, starts a
// `progress_stream` call there, is cut (its transport closed: every fetch
// aborted), and resumes the call through node B (another node URL, same
// session id) with the SDK's resumption token (GET + Last-Event-ID). Node B
// serves the rest from the session's Redis Stream: every progress
// notification exactly once, in order, then the result.
//
//   node cluster-resume.mjs --url-a http://127.0.0.1:P1/mcp --url-b http://127.0.0.1:P2/mcp \
//       [--url-c http://127.0.0.1:P3/mcp] [--count 40] [--interval-ms 50] [--cut-after 5]
//
// Cases (each on its own session, initialized on node A):
//   live   resumed on node B at once, while the tool still runs on node A:
//          replay from Redis, then live delivery through Redis.
//   late   resumed on node C (B if not given) after the tool finished: the
//          rest and the result all come from Redis.
//   call-b the resumed session goes on: a new call posted to node B (which
//          forwards it to node A) runs to its result.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ProgressNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { Report, options, progressProblem, resultText, sleep, watchdog, within } from './lib.mjs';

const opt = options({ 'url-a': undefined, 'url-b': undefined, 'url-c': '', count: '40', 'interval-ms': '50', 'cut-after': '5' });
const urlA = new URL(opt['url-a']);
const urlB = new URL(opt['url-b']);
const urlC = new URL(opt['url-c'] || opt['url-b']);
const count = Number(opt.count);
const intervalMs = Number(opt['interval-ms']);
const cutAfter = Number(opt['cut-after']);
const toolArgs = { count, interval_ms: intervalMs };
const toolMs = count * intervalMs;
const step = Math.max(5000, 3 * toolMs); // deadline of each awaited step
watchdog('cluster-resume', 6 * step + 30000);

const rep = new Report('cluster-resume');
const noRetry = { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 };
// Errors the SDK reports through `onerror` when we cut a connection on purpose.
const expectedError = /SSE stream disconnected|Maximum reconnection attempts|AbortError|aborted/i;

async function connect(name, url) {
    const transport = new StreamableHTTPClientTransport(url, { reconnectionOptions: noRetry });
    const client = new Client({ name: `rewind-interop-${name}`, version: '0.0.0' });
    const errors = [];
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    await within(step, `${name}: initialize on ${url}`, client.connect(transport));
    if (!transport.sessionId) throw new Error(`${name}: ${url} gave no Mcp-Session-Id on initialize`);
    return { transport, client, errors };
}

/** A Client on `url` for an existing session (no initialize), collecting every progress notification. */
async function attach(name, url, sessionId, protocolVersion, seen, tokensSeen, errors) {
    const transport = new StreamableHTTPClientTransport(url, { sessionId, reconnectionOptions: noRetry });
    if (protocolVersion) transport.setProtocolVersion(protocolVersion);
    const client = new Client({ name: `rewind-interop-${name}`, version: '0.0.0' });
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    // The new Client has no handler registered for the first call's progressToken: take them all.
    client.setNotificationHandler(ProgressNotificationSchema, n => {
        tokensSeen.add(JSON.stringify(n.params.progressToken));
        seen.push(n.params.progress);
    });
    await within(step, `${name}: connect on session ${sessionId} at ${url}`, client.connect(transport)); // session id set: no initialize
    return { transport, client };
}

async function cutAndResume(name, resumeUrl, resumeDelayMs) {
    const a = await connect(`${name}-a`, urlA);
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
    first.catch(() => {}); // rejected when its client closes
    const early = await within(step, `${name}: first ${cutAfter} progress notifications from ${urlA}`, Promise.race([reached.then(() => null), first.then(r => r)]));
    if (early) throw new Error(`${name}: the tool finished before ${cutAfter} progress notifications arrived; seen [${seen}]`);
    await a.client.close(); // the cut: aborts every fetch of this transport; sends no DELETE
    const seenAtCut = seen.length;
    const cutToken = token;
    if (!token) throw new Error(`${name}: no resumption token recorded before the cut`);
    await sleep(resumeDelayMs);

    const errors = [...a.errors];
    const tokensSeen = new Set();
    const b = await attach(`${name}-b`, resumeUrl, sessionId, protocolVersion, seen, tokensSeen, errors);
    let result;
    try {
        result = await within(step + toolMs, `${name}: result after resuming from ${token} on ${resumeUrl}`, b.client.request({ method: 'tools/call', params: { name: 'progress_stream', arguments: toolArgs } }, CallToolResultSchema, { resumptionToken: token, onresumptiontoken: t => (token = t), timeout: 4 * step }));
    } catch (e) {
        rep.fail(`${name}/result`, `${e.message}; progress seen [${seen}]; SDK errors: ${errors.join(' | ')}`);
        await b.client.close().catch(() => {});
        return null;
    }
    await sleep(Math.max(300, 4 * intervalMs)); // late duplicates would land here
    const problem = progressProblem(seen, count);
    rep.check(`${name}/progress-exactly-once`, problem ? false : `1..${count} in order (${seenAtCut} from ${urlA.host} before the cut, ${count - seenAtCut} from ${resumeUrl.host} after)`, problem);
    rep.check(`${name}/result`, result && !result.isError ? `"${resultText(result).slice(0, 80)}"` : false, `no successful result: ${JSON.stringify(result)}`);
    rep.check(`${name}/resumption-token`, cutToken ? `resumed on ${resumeUrl.host} from ${cutToken} (minted on ${urlA.host})` : false, 'no event id before the cut');
    rep.check(`${name}/same-progress-token`, tokensSeen.size <= 1 ? `progressToken ${[...tokensSeen][0] ?? '(none after cut)'}` : false, `progress notifications after the resume carried several tokens: ${[...tokensSeen]}`);
    const bad = errors.filter(e => !expectedError.test(e));
    rep.check(`${name}/no-client-errors`, bad.length === 0, `SDK onerror reported: ${bad.join(' | ')}`);
    await b.client.close().catch(() => {});
    return { sessionId, protocolVersion };
}

console.log(`cluster-resume: initialize + call on ${urlA}, resume on ${urlB} (live) and ${urlC} (late); progress_stream count=${count} interval_ms=${intervalMs}, cut after ${cutAfter}`);
let live = null;
await rep.run('live', async () => {
    live = await cutAndResume('live', urlB, 0);
});
await rep.run('late', () => cutAndResume('late', urlC, toolMs + 500));
await rep.run('call-b', async () => {
    if (!live) throw new Error('no session left from the live case');
    const seen = [];
    const errors = [];
    const tokens = new Set();
    const b = await attach('call-b', urlB, live.sessionId, live.protocolVersion, seen, tokens, errors);
    const n = 5;
    const result = await within(step, `call-b: a new call on ${urlB}`, b.client.callTool({ name: 'progress_stream', arguments: { count: n, interval_ms: 10 } }, CallToolResultSchema, { onprogress: () => {}, timeout: 4 * step }));
    const problem = progressProblem(seen, n);
    rep.check('call-b/result', result && !result.isError && !problem ? `"${resultText(result).slice(0, 80)}" after progress [${seen}]` : false, `result ${JSON.stringify(result)}; ${problem ?? 'progress ok'}; SDK errors: ${errors.join(' | ')}`);
    await b.client.close().catch(() => {});
});
rep.finish();
