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
2. It sets the limits (``RLIMIT_NPROC``, ``RLIMIT_DATA``, and
   ``RLIMIT_NOFILE`` at :data:`MAX_FILES`, below the gateway's own raised
   one), unblocks the signals the gateway blocked for bubblewrap's own
   processes, and execs the agent program.

Why exec failed reaches the gateway on the *exec-error pipe*, whose write end
``runtimes/process.py`` passes as the descriptor named by
``$AGENT_GATEWAY_EXEC_ERROR_FD`` (removed from the environment here): it is
closed on exec and in the forwarder, so only this program, and only when exec
fails, can write to it; the agent program never holds it. What the agent
writes on stderr, ``START_FAILED_PREFIX`` included, is only ever its own
output. The same line goes to stderr too, for the start-up check
(``Sandbox.check``) and for whoever reads it.
"""

import json
import os
import resource
import signal
import socket
import sys
import threading
import time

# How a failed exec ends: this status, and this line on stderr for the start-up check and whoever reads it.
# The gateway believes the exec-error pipe alone (an agent program can exit 127 with the same line).
START_FAILED_STATUS = 127
START_FAILED_PREFIX = "agent-gateway: the agent program could not be started: "
# The most of an exec error written to the pipe: one write below PIPE_BUF, so it arrives whole.
EXEC_ERROR_BYTES = 4000
# Where the gateway says which descriptor is the exec-error pipe's write end (see above).
EXEC_ERROR_ENV = "AGENT_GATEWAY_EXEC_ERROR_FD"
# The agent's descriptors: the gateway raises its own limit to the hard one (connections.py), which the
# agent would inherit; a program needs far fewer, and what it opens towards the gateway is capped there.
MAX_FILES = 1024
BUFFER_BYTES = 65536
BACKLOG = 128
# After accept() fails (the forwarder out of descriptors, say), how long before it accepts again.
ACCEPT_RETRY_S = 0.1


def main() -> None:
    setup, argv = json.loads(sys.argv[1]), sys.argv[2:]
    lifeline = setup.get("lifeline")
    exec_error = _exec_error_pipe()
    listeners = [(_listen(int(port)), path) for port, path in setup["forward"].items()]
    if listeners or lifeline is not None:
        _fork_forwarder(listeners, lifeline, exec_error)
    for listener, _ in listeners:
        listener.close()
    if lifeline is not None:
        os.close(lifeline)
    _, hard_files = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = MAX_FILES if hard_files == resource.RLIM_INFINITY else min(MAX_FILES, hard_files)
    for limit, value in (
        (resource.RLIMIT_NPROC, setup["nproc"]), (resource.RLIMIT_DATA, setup["data"]), (resource.RLIMIT_NOFILE, files)
    ):
        resource.setrlimit(limit, (value, value))
    # The gateway blocked SIGTERM and SIGINT for bubblewrap's processes, so that its SIGTERM to
    # the group reaches the agent (and gives it the grace period) without killing bubblewrap first.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        if exec_error is not None:
            try:
                os.write(exec_error, str(exc).encode("utf-8", errors="replace")[:EXEC_ERROR_BYTES])
            except OSError:
                pass
        print(f"{START_FAILED_PREFIX}{exc}", file=sys.stderr, flush=True)
        os._exit(START_FAILED_STATUS)


def _exec_error_pipe():
    """The exec-error pipe's write end, closed on exec; None when the gateway gave none (the start-up check)."""
    value = os.environ.pop(EXEC_ERROR_ENV, None)
    if value is None:
        return None
    fd = int(value)
    os.set_inheritable(fd, False)
    return fd


def _listen(port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(BACKLOG)
    return listener


def _fork_forwarder(listeners: list, lifeline, exec_error) -> None:
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    if os.fork():
        os._exit(0)
    # The forwarder: holds none of the agent's pipes, so their ends are the agent's alone, and not the
    # exec-error pipe, which the agent could otherwise reach through it.
    if exec_error is not None:
        os.close(exec_error)
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
    # Out of descriptors or threads is the agent's own flood: waiting it out keeps the port served.
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            time.sleep(ACCEPT_RETRY_S)
            continue
        try:
            threading.Thread(target=_connect, args=(client, path), daemon=True).start()
        except RuntimeError:
            client.close()
            time.sleep(ACCEPT_RETRY_S)


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
