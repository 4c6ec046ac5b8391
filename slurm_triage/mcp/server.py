"""The MCP server: the read-only tools of :mod:`.tools` over stdio or loopback HTTP.

Built on the official SDK's ``MCPServer`` (``mcp`` 2.x; 2.0 renamed ``FastMCP`` and moved the
transport arguments to ``run()``/``streamable_http_app()``). Every tool is annotated
read-only and idempotent; nothing that drains, resumes, requeues or kills exists in the
schema, and :mod:`.guard` refuses any subprocess but the read-only Slurm queries.
"""
from __future__ import annotations

import hmac
import json
import logging
from typing import Any, Awaitable, Callable, Dict, List, Optional

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import CallToolResult, TextContent, ToolAnnotations

from . import guard
from .tools import Tools

log = logging.getLogger("slurm_triage.mcp")
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=True)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
INSTRUCTIONS = (
    "Read-only triage of Slurm GPU jobs. Start with triage_job(job_id): the root cause comes first, "
    "with the node/GPU/rank, the evidence ids and the action. Follow its 'next' hint: get_evidence for one "
    "source, query_metrics for a named metric over the job's window, node_history for a lemon node, "
    "scan_logs for log files, describe(topic) for what an id or category means. Nothing here changes "
    "the cluster; suggest commands to the engineer instead.")


def _answer(data: Dict[str, Any]) -> CallToolResult:
    text = data.get("summary") or json.dumps(data, sort_keys=True, default=str)[:2000]
    return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=data)


async def _call(fn: Callable[..., Dict[str, Any]], *args: Any) -> CallToolResult:
    """Run a (blocking) tool in a worker thread; its refusals become tool errors the agent can read."""
    try:
        return _answer(await anyio.to_thread.run_sync(lambda: fn(*args)))
    except guard.GuardError as e:
        raise ToolError(str(e)) from None


def build(tools: Tools) -> MCPServer:
    """The server with its six tools, the report resource and the investigation prompt."""
    from .. import __version__

    server = MCPServer(name="slurm-triage", version=__version__, instructions=INSTRUCTIONS,
                       log_level="WARNING")

    @server.tool(annotations=READ_ONLY)
    async def triage_job(job_id: str, detail: str = "summary") -> CallToolResult:
        """Ranked root cause of a Slurm job (detail: summary | full), with a 'next' step."""
        return await _call(tools.triage_job, job_id, detail)

    @server.tool(annotations=READ_ONLY)
    async def get_evidence(job_id: str, source: str) -> CallToolResult:
        """One evidence source of a job: slurm | prometheus | pushgateway | hooks | watcher | logs (bounded)."""
        return await _call(tools.get_evidence, job_id, source)

    @server.tool(annotations=READ_ONLY)
    async def node_history(node: str, since: Optional[float] = None, until: Optional[float] = None) -> CallToolResult:
        """A node's drain reason (ours and others'), failed jobs and our hook records (unix-second window)."""
        return await _call(tools.node_history, node, since, until)

    @server.tool(annotations=READ_ONLY)
    async def query_metrics(job_id: str, metric: str, node: Optional[str] = None, gpu: Optional[str] = None,
                            step: Optional[float] = None) -> CallToolResult:
        """A named metric (describe('topics') lists them) over the job's window, aggregated server-side."""
        return await _call(tools.query_metrics, job_id, metric, node, gpu, step)

    @server.tool(annotations=READ_ONLY)
    async def scan_logs(paths: List[str]) -> CallToolResult:
        """Findings in log files you can read (regular files only; gzip is read)."""
        return await _call(tools.scan_logs, paths)

    @server.tool(annotations=READ_ONLY)
    async def describe(topic: str) -> CallToolResult:
        """What a finding id, category, metric or evidence source means; 'topics' lists them."""
        return await _call(tools.describe, topic)

    @server.resource("triage://job/{job_id}/report", mime_type="application/json")
    def report(job_id: str) -> str:
        """The JSON triage report of a job (the schema of `triage JOBID --format json`)."""
        from ..triage.report import render_json

        return render_json(tools._result(guard.job_id(job_id)))

    @server.prompt(name="investigate-job")
    def investigate_job(job_id: str) -> str:
        """The steps an SRE follows for a failed, slow or hung job."""
        job = guard.job_id(job_id)
        return (f"Investigate Slurm job {job} with the slurm-triage tools, read-only:\n"
                f"1. triage_job('{job}') — note the root cause, its node/GPU/rank and confidence.\n"
                "2. Confirm it: get_evidence for the source its evidence came from; for a hang or a "
                "straggler, query_metrics of gpu_power, gpu_util and gpu_temp on that node.\n"
                "3. node_history(node) — is this node a repeat offender (earlier drains, Xids, failed jobs)?\n"
                "4. Say what to do now (exclude or drain the node, fix the config, resubmit) as commands "
                "for the engineer to run; never claim to have run them.")

    return server


def bearer_guard(app: Callable[..., Awaitable[None]], token: str) -> Callable[..., Awaitable[None]]:
    """ASGI wrapper: every HTTP request needs ``Authorization: Bearer <token>`` (constant-time check)."""
    want = f"Bearer {token}".encode()

    async def guarded(scope: Dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, want):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"text/plain"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": b"slurm-triage mcp: bearer token required\n"})
                return
        await app(scope, receive, send)

    return guarded


def http_app(server: MCPServer, host: str, port: int, token: Optional[str]) -> Any:
    """The streamable-HTTP app at /mcp, DNS-rebinding protection on, behind the bearer check."""
    hosts = [f"{h}:{port}" for h in ({"127.0.0.1", "localhost", "[::1]"} if host in LOOPBACK else {host})]
    security = TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=sorted(hosts),
                                         allowed_origins=sorted(f"http://{h}" for h in hosts))
    app = server.streamable_http_app(streamable_http_path="/mcp", transport_security=security, host=host)
    return bearer_guard(app, token) if token else app


def serve_http(server: MCPServer, host: str, port: int, token: Optional[str]) -> None:
    import uvicorn

    config = uvicorn.Config(http_app(server, host, port, token), host=host, port=port, log_level="warning",
                            lifespan="on")
    anyio.run(uvicorn.Server(config).serve)
