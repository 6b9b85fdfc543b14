"""Drive one route of a fresh gateway with wrk and print throughput, latency and memory.

    python -m bench.run --backend sqlite --route "GET /users"
    python -m bench.run --backend postgresql --server agent --route "GET /users?limit=50"
"""

from __future__ import annotations

import argparse

import orjson

from bench import harness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--server", choices=["agent", "public"], default="agent")
    parser.add_argument("--route", default="GET /users", help='"METHOD /path?query"')
    parser.add_argument("--body", help="JSON request body")
    parser.add_argument("--users", type=int, default=10, help="Users admitted before the run")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    parser.add_argument("--connections", type=int, default=harness.WRK_CONNECTIONS)
    args = parser.parse_args()

    method, path = args.route.split(" ", 1)
    with harness.gateway(args.backend) as served:
        for _ in range(args.users):
            served.cli_json("users", "add")
        pid = served.process.pid
        idle = harness.rss_mb(pid)
        base = served.agent_url if args.server == "agent" else served.public_url
        body = orjson.loads(args.body) if args.body else None
        result = harness.wrk(
            base + path, harness.lua_request(method, body), duration_s=args.duration, connections=args.connections
        )
        loaded = harness.rss_mb(pid)
    print(f"backend {args.backend}, {args.server} server, wrk -t1 -c{args.connections} -d{args.duration}s")
    print(result.line(f"{method} {path}"))
    print(f"resident memory: idle {idle:.0f} MB, after load {loaded:.0f} MB")


if __name__ == "__main__":
    main()
