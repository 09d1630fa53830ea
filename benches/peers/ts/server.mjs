// `node server.mjs HOST:PORT`: the TypeScript MCP SDK's Streamable HTTP
// server transport, one transport and one example-style event store per
// session (as the SDK's simpleStreamableHttp example does), serving the
// comparison's `progress_stream` tool.

import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';
import { ExampleStyleEventStore } from './eventStore.mjs';

const [host, port] = (process.argv[2] ?? '127.0.0.1:8092').split(/:(?=\d+$)/);
const MAX_COUNT = 100000;
const sleep = ms => new Promise(r => setTimeout(r, ms));

function newServer() {
    const server = new McpServer({ name: 'ts-sdk-peer', version: '1.32.2' });
    server.registerTool(
        'progress_stream',
        {
            description: 'Sends `count` progress notifications spaced `interval_ms` apart, then returns a text result',
            inputSchema: { count: z.number().int(), interval_ms: z.number().int().optional(), label: z.string().optional() }
        },
        async ({ count, interval_ms = 0, label = '' }, extra) => {
            if (count < 1 || count > MAX_COUNT) {
                return { isError: true, content: [{ type: 'text', text: `count must be between 1 and ${MAX_COUNT}` }] };
            }
            const progressToken = extra._meta?.progressToken;
            if (progressToken !== undefined) {
                for (let i = 1; i <= count; i++) {
                    if (i > 1 && interval_ms > 0) await sleep(interval_ms);
                    await extra.sendNotification({
                        method: 'notifications/progress',
                        params: { progressToken, progress: i, total: count, message: `${label} step ${i}/${count}` }
                    });
                }
            }
            return { content: [{ type: 'text', text: `${label} progress_stream done: ${count} notifications` }] };
        }
    );
    return server;
}

const transports = new Map();

async function readJson(req) {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

function refuse(res, status, message) {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message } }));
}

const httpServer = http.createServer(async (req, res) => {
    try {
        if (!req.url.startsWith('/mcp')) return refuse(res, 404, 'not found');
        const sessionId = req.headers['mcp-session-id'];
        if (req.method === 'POST') {
            let body;
            try {
                body = await readJson(req);
            } catch {
                return refuse(res, 400, 'parse error');
            }
            let transport = sessionId && transports.get(sessionId);
            if (!transport) {
                if (sessionId || !isInitializeRequest(body)) return refuse(res, sessionId ? 404 : 400, 'no valid session');
                transport = new StreamableHTTPServerTransport({
                    sessionIdGenerator: () => randomUUID(),
                    eventStore: new ExampleStyleEventStore(),
                    onsessioninitialized: id => transports.set(id, transport)
                });
                transport.onclose = () => transport.sessionId && transports.delete(transport.sessionId);
                await newServer().connect(transport);
            }
            return await transport.handleRequest(req, res, body);
        }
        const transport = sessionId && transports.get(sessionId);
        if (!transport) return refuse(res, sessionId ? 404 : 400, 'no valid session');
        return await transport.handleRequest(req, res);
    } catch (e) {
        if (!res.headersSent) refuse(res, 500, String(e));
        else res.end();
    }
});
httpServer.keepAliveTimeout = 60000;
httpServer.listen({ host, port: Number(port), backlog: 4096 }, () => {
    console.log(`ts-sdk-peer: MCP endpoint http://${host}:${httpServer.address().port}/mcp`);
});
const stop = () => httpServer.close(() => process.exit(0)) && setTimeout(() => process.exit(0), 2000).unref();
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
