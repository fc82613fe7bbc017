"""Open one trace in the Perfetto UI without uploading it anywhere.

    uv run serve_trace.py traces/03_simple_mlp/<file>.json     (the suite)
    torch-trace --open <file>.json                               (the reader installed alone)

The Perfetto UI is a web page that runs entirely in your browser. Given a deep link
`https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/<file>`, the page itself fetches
the trace from this machine; the bytes go from this process to your browser tab and
nowhere else. Port 9001 is the only local address the page's security policy (CSP)
lets it fetch from, so it is the default.

`serve()` serves that ONE file on 127.0.0.1, prints the link, opens a browser if one is
available, and returns as soon as the whole file has been fetched ("fetched"), on Ctrl-C
("interrupted"), or after `timeout` seconds ("timed out").

On another port (`--port N`: 9001 is taken, or a remote machine's 9001 is) the printed link
is still 9001's, the one the page can fetch from, to open once `ssh -L 9001:127.0.0.1:N`
forwards that port here; no browser is opened, as the link cannot work before that.

For tests and embedding: `port=0` lets the OS pick a free port (the "Serving" line shows
it), `open_browser=False` skips the browser, and `ready(link)` is called with the deep
link to the port it listens on once the server is listening.
"""

from __future__ import annotations

import argparse
import errno
import http.server
import os
import shutil
import socket
import socketserver
import sys
import threading
import time
import webbrowser
from pathlib import Path
from typing import Callable
from urllib.parse import quote, unquote, urlsplit

PERFETTO_ORIGIN = "https://ui.perfetto.dev"
DEFAULT_PORT = 9001  # the only loopback origin in the Perfetto UI's connect-src CSP
HOST = "127.0.0.1"  # loopback only: nothing on the network can reach the trace

OUTCOMES = ("fetched", "interrupted", "timed out")


class ServeError(Exception):
    """A one-line, user-facing reason why the trace cannot be served."""


def perfetto_link(port: int, file_name: str) -> str:
    """The deep link that makes the Perfetto UI fetch `file_name` from 127.0.0.1:`port`."""
    return f"{PERFETTO_ORIGIN}/#!/?url=http://{HOST}:{port}/{quote(file_name)}"


def _content_type(name: str) -> str:
    if name.endswith(".gz"):
        return "application/gzip"
    if name.endswith(".json"):
        return "application/json"
    return "application/octet-stream"


