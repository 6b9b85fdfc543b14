"""POST /sign throughput: a stateless route, so this measures the HTTP tier and signing alone.

    python -m bench.sign                       # one HTTP process, Ed25519
    python -m bench.sign --workers 2 --key p256

Target (issue 4): 12,000 req/s with ``wrk -t1 -c16 -d10s`` on this 2-core machine.
"""

from __future__ import annotations

import argparse

from agent_gateway.signatures import keys
from bench import harness

STATEMENT = "The release of 2026-11-21 is approved; rollback plan attached as item 4."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="HTTP processes (http.workers)")
    parser.add_argument("--key", choices=list(keys.KEY_TYPES), default="ed25519")
    parser.add_argument("--duration", type=int, default=harness.WRK_DURATION_S)
    args = parser.parse_args()

    env = {harness.WORKERS: str(args.workers), "AGENT_GATEWAY_SIGNING_KEY": keys.generate_pem(args.key).decode()}
    with harness.gateway("sqlite", env) as served:
        lua = harness.lua_request("POST", {"statement": STATEMENT})
        harness.wrk(served.agent_url + "/sign", lua, duration_s=2)  # warm-up
        result = harness.wrk(served.agent_url + "/sign", lua, duration_s=args.duration)
        rss = harness.rss_mb(served.process.pid)
    print(f"POST /sign, {args.key} key, {args.workers} HTTP process(es), wrk -t1 -c16 -d{args.duration}s")
    print(result.line("POST /sign"))
    print(f"resident memory of the main process after load: {rss:.0f} MB")


if __name__ == "__main__":
    main()
