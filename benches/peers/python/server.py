"""`python server.py HOST:PORT`: the Python MCP SDK's StreamableHTTPSessionManager
with one example-style event store, serving the comparison's `progress_stream`
tool on uvicorn."""

from __future__ import annotations

import contextlib
import sys

import anyio
import mcp_types as types
import uvicorn
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from event_store import ExampleStyleEventStore

MAX_COUNT = 100_000

TOOL = types.Tool(
    name="progress_stream",
    description="Sends `count` progress notifications spaced `interval_ms` apart, then returns a text result",
    input_schema={
        "type": "object",
        "properties": {
            "count": {"type": "integer"},
            "interval_ms": {"type": "integer"},
            "label": {"type": "string"},
        },
        "required": ["count"],
    },
)


async def list_tools(ctx, params):
    return types.ListToolsResult(tools=[TOOL])


async def call_tool(ctx, params: types.CallToolRequestParams):
    if params.name != "progress_stream":
        raise ValueError(f"unknown tool {params.name}")
    args = params.arguments or {}
    count = int(args.get("count", 0))
    interval = int(args.get("interval_ms", 0)) / 1000.0
    label = str(args.get("label", ""))
    if not 1 <= count <= MAX_COUNT:
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"count must be between 1 and {MAX_COUNT}")], is_error=True
        )
    meta = ctx.meta or {}
    token = meta.get("progress_token", meta.get("progressToken"))
    if token is not None:
        for i in range(1, count + 1):
            if i > 1 and interval > 0:
                await anyio.sleep(interval)
            await ctx.session.send_progress_notification(
                token, i, total=count, message=f"{label} step {i}/{count}", related_request_id=ctx.request_id
            )
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=f"{label} progress_stream done: {count} notifications")]
    )


def main() -> None:
    host, _, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:8093").rpartition(":")
    server = Server("python-sdk-peer", version="2.3.0", on_list_tools=list_tools, on_call_tool=call_tool)
    manager = StreamableHTTPSessionManager(
        app=server,
        event_store=ExampleStyleEventStore(),
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        async with manager.run():
            yield

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            message = await receive()
            if message["type"] == "lifespan.startup":
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(lifespan(app))
                await send({"type": "lifespan.startup.complete"})
                message = await receive()
                await stack.aclose()
                await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] == "http" and scope["path"].rstrip("/") == "/mcp":
            await manager.handle_request(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 404, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    print(f"python-sdk-peer: MCP endpoint http://{host}:{port}/mcp", flush=True)
    uvicorn.run(app, host=host, port=int(port), backlog=4096, log_level="warning", timeout_keep_alive=60)


if __name__ == "__main__":
    main()
