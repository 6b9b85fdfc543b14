"""A tiny agent program for the persistent runtime's tests.

``persistent_agent.py RECORD [exit-at-start]`` speaks the JSON-lines protocol:
for each Run it appends ``{"pid", "pidns", "run", "cwd", "env"}`` to RECORD
(``pidns`` names the PID namespace its pid is a number of), then does what the
Run's Prompt says: ``ok`` answers done; ``fail`` answers failed; ``garbage``
writes a line that is not JSON; ``wrong-id`` answers done for another Run;
``exit`` writes to stderr and exits 3; ``hang`` answers done once
RECORD.release exists; ``spawn`` starts a child that sleeps (``{"pid",
"pidns"}`` in RECORD.child), then answers done; ``spawn-stubborn`` likewise, its child ignoring SIGTERM. With ``exit-at-start`` it
writes to stderr and exits 4 before reading anything.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

record = Path(sys.argv[1])
# Confined, its pids are numbers of a PID namespace of its own (tests/runtimes/test_persistent.py's Agent.host_pid).
PIDNS = os.readlink("/proc/self/ns/pid")
if sys.argv[2:] == ["exit-at-start"]:
    print("cannot start: no model", file=sys.stderr, flush=True)
    sys.exit(4)


def answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    run = json.loads(line)["run"]
    entry = {
        "pid": os.getpid(),
        "pidns": PIDNS,
        "run": run,
        "cwd": os.getcwd(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(("AGENT_GATEWAY_", "AGENT_SERVER_URL"))},
    }
    with open(record, "a", encoding="utf-8") as file:
        file.write(json.dumps(entry) + "\n")
    what = run["prompt"]
    if what == "fail":
        answer({"type": "failed", "run": run["id"], "error": "no luck\nsecond line"})
    elif what == "garbage":
        sys.stdout.write("hello, I am not JSON\n")
        sys.stdout.flush()
    elif what == "wrong-id":
        answer({"type": "done", "run": "some-other-run"})
    elif what == "exit":
        print("dying mid-Run", file=sys.stderr, flush=True)
        sys.exit(3)
    elif what == "hang":
        release = record.with_name(record.name + ".release")
        while not release.exists():
            time.sleep(0.05)
        answer({"type": "done", "run": run["id"]})
    elif what in ("spawn", "spawn-stubborn"):
        # A stubborn child ignores SIGTERM (as a sandbox's init does), and says so before the answer.
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(600)"
        child = subprocess.Popen(
            [sys.executable, "-c", code if what == "spawn-stubborn" else "import time; time.sleep(600)"],
            stdout=subprocess.PIPE if what == "spawn-stubborn" else None,
        )
        if child.stdout is not None:
            child.stdout.readline()
        record.with_name(record.name + ".child").write_text(json.dumps({"pid": child.pid, "pidns": PIDNS}))
        answer({"type": "done", "run": run["id"]})
    else:
        answer({"type": "done", "run": run["id"]})
