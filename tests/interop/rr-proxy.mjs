// A tiny non-sticky round-robin HTTP reverse proxy (Node's http module
// only): each request goes to the next upstream in turn, whatever its
// session, and the answer is streamed back as it arrives (SSE included).
// Used to spread one client's requests over several `rewind serve
// --cluster` nodes.
//
//   node rr-proxy.mjs http://127.0.0.1:P1 http://127.0.0.1:P2 ...
//
// Listens on 127.0.0.1 on a port the kernel chooses and prints that port
// alone on the first line of stdout; then one line per request:
//   rr-proxy: #N METHOD PATH session=ID -> upstream I: STATUS
// (and a line when a stream ends early or an upstream fails). The request
// is forwarded unchanged (Host and Origin included, so the nodes judge
// them as if the client had come to them), less hop-by-hop headers. A
// client that goes away aborts its upstream request, and an upstream that
// breaks off breaks off the client's answer. SIGINT/SIGTERM stop it.

import http from 'node:http';

const upstreams = process.argv.slice(2).map(u => new URL(u));
if (upstreams.length === 0) {
    console.error('usage: node rr-proxy.mjs http://HOST:PORT [http://HOST:PORT ...]');
    process.exit(2);
}

// RFC 9110 7.6.1: headers of one connection, not of the message.
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

function forwardable(rawHeaders) {
    // Raw pairs keep repeated headers and the client's spelling.
    const out = [];
    for (let i = 0; i < rawHeaders.length; i += 2) {
        if (!HOP_BY_HOP.has(rawHeaders[i].toLowerCase())) out.push(rawHeaders[i], rawHeaders[i + 1]);
    }
    return out;
}

const agent = new http.Agent({ keepAlive: true });
let next = 0;
let count = 0;

const server = http.createServer((req, res) => {
    const n = ++count;
    const index = next++ % upstreams.length;
    const up = upstreams[index];
    const session = req.headers['mcp-session-id'] ?? '-';
    const label = `#${n} ${req.method} ${req.url} session=${session} -> upstream ${index}`;
    const upstreamReq = http.request({
        host: up.hostname,
        port: up.port,
        method: req.method,
        path: req.url,
        headers: forwardable(req.rawHeaders),
        agent
    });
    let answered = false;
    let clientGone = false;
    upstreamReq.on('response', upRes => {
        answered = true;
        console.log(`rr-proxy: ${label}: ${upRes.statusCode} ${upRes.headers['content-type'] ?? ''}`);
        const headers = forwardable(upRes.rawHeaders);
        headers.push('x-rr-proxy-upstream', String(index));
        res.writeHead(upRes.statusCode, upRes.statusMessage, headers);
        res.flushHeaders(); // an SSE answer's headers go out before its first event
        upRes.on('data', chunk => res.write(chunk)); // each chunk as it arrives
        upRes.on('end', () => res.end());
        upRes.on('close', () => {
            if (upRes.complete) return;
            console.log(`rr-proxy: ${label}: ${clientGone ? 'the client went away before the end' : 'upstream broke off the answer'}`);
            res.destroy();
        });
        upRes.on('error', () => res.destroy());
    });
    upstreamReq.on('error', e => {
        if (answered) {
            res.destroy();
            return;
        }
        console.log(`rr-proxy: ${label}: upstream failed: ${e.message}`);
        if (!res.headersSent) {
            res.writeHead(502, { 'content-type': 'text/plain' });
            res.end(`rr-proxy: upstream ${index} (${up.host}): ${e.message}\n`);
        } else res.destroy();
    });
    // The client went away (a cut, or it read what it wanted): so does the upstream request.
    res.on('close', () => {
        if (res.writableFinished) return;
        clientGone = true;
        upstreamReq.destroy();
    });
    req.pipe(upstreamReq);
});
server.on('connection', socket => socket.setNoDelay(true));
server.keepAliveTimeout = 5000;
// Long SSE streams: no request/headers timeouts of the proxy's own.
server.requestTimeout = 0;
server.headersTimeout = 0;

server.listen(0, '127.0.0.1', () => {
    console.log(String(server.address().port));
});
for (const sig of ['SIGINT', 'SIGTERM']) {
    process.on(sig, () => {
        server.closeAllConnections?.();
        server.close(() => process.exit(0));
        setTimeout(() => process.exit(0), 1000).unref();
    });
}
