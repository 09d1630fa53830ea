// Interop across a crash of a durable server: the official TypeScript SDK
// client keeps one session while `rewind serve --data-dir` is SIGKILLed in
// the middle of a streaming tool call and started again on the same
// directory. The client resumes the call with its resumption token (a GET
// with Last-Event-ID) and receives every progress notification the server
// had stored exactly once and in order, then the explicit error for the call
// the crash interrupted; then the same session, without initializing again,
// runs a new call to completion.
//
//   node restart-durable.mjs --url http://127.0.0.1:PORT/mcp \
//       --server-cmd "/path/to/rewind serve --listen 127.0.0.1:PORT --admin-listen 127.0.0.1:PORT2 --data-dir DIR"
//
// The script runs the server itself (twice, same port, same data directory)
// so that one Client object lives across the crash; the command is split on
// spaces. The server is always stopped on exit.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';
import { Report, options, progressProblem, resultText, serverProcess, sleep, watchdog, within } from './lib.mjs';

const opt = options({ url: undefined, 'server-cmd': undefined, 'start-timeout-ms': '60000', 'cut-after': '5' });
const url = new URL(opt.url);
const startTimeout = Number(opt['start-timeout-ms']);
const cutAfter = Number(opt['cut-after']);
watchdog('restart-durable', 2 * startTimeout + 60000);
const rep = new Report('restart-durable');
// No automatic reconnects: the resume below is the client's own, explicit one.
const noRetry = { maxRetries: 0, initialReconnectionDelay: 100, maxReconnectionDelay: 100, reconnectionDelayGrowFactor: 1 };

const server = serverProcess(url, opt['server-cmd'], startTimeout);
const startServer = server.start;
const killServer = server.kill;

async function main() {
    const started1 = await startServer('first start');
    rep.pass('server-start', `port ${url.port} open after ${started1} ms`);

    // A network that stops delivering the call's stream once `frozen` is set
    // (the server goes on storing events the client never sees), so the
    // resume after the restart has stored events to replay.
    let frozen = false;
    const freezingFetch = async (input, init = {}) => {
        const res = await fetch(input, init);
        const isCall = init.method === 'POST' && typeof init.body === 'string' && init.body.includes('progress_stream');
        if (!isCall || !res.body) return res;
        const stall = new Promise(() => {});
        const gate = new TransformStream({
            async transform(chunk, ctl) {
                if (frozen) await stall;
                ctl.enqueue(chunk);
            }
        });
        return new Response(res.body.pipeThrough(gate), { status: res.status, statusText: res.statusText, headers: res.headers });
    };
    const transport = new StreamableHTTPClientTransport(url, { reconnectionOptions: noRetry, fetch: freezingFetch });
    const client = new Client({ name: 'rewind-interop-restart-durable', version: '0.0.0' });
    const errors = [];
    client.onerror = e => errors.push(e instanceof Error ? e.message : String(e));
    await within(10000, 'initialize', client.connect(transport));
    const session = transport.sessionId;
    if (!session) throw new Error('no Mcp-Session-Id from the server');

    // A long call; the server is killed after `cutAfter` progress notifications.
    const seen = [];
    let token;
    let reachedCut;
    const reached = new Promise(r => (reachedCut = r));
    const args = { count: 40, interval_ms: 100 };
    const first = client.callTool({ name: 'progress_stream', arguments: args }, CallToolResultSchema, {
        onprogress: p => {
            seen.push(p.progress);
            if (seen.length === cutAfter) {
                frozen = true;
                reachedCut();
            }
        },
        onresumptiontoken: t => (token = t),
        timeout: 60000
    });
    // Its connection dies with the server. The restart's error comes back with
    // the original request id, so the SDK may hand it to this promise rather
    // than to the resumed request below (it re-maps the ids of results on a
    // resumed stream, not of errors): either one counts.
    const firstDone = first.then(r => ({ result: r }), e => ({ error: e }));
    await within(15000, `first ${cutAfter} progress notifications`, reached);
    await sleep(650); // the server stores about six more the client does not see
    const killed = await killServer();
    frozen = false; // the network is back for everything after the restart
    const seenAtKill = seen.length;
    const tokenAtKill = token;
    rep.check('sigkill', killed.signal === 'SIGKILL' ? `killed after ${seenAtKill} progress notifications, last event id ${tokenAtKill}` : false, `server exit: ${JSON.stringify(killed)}`);
    if (!tokenAtKill) throw new Error('the SDK reported no event id (onresumptiontoken) before the kill');

    const started2 = await startServer('restart on the same data directory');
    rep.pass('server-restart', `port ${url.port} open again after ${started2} ms`);

    // The SDK's resume of the interrupted call: a GET with Last-Event-ID on
    // the same session. The call is not re-run by the restarted server; its
    // stream holds what was stored, then the restart's error for it.
    const isRestartError = e => e && e.code === -32603 && /restarted/i.test(e.message);
    const resumed = client
        .request({ method: 'tools/call', params: { name: 'progress_stream', arguments: args } }, CallToolResultSchema, { resumptionToken: tokenAtKill, onresumptiontoken: t => (token = t), timeout: 15000 })
        .then(r => ({ result: r }), e => ({ error: e }));
    let outcome;
    try {
        outcome = await within(
            16000,
            `resume from ${tokenAtKill}`,
            new Promise(resolve => {
                resumed.then(o => resolve({ via: 'the resumed request', ...o }));
                firstDone.then(o => {
                    if (o.result || isRestartError(o.error)) resolve({ via: 'the original request', ...o });
                });
            })
        );
    } catch (e) {
        outcome = { via: 'neither', error: e };
    }
    const stored = seen.length;
    const p = progressProblem(seen, stored);
    rep.check('progress-exactly-once', !p && stored > seenAtKill ? `progress 1..${stored} exactly once in order (${seenAtKill} before the kill, ${stored - seenAtKill} replayed after the restart)` : false, `${p ?? `nothing replayed after the restart: ${stored} progress values, ${seenAtKill} seen before the kill`}`);
    const err = outcome.error;
    rep.check('interrupted-call-answered', isRestartError(err) ? `the interrupted call got the restart's error (on ${outcome.via}): ${err.message.slice(0, 120)}` : false, `expected the JSON-RPC error -32603 "the server restarted ...", got ${err ? `${err.constructor.name} code=${err.code}: ${err.message}` : `a result: ${JSON.stringify(outcome.result).slice(0, 200)}`}; SDK errors: ${errors.join(' | ')}`);

    // The session goes on: same id, no initialize, a new call runs to the end.
    const seen2 = [];
    let r2;
    try {
        r2 = await within(15000, 'a new call on the restored session', client.callTool({ name: 'progress_stream', arguments: { count: 5, interval_ms: 10 } }, CallToolResultSchema, { onprogress: q => seen2.push(q.progress), timeout: 15000 }));
    } catch (e) {
        r2 = { isError: true, error: e.message };
    }
    const p2 = progressProblem(seen2, 5);
    rep.check('session-continues', !p2 && !r2.isError && transport.sessionId === session ? `session ${session} without initialize: "${resultText(r2).slice(0, 60)}", progress 1..5` : false, `${p2 ?? ''} result ${JSON.stringify(r2).slice(0, 300)}; session ${transport.sessionId} (was ${session})`);
    await client.close().catch(() => {});
    await killServer();
}

await rep.run('main', main);
if (rep.failed && server.log.length) console.log(`--- last server output ---\n${server.log.slice(-30).join('\n')}`);
server.killOnExit();
rep.finish();
