// Interop: a server→client request survives a cut. A client calls
// `test_sampling`; the server asks it for a completion
// (`sampling/createMessage`) on the call's SSE stream; the client's
// connection is cut right after that request arrives and before it answers.
// It resumes with `GET` + `Last-Event-ID` (the request's own event id), then
// answers the request with a POST; the tool's result, which quotes the
// answer, must arrive on the resumed stream, and nothing before the cursor
// may be delivered again.
//
//   node sampling-cut.mjs --url http://127.0.0.1:PORT/mcp

import { Report, http, isResponseTo, messages, options, sleep, watchdog, PROTOCOL_VERSION } from './lib.mjs';

const opt = options({ url: undefined });
const url = opt.url;
watchdog('sampling-cut', 30000);
const rep = new Report('sampling-cut');

const isSamplingRequest = ev => {
    try {
        const m = JSON.parse(ev.data ?? '');
        return m.method === 'sampling/createMessage' && m.id !== undefined;
    } catch {
        return false;
    }
};

await rep.run('round-trip', async () => {
    // A client that can sample.
    const init = await http(url, {
        protocolVersion: undefined,
        body: { jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: PROTOCOL_VERSION, capabilities: { sampling: {} }, clientInfo: { name: 'sampling-cut', version: '0.0.0' } } },
        until: isResponseTo(0)
    });
    const session = init.headers?.get('mcp-session-id');
    if (init.status !== 200 || !session) throw new Error(`initialize: HTTP ${init.status}: ${init.raw.slice(0, 200)}`);
    const ack = await http(url, { session, body: { jsonrpc: '2.0', method: 'notifications/initialized' } });
    rep.check('initialized', ack.status === 202, `notifications/initialized answered ${ack.status}`);

    // The call; the stream is cut as soon as the sampling request arrives.
    const marker = `MARK-${Math.random().toString(36).slice(2)}`;
    const call = await http(url, {
        session,
        body: { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'test_sampling', arguments: { prompt: 'Say the marker' } } },
        until: isSamplingRequest,
        ms: 5000
    });
    const requestEvent = call.events.find(isSamplingRequest);
    if (!requestEvent) throw new Error(`no sampling/createMessage on the call's stream: ${call.raw.slice(0, 300)}`);
    const request = JSON.parse(requestEvent.data);
    rep.check('request-on-call-stream', requestEvent.id ? `sampling request ${JSON.stringify(request.id)} with event id ${requestEvent.id}` : false, 'the sampling request had no event id');
    rep.check('cut-before-answer', !messages(call).some(m => m.id === 7), 'the tool answered before the client did');

    // Resume from the request's event id, then answer while the resumed
    // stream is open.
    const resumed = http(url, { method: 'GET', session, lastEventId: requestEvent.id, until: isResponseTo(7), ms: 8000 });
    await sleep(300);
    const answer = await http(url, {
        session,
        body: { jsonrpc: '2.0', id: request.id, result: { role: 'assistant', content: { type: 'text', text: marker }, model: 'interop', stopReason: 'endTurn' } }
    });
    rep.check('answer-accepted', answer.status === 202, `the client's answer got HTTP ${answer.status}: ${answer.raw.slice(0, 200)}`);
    const rest = await resumed;
    rep.check('resumed', rest.status === 200, `resume answered HTTP ${rest.status}: ${rest.raw.slice(0, 200)}`);
    const result = messages(rest).find(m => m.id === 7);
    const text = result?.result?.content?.[0]?.text ?? '';
    rep.check('result-after-resume', text.includes(marker) ? `"${text}"` : false, `no result quoting the answer on the resumed stream: ${rest.raw.slice(0, 400)}`);
    const again = messages(rest).filter(m => m.method === 'sampling/createMessage');
    rep.check('nothing-redelivered', again.length === 0, `the sampling request was delivered again after its own cursor (${again.length}x)`);
});
rep.finish();
