// Shared helpers of the interop scripts: argument parsing, PASS/FAIL
// reporting, deadlines, and a watchdog so that every script always ends.

import { parseArgs } from 'node:util';
import { spawn } from 'node:child_process';
import net from 'node:net';

/** Parses `--name value` options; `spec` maps names to default string values. */
export function options(spec) {
    const { values } = parseArgs({
        options: Object.fromEntries(Object.keys(spec).map(k => [k, { type: 'string' }])),
        strict: true
    });
    const out = {};
    for (const [k, def] of Object.entries(spec)) {
        const v = values[k] ?? process.env[`REWIND_${k.toUpperCase().replace(/-/g, '_')}`] ?? def;
        if (v === undefined) {
            console.error(`missing --${k}`);
            process.exit(2);
        }
        out[k] = v;
    }
    return out;
}

/** Kills the process with a FAIL line if it runs longer than `ms`. */
export function watchdog(name, ms) {
    setTimeout(() => {
        console.log(`FAIL ${name}: watchdog: still running after ${ms} ms`);
        process.exit(1);
    }, ms).unref();
}

/** Rejects with a clear message when `promise` does not settle within `ms`. */
export function within(ms, what, promise) {
    let timer;
    const timeout = new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
    });
    return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

export const sleep = ms => new Promise(r => setTimeout(r, ms));

/** Collects the results of named checks and prints one PASS/FAIL line each. */
export class Report {
    constructor(script) {
        this.script = script;
        this.failed = 0;
        this.passed = 0;
    }
    pass(name, detail = '') {
        this.passed++;
        console.log(`PASS ${this.script}/${name}${detail ? `: ${detail}` : ''}`);
    }
    fail(name, detail) {
        this.failed++;
        console.log(`FAIL ${this.script}/${name}: ${detail}`);
    }
    check(name, ok, detail) {
        ok ? this.pass(name, ok === true ? '' : String(ok)) : this.fail(name, detail);
        return !!ok;
    }
    /** Runs `fn`, turning a throw into a FAIL line. */
    async run(name, fn) {
        try {
            await fn();
        } catch (e) {
            this.fail(name, e instanceof Error ? (e.stack ?? e.message) : String(e));
        }
    }
    finish() {
        console.log(`${this.script}: ${this.passed} passed, ${this.failed} failed`);
        process.exit(this.failed === 0 && this.passed > 0 ? 0 : 1);
    }
}

/** Text of the first text content block of a tool result, or a description of what came instead. */
export function resultText(result) {
    const block = result?.content?.find?.(c => c.type === 'text');
    return block ? block.text : `(no text content: ${JSON.stringify(result)?.slice(0, 200)})`;
}

/** Compares the progress values seen with 1..count; returns null when exact, else a description. */
export function progressProblem(seen, count) {
    const want = Array.from({ length: count }, (_, i) => i + 1);
    if (seen.length === want.length && seen.every((v, i) => v === want[i])) return null;
    const dups = seen.filter((v, i) => seen.indexOf(v) !== i);
    const missing = want.filter(v => !seen.includes(v));
    const outOfOrder = seen.some((v, i) => i > 0 && v < seen[i - 1]);
    return (
        `expected progress 1..${count} exactly once in order; got [${seen.join(',')}]` +
        (dups.length ? `; duplicates [${dups.join(',')}]` : '') +
        (missing.length ? `; missing [${missing.join(',')}]` : '') +
        (outOfOrder ? '; out of order' : '')
    );
}

// ---------------------------------------------------------------------------
// Plain-HTTP MCP (fetch), for the checks no SDK call can express.

export const PROTOCOL_VERSION = '2025-11-25';

/** Parses complete SSE events out of `buf`; returns [events, rest]. */
export function parseSse(buf) {
    const events = [];
    const blocks = buf.replace(/\r\n?/g, '\n').split('\n\n');
    const rest = blocks.pop();
    for (const block of blocks) {
        const ev = { id: undefined, event: undefined, data: undefined, retry: undefined };
        for (const line of block.split('\n')) {
            if (line === '' || line.startsWith(':')) continue;
            const i = line.indexOf(':');
            const field = i < 0 ? line : line.slice(0, i);
            let value = i < 0 ? '' : line.slice(i + 1);
            if (value.startsWith(' ')) value = value.slice(1);
            if (field === 'data') ev.data = ev.data === undefined ? value : `${ev.data}\n${value}`;
            else if (field === 'id') ev.id = value;
            else if (field === 'event') ev.event = value;
            else if (field === 'retry') ev.retry = Number(value);
        }
        if (ev.id !== undefined || ev.data !== undefined || ev.event !== undefined || ev.retry !== undefined) events.push(ev);
    }
    return [events, rest];
}

/**
 * Sends one HTTP request to the MCP endpoint and reads its answer, bounded by `ms`.
 * For an SSE answer, reading stops when `until(event)` is true, when the server ends
 * the stream, or when `ms` runs out (`timedOut`); the raw bytes read are in `raw`.
 */