class _TraceHandler(http.server.BaseHTTPRequestHandler):
    server: "_TraceServer"
    # HTTP/1.0 closes the connection after each reply, so no idle keep-alive socket outlives the server.
    protocol_version = "HTTP/1.0"
    # A browser's speculative pre-connection may never send a request; don't let it pin a thread.
    timeout = 10

    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass  # the reader's terminal shows the link and the outcome, not an access log

    # --- request checks -------------------------------------------------------------
    def _host_ok(self) -> bool:
        # Refusing other Host names defeats DNS rebinding (evil.example resolving to 127.0.0.1).
        # Any port: behind `ssh -L 9001:127.0.0.1:N` the browser's Host still says 9001.
        host = (self.headers.get("Host") or "").strip().lower()
        return host.rsplit(":", 1)[0] in {"127.0.0.1", "localhost"}

    def _origin_ok(self) -> bool:
        # Perfetto's fetch() is a CORS request: the browser always sends the page's Origin. A request
        # without it (an <img> or no-cors fetch from any web page, which a browser also sends to
        # loopback) or with another page's Origin is refused, so it can neither read the trace nor use
        # up the one fetch and stop the server. Sec-Fetch-Mode, when the browser sends it, must agree.
        if self.headers.get("Origin") != self.server.allow_origin:
            return False
        mode = self.headers.get("Sec-Fetch-Mode")
        return mode is None or mode.lower() == "cors"

    def _path_ok(self) -> bool:
        # Compare the decoded path with the one file name: `/`, other names, `/../x` and
        # `/%2e%2e/x` all differ from it, so nothing else on disk is reachable.
        path = unquote(urlsplit(self.path).path)
        return path == "/" + self.server.file_name

    def _refuse(self, code: int, reason: str) -> None:
        body = f"{code} {reason}\n".encode()
        self.send_response(code)
        self._cors_headers()
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _check(self) -> bool:
        if not self._host_ok():
            self._refuse(403, "Forbidden: serve_trace answers only 127.0.0.1 and localhost")
        elif not self._origin_ok():
            self._refuse(403, "Forbidden: origin not allowed")
        elif not self._path_ok():
            self._refuse(404, "Not Found")
        else:
            return True
        return False

    def _cors_headers(self) -> None:
        # One exact origin, not "*": only the Perfetto page may read the trace from its script.
        self.send_header("Access-Control-Allow-Origin", self.server.allow_origin)
        self.send_header("Vary", "Origin")

    # --- methods ----------------------------------------------------------------------
    def do_OPTIONS(self) -> None:
        # Perfetto's fetch(url) is a simple GET and needs no CORS preflight; Chrome versions that
        # ran Private Network Access checks still sent one for a public page reaching loopback.
        if not self._check():
            return
        self.send_response(204)
        self._cors_headers()
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
        requested = self.headers.get("Access-Control-Request-Headers")
        if requested:
            self.send_header("Access-Control-Allow-Headers", requested)
        if (self.headers.get("Access-Control-Request-Private-Network") or "").lower() == "true":
            self.send_header("Access-Control-Allow-Private-Network", "true")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        # On load the UI POSTs /status to 127.0.0.1:9001 looking for trace_processor_shell;
        # a 404 tells it there is none and it goes on to fetch the ?url= trace.
        self._refuse(404, "Not Found")

    def do_HEAD(self) -> None:
        self._send_trace(body=False)

    def do_GET(self) -> None:
        self._send_trace(body=True)

    def _send_trace(self, *, body: bool) -> None:
        if not self._check():
            return
        try:
            f = open(self.server.trace_path, "rb")
        except OSError as e:
            self._refuse(404, f"Not Found ({e.strerror})")
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            self.send_response(200)
            self._cors_headers()
            # Raw bytes, no Content-Encoding even for .json.gz: Perfetto recognises gzip by its
            # magic bytes and inflates it itself, and Content-Length stays the size on disk,
            # which the UI uses for its progress bar.
            self.send_header("Content-Type", _content_type(self.server.file_name))
            self.send_header("Content-Length", str(size))
            self.send_header("Cache-Control", "no-store")  # a re-run's new trace must not come from cache
            self.end_headers()
            if not body:
                return
            try:
                shutil.copyfileobj(f, self.wfile, 1 << 20)
                self.wfile.flush()
            except OSError:
                return  # the tab went away mid-transfer: not fetched, keep serving for a retry
        if self._client_kept_it_all():
            self.server.fetched.set()

    def _client_kept_it_all(self) -> bool:
        """True once the client has closed its side cleanly after the whole body: only then was it fetched.

        Writing the last byte only means the kernel took it: a small trace fits in the socket buffers even
        when the client read 100 bytes and left. So end our side (FIN after the body) and wait for the
        client's: an orderly close means it read everything, and so does a client still connected at the
        handler's timeout; a reset means it closed with bytes unread.
        """
        try:
            self.connection.shutdown(socket.SHUT_WR)
            while self.connection.recv(1 << 16):
                pass  # anything after the request (a pipelined one) is ignored
            return True
        except TimeoutError:
            return True
        except OSError:  # ConnectionResetError
            return False


