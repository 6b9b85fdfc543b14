"""A tiny agent program for the command runtime's tests.

``agent_program.py RECORD MODE [ARG...]`` appends one JSON line to RECORD
(its argv, working directory, the gateway's environment variables and stdin),
then, by MODE: ``ok`` exits 0; ``fail`` writes to stderr and exits 3;
``noisy`` writes 10 KiB of numbered lines to stderr and exits 4; ``nul`` writes
a NUL and an invalid byte to stderr and exits 5; ``hang``
waits until RECORD.release exists, then exits 0; ``stubborn`` does too, ignoring
SIGTERM; ``killed`` kills itself; ``prompt`` does what its Prompt's last word says.
"""

import json
import os
import signal
import sys
import time
from pathlib import Path

record, mode = Path(sys.argv[1]), sys.argv[2]
stdin = sys.stdin.read()
entry = {
    "argv": sys.argv[3:],
    "cwd": os.getcwd(),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("AGENT_GATEWAY_", "AGENT_SERVER_URL"))},
    "stdin": stdin,
    "pid": os.getpid(),
}
with open(record, "a", encoding="utf-8") as file:
    file.write(json.dumps(entry) + "\n")
if mode == "prompt":
    mode = stdin.split()[-1]
if mode == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "fail":
    print("something went wrong\nat the end", file=sys.stderr)
    sys.exit(3)
if mode == "noisy":
    for number in range(1000):
        print(f"line {number:04d} of noise", file=sys.stderr)
    sys.exit(4)
if mode == "nul":
    sys.stderr.buffer.write(b"bad\x00byte \xff")
    sys.exit(5)
if mode in ("hang", "stubborn"):
    release = record.with_name(record.name + ".release")
    while not release.exists():
        time.sleep(0.05)
if mode == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(0)
