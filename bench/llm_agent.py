"""The reference LLM agent's own overhead per Run, with an instant scripted model.

    python -m bench.llm_agent [--backend sqlite|postgresql|both] [--samples 100] [--rounds 2]

The model is ``respond`` below (pydantic-ai's FunctionModel, through the agent's
testing hook ``--model function:bench.llm_agent:respond``): it answers each
Prompt with one ``send_message`` call through the gateway's real MCP server, then
a final text, in no time, so what is measured is the agent: its Session file read
and written, the instructions read, two model turns, one MCP tool call.

A User's ``POST /messages`` → the answer readable with ``GET /messages?after=<seq>``,
sequential: p50/p99 for a gateway deployed by ``init --agent llm`` (target p50 ≤
30 ms on SQLite), beside the demo echo agent (``init``), which answers with one
plain HTTP call, in alternating rounds on a fresh gateway each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo

from agent_gateway.agent.llm.providers import FUNCTION_MODELS_ENV
from bench import harness
from bench.agent import sequential
from tests import served

ROOT = Path(__file__).resolve().parents[1]
MODEL = "function:bench.llm_agent:respond"
PREFIX = "A message from user "


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """One send_message to the User the Prompt names, then done."""
    if any(isinstance(part, ToolReturnPart) for part in messages[-1].parts):
        return ModelResponse(parts=[TextPart("done")])
    prompt = str(messages[-1].parts[-1].content)  # type: ignore[union-attr]
    user = prompt.removeprefix(PREFIX).split(":", 1)[0]
    return ModelResponse(parts=[ToolCallPart("send_message", {"userId": user, "text": "ok"})])


@contextlib.contextmanager
def llm_gateway(backend: str) -> Iterator[served.ServedGateway]:
    """A real gateway made by ``init --agent llm`` with the instant model, on free loopback ports."""
    with tempfile.TemporaryDirectory(prefix="agw-bench-") as tmp:
        directory = Path(tmp) / "deployment"
        with harness.database(backend, Path(tmp)) as url:
            env = {
                "AGENT_GATEWAY_DATABASE_URL": url,
                "AGENT_GATEWAY_PUBLIC_LISTEN": f"127.0.0.1:{served.free_port()}",
                "AGENT_GATEWAY_AGENT_LISTEN": f"127.0.0.1:{served.free_port()}",
                "AGENT_GATEWAY_OPS_LISTEN": f"127.0.0.1:{served.free_port()}",
                "AGENT_GATEWAY_LOG_LEVEL": "WARNING",
                "PYTHONPATH": f"{served.SRC}:{ROOT}",
                FUNCTION_MODELS_ENV: "1",
            }
            init = served.run_cli("init", str(directory), "--agent", "llm", "--model", MODEL,
                                  config=directory / "gateway.toml", env=env)
            if init.returncode != 0:
                raise SystemExit(init.stderr)
            gateway = served.ServedGateway.spawn(directory, env)
            try:
                yield gateway
            finally:
                gateway.stop()


def agent_pid(gateway: served.ServedGateway) -> int:
    """The LLM agent's Python process: a descendant of ``serve`` (under bwrap when confined)."""
    parents: dict[int, int] = {}
    commands: dict[int, list[bytes]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
                commands[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            parents[int(entry.name)] = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid:")))

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parents.get(pid, 0)
            if pid == gateway.process.pid:
                return True
        return False

    for pid, argv in commands.items():
        if b"agent_gateway.agent.llm" in argv and not argv[0].endswith(b"bwrap") and descends(pid):
            return pid
    raise SystemExit("no LLM agent process found under serve")


def measure(name: str, backend: str, samples: int) -> list[float]:
    deploy = llm_gateway(backend) if name == "llm" else harness.gateway(backend)
    with deploy as gateway:
        delays = asyncio.run(sequential(gateway, samples))  # the first answer starts the agent
        if name == "llm":  # the agent's own CPU per Run, which the machine's load does not inflate much
            pid = agent_pid(gateway)
            before = harness.cpu_s(pid)
            asyncio.run(sequential(gateway, samples))
            cpu = f"  (agent CPU {(harness.cpu_s(pid) - before) * 1000 / (samples + 1):.1f} ms per Run)"
        else:
            cpu = ""
    cuts = statistics.quantiles(delays, n=100, method="inclusive")
    print(f"{backend:<10} {name:<4} Message -> answer readable ({samples}): p50 {cuts[49]:.1f} ms  "
          f"p99 {cuts[98]:.1f} ms  max {max(delays):.1f} ms{cpu}", flush=True)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql", "both"], default="both")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    for backend in ["sqlite", "postgresql"] if args.backend == "both" else [args.backend]:
        pooled: dict[str, list[float]] = {"echo": [], "llm": []}
        for _ in range(args.rounds):
            for name in pooled:  # alternating: echo, llm, echo, llm, ...
                pooled[name] += measure(name, backend, args.samples)
        for name, delays in pooled.items():
            cuts = statistics.quantiles(delays, n=100, method="inclusive")
            print(f"{backend:<10} {name:<4} all rounds ({len(delays)}): p50 {cuts[49]:.1f} ms  p99 {cuts[98]:.1f} ms")


if __name__ == "__main__":
    main()