class _TraceServer(http.server.ThreadingHTTPServer):
    daemon_threads = True  # an unfinished connection must not keep the process alive
    # SO_REUSEADDR lets us rebind right after a previous run (TIME_WAIT) on POSIX; on Windows
    # it would let two servers share the port, so it stays off there.
    allow_reuse_address = os.name != "nt"

    def __init__(self, port: int, trace_path: Path, allow_origin: str):
        self.trace_path = trace_path
        self.file_name = trace_path.name
        self.allow_origin = allow_origin
        self.fetched = threading.Event()
        super().__init__((HOST, port), _TraceHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind would reverse-resolve 127.0.0.1 (getfqdn), which can stall for seconds.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")  # Linux's sockets, IPv4 and IPv6


def _listening(port: int, lines: list[str]) -> set[str]:
    """The sockets ('socket:[inode]', as /proc/<pid>/fd links name them) listening on `port`, from the rows of a
    /proc/net/tcp table (its header left out): sl, local_address (hex ip:hex port), rem_address, st (0A = LISTEN),
    ..., inode; a row too short to hold them all is passed over."""
    inodes = set()
    for line in lines:
        fields = line.split()
        if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
            inodes.add(f"socket:[{fields[9]}]")
    return inodes


def _port_holder(port: int) -> str | None:
    """'pid 123 (python3 -m http.server 9001)' for the process listening on `port`, if Linux tells us."""
    inodes = set()
    for table in TCP_TABLES:
        try:
            inodes |= _listening(port, Path(table).read_text().splitlines()[1:])
        except OSError:
            continue
    if not inodes:
        return None
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in inodes:
                    cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
                    return f"pid {proc.name} ({cmd or '?'})"
        except OSError:
            continue  # another user's process, or it exited while we looked
    return None


def _bind(port: int, trace_path: Path, allow_origin: str) -> _TraceServer:
    if not 0 <= port <= 65535:
        raise ServeError(f"port {port} is out of range (0-65535)")
    try:
        return _TraceServer(port, trace_path, allow_origin)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            holder = _port_holder(port)
            who = f" by {holder}" if holder else ""
            raise ServeError(f"port {port} is in use{who}; stop it or pass --port N") from None
        raise ServeError(f"cannot listen on {HOST}:{port}: {e.strerror or e}") from None


def check_port(port: int) -> None:
    """Raise ServeError now if `port` cannot be listened on (busy, say), before a long run that ends in serve()."""
    if port == 0:
        return
    _bind(port, Path(os.devnull), PERFETTO_ORIGIN).server_close()


def _check_trace(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists():
        raise ServeError(f"trace not found: {p}")
    if not p.is_file():
        raise ServeError(f"not a file: {p}")
    try:
        with open(p, "rb"):
            pass
    except OSError as e:
        raise ServeError(f"cannot read {p}: {e.strerror or e}") from None
    return p.resolve()


def _open_browser(link: str, out: Callable[[str], object]) -> None:
    def worker() -> None:
        try:
            opened = webbrowser.open(link, new=2)
        except Exception:  # no browser, a broken $BROWSER: the printed link is enough
            opened = False
        if not opened:
            out("No browser found: open the link above by hand.")

    # A thread, because a console browser (lynx, w3m) would block here until it exits.
    threading.Thread(target=worker, daemon=True).start()


def serve(
    path: str | os.PathLike,
    *,
    port: int = DEFAULT_PORT,
    timeout: float | None = 300.0,
    open_browser: bool = True,
    out: Callable[[str], object] = print,
    allow_origin: str = PERFETTO_ORIGIN,
    ready: Callable[[str], object] | None = None,
) -> str:
    """Serve `path` once to the Perfetto UI; return "fetched", "interrupted" or "timed out".

    port=0 picks a free port (shown in the "Serving" line). On a port other than 9001 the Perfetto
    UI cannot fetch from, so the printed link is 9001's, to open once that port forwards here,
    and no browser is opened. `timeout=None` waits until fetched or Ctrl-C. `allow_origin` is
    the one web origin allowed to read the file (default the Perfetto UI). `ready(link)` runs
    once the server listens, with the deep link to the port it listens on. Raises ServeError
    for a missing or unreadable file, a busy port or a port that cannot be bound.
    """
    if timeout is not None and not timeout > 0:
        raise ServeError(f"timeout must be positive seconds, got {timeout}")
    trace_path = _check_trace(path)
    server = _bind(port, trace_path, allow_origin)
    bound_port = server.server_address[1]
    link = perfetto_link(bound_port, trace_path.name)
    # The Perfetto UI fetches from 127.0.0.1:9001 only: on another port, the link that works is 9001's, once that
    # port forwards here; a browser opened now would show an error (or another server's file on 9001).
    forward = bound_port != DEFAULT_PORT and allow_origin == PERFETTO_ORIGIN
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    outcome = "timed out"
    try:
        out(f"Serving {trace_path.name} on http://{HOST}:{bound_port}/ (only this file, only to this machine)")
        if forward:
            out(f"Note: the Perfetto UI only fetches from {HOST}:{DEFAULT_PORT}; forward that port to this one first "
                f"(ssh -L {DEFAULT_PORT}:{HOST}:{bound_port} <this host>), then open the link below.")
        out(f"Open in Perfetto: {perfetto_link(DEFAULT_PORT, trace_path.name) if forward else link}")
        if open_browser and not forward:
            _open_browser(link, out)
        if ready is not None:
            ready(link)
        deadline = None if timeout is None else time.monotonic() + timeout
        # Short waits keep the main thread responsive to Ctrl-C.
        while not server.fetched.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            server.fetched.wait(0.2 if left is None else min(0.2, left))
        if server.fetched.is_set():
            outcome = "fetched"
    except KeyboardInterrupt:
        outcome = "interrupted"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    out(f"Server stopped: {outcome}.")
    return outcome


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Open one trace in the Perfetto UI, served from 127.0.0.1 only.")
    parser.add_argument("trace", help="a .json or .json.gz trace file")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="loopback port (default 9001, the one Perfetto allows)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds (default 300)")
    parser.add_argument("--no-browser", action="store_true", help="only print the link")
    args = parser.parse_args(argv)
    try:
        outcome = serve(args.trace, port=args.port, timeout=args.timeout, open_browser=not args.no_browser)
    except ServeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 130 if outcome == "interrupted" else 0  # Ctrl-C: the shell's usual 128 + SIGINT


if __name__ == "__main__":
    sys.exit(main())
