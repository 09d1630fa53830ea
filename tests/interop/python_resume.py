"""Interop: the official Python SDK client (`mcp` from PyPI) against `rewind serve`.

    python python_resume.py --url http://127.0.0.1:PORT/mcp [--count 20] [--interval-ms 50] [--cut-after 5]

Cases:
  cut-and-resume  A `Client` (initialize handshake, mode="legacy") calls
                  `progress_stream` through a TCP proxy that cuts the POST's
                  connection after `cut-after` progress notifications. The SDK
                  notices the broken stream and resumes by itself (its own
                  reconnection: GET with the last event id it saw, after the
                  server's `retry`); every progress notification must arrive
                  exactly once, in order, then the result. The proxy checks
                  that the cut happened and that the SDK came back with
                  `Last-Event-ID`.
  stateless       A `Client` in the SDK's default mode ("auto") probes
                  `server/discover`, adopts 2026-07-28 and calls a tool with no
                  session at all.

Prints `PASS|FAIL python/CASE: detail` lines and `python: N passed, M failed`;
exits non-zero on any failure. Every await is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import urllib.parse

from mcp import Client

passed = 0
failed = 0


def report(name: str, ok: bool, detail: str) -> None:
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS python/{name}: {detail}", flush=True)
    else:
        failed += 1
        print(f"FAIL python/{name}: {detail}", flush=True)


class CuttingProxy:
    """Forwards TCP to the server; cuts the first response stream that has
    carried `cut_after` progress notifications (once), and records whether a
    later request carried Last-Event-ID."""

    def __init__(self, host: str, port: int, cut_after: int) -> None:
        self.host, self.port, self.cut_after = host, port, cut_after
        self.cuts = 0
        self.resumes = 0
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            s_reader, s_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            c_writer.close()
            return
        cut = asyncio.Event()

        async def upstream() -> None:
            while not cut.is_set():
                data = await c_reader.read(65536)
                if not data:
                    break
                if b"last-event-id:" in data.lower():
                    self.resumes += 1
                s_writer.write(data)
                await s_writer.drain()

        async def downstream() -> None:
            seen = 0
            while not cut.is_set():
                data = await s_reader.read(65536)
                if not data:
                    break
                c_writer.write(data)
                await c_writer.drain()
                if self.cuts == 0:
                    seen += data.count(b'"notifications/progress"')
                    if seen >= self.cut_after:
                        self.cuts += 1
                        cut.set()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for t in tasks:
            t.cancel()
        for w in (c_writer, s_writer):
            # An abortive close: the client sees the stream break mid-event.
            try:
                w.transport.abort()
            except Exception:  # noqa: BLE001 - best effort on a dying socket
                pass


async def cut_and_resume(url: str, count: int, interval_ms: int, cut_after: int) -> None:
    parsed = urllib.parse.urlsplit(url)
    proxy = CuttingProxy(parsed.hostname or "127.0.0.1", parsed.port or 80, cut_after)
    port = await proxy.start()
    proxied = urllib.parse.urlunsplit((parsed.scheme, f"127.0.0.1:{port}", parsed.path, "", ""))
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    step = max(10.0, 3 * count * interval_ms / 1000)
    try:
        async with asyncio.timeout(step + 30):
            async with Client(proxied, mode="legacy", read_timeout_seconds=step + 20) as client:
                result = await client.call_tool(
                    "progress_stream",
                    {"count": count, "interval_ms": interval_ms, "label": "python"},
                    progress_callback=on_progress,
                )
                await asyncio.sleep(max(0.3, 4 * interval_ms / 1000))  # late duplicates would land here
    except Exception as e:  # noqa: BLE001 - any failure is a FAIL line
        report("cut-and-resume/result", False, f"{type(e).__name__}: {e}; progress seen {seen}")
        return
    finally:
        if proxy.server:
            proxy.server.close()
    want = [float(i) for i in range(1, count + 1)]
    report(
        "cut-and-resume/progress-exactly-once",
        seen == want,
        f"1..{count} in order" if seen == want else f"expected 1..{count} once each, got {seen}",
    )
    text = "".join(getattr(c, "text", "") for c in result.content)
    report(
        "cut-and-resume/result",
        not result.is_error and f"done: {count}" in text,
        repr(text[:80]),
    )
    report("cut-and-resume/cut-happened", proxy.cuts == 1, f"{proxy.cuts} cut(s)")
    report(
        "cut-and-resume/sdk-resumed-with-last-event-id",
        proxy.resumes >= 1,
        f"{proxy.resumes} request(s) with Last-Event-ID",
    )


async def stateless(url: str) -> None:
    try:
        async with asyncio.timeout(30):
            async with Client(url, read_timeout_seconds=20) as client:
                version = client.protocol_version
                result = await client.call_tool("test_simple_text", {})
    except Exception as e:  # noqa: BLE001
        report("stateless/call", False, f"{type(e).__name__}: {e}")
        return
    text = "".join(getattr(c, "text", "") for c in result.content)
    report("stateless/protocol-version", version == "2026-07-28", f"negotiated {version}")
    report("stateless/call", "simple text" in text, repr(text[:80]))


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, default=20)
    ap.add_argument("--interval-ms", type=int, default=50)
    ap.add_argument("--cut-after", type=int, default=5)
    a = ap.parse_args()
    print(f"python: {a.url} progress_stream count={a.count} interval_ms={a.interval_ms}, cut after {a.cut_after}")
    await cut_and_resume(a.url, a.count, a.interval_ms, a.cut_after)
    await stateless(a.url)
    print(f"python: {passed} passed, {failed} failed")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
