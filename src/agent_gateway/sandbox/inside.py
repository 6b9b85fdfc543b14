"""The first program inside the sandbox: forwards loopback ports to the gateway, sets the limits, becomes the agent.

Run by bubblewrap as ``python -I -S inside.py SETUP ARGV...`` with the
gateway's own interpreter (standard library only, no ``site``: it starts in
~15 ms). SETUP is JSON: ``{"forward": {"<port>": "<unix socket>"},
"nproc": N, "data": BYTES, "lifeline": FD or null}``.

1. It listens on ``127.0.0.1:<port>`` of the sandbox's own loopback for each
   forwarded port (before anything else runs, so the agent's first request
   never finds the port closed), then forks a forwarder that relays every
   connection to the Unix socket the gateway serves, bound into the sandbox.
   The agent keeps a plain ``http://127.0.0.1:<port>`` URL; the sandbox's
   network namespace has no other way out. The forwarder is forked twice
   over, so that the agent, its parent otherwise, never waits for it; it
   dies with the sandbox's PID namespace when the agent exits. It also holds
   the lifeline (``bubblewrap.py``): when the gateway's end of it closes, the
   gateway is gone (or closed the sandbox), and it kills everything in the
   sandbox's PID namespace; the agent itself holds no end of it.
2. It sets the limits (``RLIMIT_NPROC``, ``RLIMIT_DATA``), unblocks the
   signals the gateway blocked for bubblewrap's own processes, and execs the
   agent program.
"""

import json
import os
import resource
import signal
import socket
import sys
import threading

# What the gateway reads as "the agent program could not be started" (runtimes/process.py).
START_FAILED_STATUS = 127
START_FAILED_PREFIX = "agent-gateway: the agent program could not be started: "
BUFFER_BYTES = 65536
BACKLOG = 128


def main() -> None:
    setup, argv = json.loads(sys.argv[1]), sys.argv[2:]
    lifeline = setup.get("lifeline")
    listeners = [(_listen(int(port)), path) for port, path in setup["forward"].items()]
    if listeners or lifeline is not None:
        _fork_forwarder(listeners, lifeline)
    for listener, _ in listeners:
        listener.close()
    if lifeline is not None:
        os.close(lifeline)
    for limit, value in ((resource.RLIMIT_NPROC, setup["nproc"]), (resource.RLIMIT_DATA, setup["data"])):
        resource.setrlimit(limit, (value, value))
    # The gateway blocked SIGTERM and SIGINT for bubblewrap's processes, so that its SIGTERM to
    # the group reaches the agent (and gives it the grace period) without killing bubblewrap first.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        print(f"{START_FAILED_PREFIX}{exc}", file=sys.stderr, flush=True)
        os._exit(START_FAILED_STATUS)


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(BACKLOG)
    return listener


def _fork_forwarder(listeners: list, lifeline) -> None:
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    if os.fork():
        os._exit(0)
    # The forwarder: holds none of the agent's pipes, so their ends are the agent's alone.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    threads = [threading.Thread(target=_accept, args=pair, daemon=True) for pair in listeners]
    for thread in threads:
        thread.start()
    if lifeline is None:  # the start-up check's sandbox: it ends with its ``true``
        for thread in threads:
            thread.join()
        os._exit(0)
    # Nothing is ever written to the lifeline: this returns when the gateway's end closes.
    while os.read(lifeline, 1):
        pass
    # Everything in the sandbox's PID namespace but its init and this process; its init (bubblewrap)
    # then exits with the agent, and the namespace ends.
    os.kill(-1, signal.SIGKILL)
    os._exit(0)


def _accept(listener: socket.socket, path: str) -> None:
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_connect, args=(client, path), daemon=True).start()


def _connect(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
    _pump(client, upstream)


def _pump(source: socket.socket, target: socket.socket) -> None:
    """Copy until ``source`` ends, then end ``target``'s writing side (the other direction may go on)."""
    try:
        while data := source.recv(BUFFER_BYTES):
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass


if __name__ == "__main__":
    main()