export async function http(url, { method = 'POST', session, protocolVersion = PROTOCOL_VERSION, lastEventId, body, headers = {}, until = () => false, ms = 3000 } = {}) {
    const h = { accept: 'application/json, text/event-stream', ...headers };
    if (body !== undefined) h['content-type'] = 'application/json';
    if (session) h['mcp-session-id'] = session;
    if (protocolVersion) h['mcp-protocol-version'] = protocolVersion;
    if (lastEventId !== undefined) h['last-event-id'] = lastEventId;
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), ms);
    const out = { status: 0, headers: null, raw: '', events: [], json: undefined, timedOut: false, ended: false };
    try {
        const res = await fetch(url, { method, headers: h, body: body === undefined ? undefined : JSON.stringify(body), signal: ctrl.signal });
        out.status = res.status;
        out.headers = res.headers;
        const type = res.headers.get('content-type') ?? '';
        if (!res.body) return out;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let pending = '';
        for (;;) {
            const { value, done } = await reader.read();
            if (done) {
                out.ended = true;
                break;
            }
            out.raw += value;
            if (type.includes('text/event-stream')) {
                const [evs, rest] = parseSse(pending + value);
                pending = rest;
                out.events.push(...evs);
                if (evs.some(until)) {
                    await reader.cancel().catch(() => {});
                    break;
                }
            }
        }
        if (type.includes('application/json') && out.raw) {
            try {
                out.json = JSON.parse(out.raw);
            } catch {}
        }
    } catch (e) {
        if (ctrl.signal.aborted) out.timedOut = true;
        else throw e;
    } finally {
        clearTimeout(timer);
    }
    return out;
}

/** The JSON-RPC messages carried by an answer (SSE data or a JSON body). */
export function messages(answer) {
    if (answer.json !== undefined) return Array.isArray(answer.json) ? answer.json : [answer.json];
    return answer.events.filter(e => e.data).flatMap(e => {
        try {
            return [JSON.parse(e.data)];
        } catch {
            return [];
        }
    });
}

const isResponseTo = id => ev => {
    try {
        const m = JSON.parse(ev.data ?? '');
        return m.id === id && ('result' in m || 'error' in m);
    } catch {
        return false;
    }
};
export { isResponseTo };

/** Initializes a session over plain HTTP; returns its id (throws on any problem). */
export async function initialize(url, name) {
    const init = await http(url, {
        protocolVersion: undefined,
        body: { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name, version: '0.0.0' } } },
        until: isResponseTo(0)
    });
    const session = init.headers?.get('mcp-session-id');
    const reply = messages(init).find(m => m.id === 0);
    if (init.status !== 200 || !session || !reply?.result) throw new Error(`${name}: initialize answered HTTP ${init.status}, session ${session}, body ${init.raw.slice(0, 300)}`);
    const pv = reply.result.protocolVersion;
    const ack = await http(url, { session, protocolVersion: pv, body: { jsonrpc: '2.0', method: 'notifications/initialized' } });
    if (ack.status !== 202) throw new Error(`${name}: notifications/initialized answered HTTP ${ack.status} (expected 202): ${ack.raw.slice(0, 300)}`);
    return { session, protocolVersion: pv };
}

// --- a server process the script runs itself (restart tests) ---------------------

/**
 * `rewind serve` (the command line `cmdLine`, split on spaces) run by the
 * script on `url`'s port, so one client can live across its restarts.
 * `start` waits for the port; `stop` sends SIGTERM (SIGKILL after 10 s),
 * `kill` SIGKILL; both wait for the port to close. `log` keeps the last
 * 200 lines of output. The process is killed when the script exits.
 */
export function serverProcess(url, cmdLine, startTimeout) {
    const [cmd, ...args] = cmdLine.trim().split(/\s+/);
    const port = Number(url.port);
    const s = { proc: null, log: [] };
    const portOpen = () =>
        new Promise(resolve => {
            const c = net.connect({ host: url.hostname, port }, () => {
                c.destroy();
                resolve(true);
            });
            c.on('error', () => resolve(false));
            c.setTimeout(1000, () => {
                c.destroy();
                resolve(false);
            });
        });
    const portClosed = async () => {
        for (let i = 0; i < 50 && (await portOpen()); i++) await sleep(100);
    };
    s.killOnExit = () => {
        if (s.proc && s.proc.exitCode === null && s.proc.signalCode === null) s.proc.kill('SIGKILL');
    };
    process.on('exit', s.killOnExit);
    for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => process.exit(1));
    s.start = async label => {
        if (await portOpen()) throw new Error(`${label}: port ${port} is already in use before the server starts`);
        s.log = [];
        s.proc = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
        const keep = d => {
            s.log.push(...d.toString().split('\n').filter(Boolean));
            if (s.log.length > 200) s.log.splice(0, s.log.length - 200);
        };
        s.proc.stdout.on('data', keep);
        s.proc.stderr.on('data', keep);
        const t0 = Date.now();
        while (Date.now() - t0 < startTimeout) {
            if (s.proc.exitCode !== null) throw new Error(`${label}: server exited with ${s.proc.exitCode} during start: ${s.log.slice(-20).join('\n')}`);
            if (await portOpen()) return Date.now() - t0;
            await sleep(100);
        }
        throw new Error(`${label}: port ${port} not open after ${startTimeout} ms; server output: ${s.log.slice(-20).join('\n')}`);
    };
    const exited = proc => new Promise(r => proc.once('exit', (code, signal) => r({ code, signal })));
    s.stop = async () => {
        const proc = s.proc;
        const done = exited(proc);
        const t0 = Date.now();
        proc.kill('SIGTERM');
        let how = await Promise.race([done, sleep(10000).then(() => null)]);
        let graceful = true;
        if (!how) {
            graceful = false;
            proc.kill('SIGKILL');
            how = await within(5000, 'server exit after SIGKILL', done);
        }
        await portClosed();
        return { ms: Date.now() - t0, graceful, ...how };
    };
    s.kill = async () => {
        const done = exited(s.proc);
        s.proc.kill('SIGKILL');
        const how = await within(5000, 'server exit after SIGKILL', done);
        await portClosed();
        return how;
    };
    return s;
}
