"""serve_trace: one file, to the Perfetto origin, on loopback, then stop."""

import contextlib
import errno
import gzip
import http.client
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from trace_reader import serve as serve_trace
from trace_reader.serve import PERFETTO_ORIGIN, ServeError, serve

TRACE_JSON = b'{"traceEvents": [{"name": "mlp_fwd", "ph": "X", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}'


class Running:
    """serve() in a thread on a free port; `.port`, `.path` from the link it announces."""

    def __init__(self, trace, **kw):
        self.lines = []
        self.result = None
        self.error = None
        self._ready = threading.Event()
        kw.setdefault("timeout", 20.0)
        kw.setdefault("open_browser", False)

        def run():
            try:
                self.result = serve(trace, port=0, out=self.lines.append, ready=self._on_ready, **kw)
            except BaseException as e:  # surfaced by the test, not swallowed
                self.error = e
            finally:
                self._ready.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self._ready.wait(10), "serve() never became ready"
        if self.error:
            raise self.error

    def _on_ready(self, link):
        self.link = link
        trace_url = urlsplit(link.split("url=", 1)[1])
        self.port, self.path = trace_url.port, trace_url.path
        self._ready.set()

    def request(self, method, path=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        hdrs = {"Origin": PERFETTO_ORIGIN}
        hdrs.update(headers or {})
        hdrs = {k: v for k, v in hdrs.items() if v is not None}
        conn.request(method, self.path if path is None else path, headers=hdrs)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp, body

    def finish(self, wait=10):
        self.thread.join(wait)
        assert not self.thread.is_alive(), "serve() did not return"
        if self.error:
            raise self.error
        return self.result


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "64_bf16_cold_eager.json"
    p.write_bytes(TRACE_JSON)
    return p


def test_fetch_returns_bytes_with_cors_and_stops(trace):
    s = Running(trace)
    assert s.link == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{s.port}/64_bf16_cold_eager.json"
    assert s.port != 0
    resp, body = s.request("GET")
    assert resp.status == 200
    assert body == TRACE_JSON
    assert resp.getheader("Access-Control-Allow-Origin") == PERFETTO_ORIGIN
    assert resp.getheader("Content-Length") == str(len(TRACE_JSON))
    assert resp.getheader("Content-Type") == "application/json"
    assert s.finish() == "fetched"
    assert s.lines[0].startswith(f"Serving 64_bf16_cold_eager.json on http://127.0.0.1:{s.port}/ ")
    # not on 9001: the printed link is 9001's, the one port the Perfetto UI fetches from (after a forward)
    assert "Open in Perfetto: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/64_bf16_cold_eager.json" in s.lines
    assert "fetched" in s.lines[-1]
    with pytest.raises(OSError):  # the port is closed once serve() returned
        socket.create_connection(("127.0.0.1", s.port), timeout=2).close()


def test_refused_requests_do_not_stop_the_server(trace):
    s = Running(trace)
    for path in ["/", "/other.json", "/../x", "/%2e%2e/x", "/%2E%2E/64_bf16_cold_eager.json",
                 "/..%2f64_bf16_cold_eager.json", "/" + str(trace)]:
        resp, body = s.request("GET", path)
        assert resp.status == 404, path
        assert TRACE_JSON not in body
    # the UI's probe for trace_processor_shell (POST /status) must be a plain miss
    resp, _ = s.request("POST", "/status")
    assert resp.status == 404
    resp, _ = s.request("GET", headers={"Origin": "https://evil.example"})
    assert resp.status == 403
    resp, _ = s.request("GET", headers={"Host": f"evil.example:{s.port}"})  # DNS rebinding
    assert resp.status == 403
    resp, body = s.request("HEAD")
    assert resp.status == 200 and body == b""
    assert s.thread.is_alive(), "a refused request or a HEAD stopped the server"
    # still serves the real file after all that, also to a Host naming another port (an ssh tunnel)
    resp, body = s.request("GET", headers={"Host": "localhost:9001"})
    assert body == TRACE_JSON
    assert s.finish() == "fetched"


def test_host_must_be_loopback_by_name_exactly(trace):
    """A rebinding name that only begins like loopback is refused; loopback itself, any case, any port, is served."""
    s = Running(trace)
    for host in ("localhost.evil.example", f"localhost.evil.example:{s.port}", "127.0.0.1.nip.io", "localhostx:80",
                 "127.0.0.10", "evil.localhost", ""):
        resp, body = s.request("GET", headers={"Host": host})
        assert resp.status == 403 and TRACE_JSON not in body, host
    for host in ("LOCALHOST", f"127.0.0.1:{s.port}", "localhost:9001"):
        assert s.request("HEAD", headers={"Host": host})[0].status == 200, host  # a HEAD is not the fetch
    assert s.thread.is_alive()
    resp, body = s.request("GET", headers={"Host": "localhost"})
    assert body == TRACE_JSON and s.finish() == "fetched"


def test_preflight_is_answered(trace):
    s = Running(trace, timeout=5.0)
    resp, _ = s.request("OPTIONS", headers={
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Private-Network": "true",
    })
    assert resp.status == 204
    assert resp.getheader("Access-Control-Allow-Origin") == PERFETTO_ORIGIN
    assert "GET" in resp.getheader("Access-Control-Allow-Methods")
    assert resp.getheader("Access-Control-Allow-Private-Network") == "true"
    resp, _ = s.request("OPTIONS", path="/other.json")
    assert resp.status == 404
    assert s.request("GET")[0].status == 200
    assert s.finish() == "fetched"


def test_gzip_served_raw_and_odd_names_quoted(tmp_path):
    raw = gzip.compress(TRACE_JSON)
    p = tmp_path / "my trace+1.json.gz"
    p.write_bytes(raw)
    s = Running(p)
    assert s.path == "/my%20trace%2B1.json.gz"
    resp, body = s.request("GET")
    assert body == raw  # the gzip bytes themselves; Perfetto inflates them
    assert resp.getheader("Content-Encoding") is None
    assert resp.getheader("Content-Type") == "application/gzip"
    assert s.finish() == "fetched"


def test_custom_origin_and_requests_that_are_not_perfettos_fetch(trace):
    s = Running(trace, allow_origin="http://localhost:8123")
    resp, _ = s.request("GET")  # Perfetto's origin is now a stranger
    assert resp.status == 403
    # No Origin: what any web page's <img src> or no-cors fetch to loopback sends; curl too. Not served, not counted.
    resp, body = s.request("GET", headers={"Origin": None})
    assert resp.status == 403 and TRACE_JSON not in body
    resp, body = s.request("GET", headers={"Origin": "http://localhost:8123", "Sec-Fetch-Mode": "no-cors"})
    assert resp.status == 403 and TRACE_JSON not in body
    assert s.thread.is_alive(), "a request that is not Perfetto's fetch used up the one fetch"
    resp, body = s.request("GET", headers={"Origin": "http://localhost:8123", "Sec-Fetch-Mode": "cors"})
    assert body == TRACE_JSON
    assert resp.getheader("Access-Control-Allow-Origin") == "http://localhost:8123"
    assert s.finish() == "fetched"


def test_a_client_that_reads_part_of_a_small_trace_and_leaves_has_not_fetched_it(trace):
    # The whole trace fits in the socket buffers, so the server's writes succeed even though the client left.
    s = Running(trace, timeout=1.5)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(f"GET {s.path} HTTP/1.0\r\nHost: 127.0.0.1:{s.port}\r\nOrigin: {PERFETTO_ORIGIN}\r\n\r\n".encode())
    assert sock.recv(100).startswith(b"HTTP/1.0 200")
    sock.close()  # with unread bytes: a reset, not a clean close
    assert s.finish() == "timed out"


def test_busy_port_is_found_before_serving(trace):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServeError, match=f"port {port} is in use"):
            serve_trace.check_port(port)
    serve_trace.check_port(port)  # free again: no error, and nothing left listening
    serve_trace.check_port(port)


def test_timeout(trace):
    s = Running(trace, timeout=0.5)
    assert s.finish() == "timed out"
    assert "timed out" in s.lines[-1]


def test_partial_download_is_not_fetched(tmp_path):
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (64 << 20))  # more than loopback socket buffers hold
    s = Running(big, timeout=1.5)
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(f"GET {s.path} HTTP/1.0\r\nHost: 127.0.0.1:{s.port}\r\nOrigin: {PERFETTO_ORIGIN}\r\n\r\n".encode())
    assert sock.recv(1024).startswith(b"HTTP/1.0 200")
    # RST instead of FIN, so the server's next write fails at once
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert s.finish() == "timed out"


def test_ctrl_c_interrupts(trace):
    if threading.current_thread() is not threading.main_thread() or os.name == "nt":
        pytest.skip("SIGINT reaches only the main thread, on POSIX")
    lines = []

    def ready(link):
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()

    # Ctrl-C as Python's default handler makes it, a KeyboardInterrupt, whatever handler is in place when the test
    # runs (in mutmut's clean run of 2026-12-02 it did not arrive as one: "timed out").
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = serve(trace, port=0, timeout=20.0, open_browser=False, out=lines.append, ready=ready)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert result == "interrupted"
    assert "interrupted" in lines[-1]


def test_busy_port_names_the_holder(trace):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ServeError) as exc:
            serve(trace, port=port, timeout=1.0, open_browser=False, out=lambda s: None)
    msg = str(exc.value)
    assert "\n" not in msg
    assert f"port {port} is in use" in msg and "--port" in msg
    if Path("/proc/net/tcp").exists():
        assert f"pid {os.getpid()}" in msg  # found through /proc/net/tcp and /proc/<pid>/fd


@pytest.mark.parametrize("make_bad, words", [
    (lambda d: d / "missing.json", "not found"),
    (lambda d: d, "not a file"),
])
def test_bad_file(tmp_path, make_bad, words):
    with pytest.raises(ServeError, match=words):
        serve(make_bad(tmp_path), port=0, timeout=1.0, open_browser=False, out=lambda s: None)


@contextlib.contextmanager
def unprivileged():
    """As root, act as `nobody` (effective uid only, given back after) so a chmod 000 file is unreadable, as it is
    to anyone else; CI and containers run as root. Otherwise nothing changes."""
    if os.geteuid() != 0:
        yield
        return
    import pwd  # POSIX only, as geteuid

    try:
        nobody = pwd.getpwnam("nobody").pw_uid
    except KeyError:
        nobody = 65534
    try:
        os.seteuid(nobody)
    except PermissionError:  # a container without CAP_SETUID
        pytest.skip("root here cannot drop to another user (no CAP_SETUID), and root reads a chmod 000 file")
    try:
        yield
    finally:
        os.seteuid(0)


@pytest.mark.skipif(os.name == "nt", reason="Windows has no chmod 000")
def test_unreadable_file(trace, monkeypatch):
    trace.chmod(0)
    trace.parent.chmod(0o711)  # nobody may look the file up in its folder, not read it
    monkeypatch.chdir(trace.parent)  # a relative path: the folders above (root's 0700 tmp) need not be searchable
    with unprivileged(), pytest.raises(ServeError, match=f"^cannot read {trace.name}: Permission denied$"):
        serve(trace.name, port=0, timeout=1.0, open_browser=False, out=lambda s: None)


def test_cli_ctrl_c_while_serving_exits_130(trace):
    root = Path(__file__).resolve().parents[1]  # the suite's serve_trace.py, the command over trace_reader/serve.py
    proc = subprocess.Popen([sys.executable, str(root / "serve_trace.py"), str(trace), "--no-browser", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        assert proc.stdout.readline().startswith("Serving ")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Server stopped: interrupted." in out and "Traceback" not in err


def test_cli_bad_input_is_one_line(tmp_path):
    root = Path(__file__).resolve().parents[1]  # the suite's serve_trace.py, the command over trace_reader/serve.py
    r = subprocess.run([sys.executable, str(root / "serve_trace.py"), str(tmp_path / "nope.json"), "--no-browser"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr.strip().count("\n") == 0 and "trace not found" in r.stderr
    assert "Traceback" not in r.stderr


# ------------------------------------------------------------------ each rule at its edge, and what it says

def raw_request(s, line):
    """The server's whole reply to a request line, byte for byte (http.client drops a HEAD reply's body itself)."""
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(f"{line} HTTP/1.0\r\nHost: 127.0.0.1\r\nOrigin: {PERFETTO_ORIGIN}\r\n\r\n".encode())
        reply = b""
        while chunk := sock.recv(1 << 16):
            reply += chunk
    return reply


def test_each_refusal_says_why_and_a_head_gets_no_body(trace):
    s = Running(trace)
    host = "Forbidden: serve_trace answers only 127.0.0.1 and localhost"
    for method, path, headers, code, reason in [
            ("GET", None, {"Host": "evil.example"}, 403, host),
            ("GET", None, {"Host": "localhost:1:2"}, 403, host),  # only what follows the last ':' is a port
            ("GET", None, {"Origin": "https://evil.example"}, 403, "Forbidden: origin not allowed"),
            ("GET", "/other.json", {}, 404, "Not Found"),
            ("POST", "/status", {}, 404, "Not Found")]:
        resp, body = s.request(method, path, headers)
        want = f"{code} {reason}\n".encode()
        assert (resp.status, body, resp.getheader("Content-Type"), resp.getheader("Content-Length")) == (
            code, want, "text/plain; charset=utf-8", str(len(want))), (method, path, headers)
    head, _, rest = raw_request(s, "HEAD /other.json").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 404") and b"\r\nContent-Length: 14" in head and rest == b""  # "404 Not Found\n"
    resp, body = s.request("GET")
    assert (resp.getheader("Cache-Control"), resp.getheader("Content-Type"), body) == (
        "no-store", "application/json", TRACE_JSON)
    assert s.finish() == "fetched"


def test_content_type_by_the_file_name():
    names = ("t.json", "t.json.gz", "t.pt.trace", "t.JSON", "json")
    assert [serve_trace._content_type(n) for n in names] == [
        "application/json", "application/gzip", "application/octet-stream", "application/octet-stream",
        "application/octet-stream"]


def test_bind_says_why_a_port_cannot_be_listened_on(monkeypatch, tmp_path):
    monkeypatch.setattr(serve_trace, "_TraceServer", lambda port, path, origin: ("listening", port, origin))
    assert [serve_trace._bind(p, tmp_path, "o")[1] for p in (0, 65535)] == [0, 65535]
    for port in (-1, 65536):
        with pytest.raises(ServeError) as e:
            serve_trace._bind(port, tmp_path, "o")
        assert str(e.value) == f"port {port} is out of range (0-65535)"

    def refusing(err):
        def server(*args):
            raise err
        return server

    for err, holder, said in [
            (OSError(errno.EADDRINUSE, "Address already in use"), None, "port 9 is in use; stop it or pass --port N"),
            (OSError(errno.EADDRINUSE, "Address already in use"), "pid 7 (python3 x)",
             "port 9 is in use by pid 7 (python3 x); stop it or pass --port N"),
            (OSError(errno.EACCES, "Permission denied"), None, "cannot listen on 127.0.0.1:9: Permission denied"),
            (OSError("no strerror"), None, "cannot listen on 127.0.0.1:9: no strerror")]:
        monkeypatch.setattr(serve_trace, "_TraceServer", refusing(err))
        monkeypatch.setattr(serve_trace, "_port_holder", lambda port, holder=holder: holder)
        with pytest.raises(ServeError) as e:
            serve_trace._bind(9, tmp_path, "o")
        assert str(e.value) == said


def test_check_port_binds_the_port_asked_for_and_not_port_zero(monkeypatch):
    seen = []

    class Server:
        def server_close(self):
            seen.append("closed")

    monkeypatch.setattr(serve_trace, "_bind", lambda *args: seen.append(args) or Server())
    serve_trace.check_port(0)  # any free port will do: nothing to check
    assert seen == []
    serve_trace.check_port(5)
    assert seen == [(5, Path(os.devnull), PERFETTO_ORIGIN), "closed"]


def test_listening_sockets_are_read_from_the_kernels_table():
    """/proc/net/tcp's rows, written by hand: the listening socket of the port (0x1F41 = 8001), in either table's
    address form, and not a connection on it, another port's listener, or a row cut short."""
    row = "{sl}: {local} 00000000:0000 {st} 00000000:00000000 00:00000000 00000000 0 0 {inode}"
    rows = [row.format(sl=0, local="0100007F:1F41", st="0A", inode=111) + " 1 0000000000000000 100 0 0 10 0",
            row.format(sl=1, local="0100007F:1F41", st="01", inode=222),  # established, not listening
            row.format(sl=2, local="0100007F:1F42", st="0A", inode=333),  # another port
            row.format(sl=3, local="00000000000000000000000001000000:1F41", st="0A", inode=444),  # tcp6's ::1
            "4: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0",  # cut short: no inode
            "5: 0100007F:1F41 00000000:0000 0A 00000000:00000000 00:00000000 00000000 0 0"]  # 9 fields: still none
    assert len(rows[1].split()) == 10  # the shortest row that holds the inode
    assert serve_trace._listening(8001, rows) == {"socket:[111]", "socket:[444]"}
    assert serve_trace._listening(8001, [rows[1].replace(" 01 ", " 0A ")]) == {"socket:[222]"}
    assert serve_trace._listening(8002, rows) == {"socket:[333]"} and serve_trace._listening(8003, rows) == set()


def test_busy_port_holder_found_in_either_table_past_a_missing_one(monkeypatch):
    if not Path("/proc/net/tcp").exists():
        pytest.skip("no /proc/net/tcp: Linux only")
    monkeypatch.setattr(serve_trace, "TCP_TABLES", ("/proc/net/missing", "/proc/net/tcp"))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        assert serve_trace._port_holder(holder.getsockname()[1]).startswith(f"pid {os.getpid()} (")
    monkeypatch.undo()
    if not socket.has_ipv6 or not Path("/proc/net/tcp6").exists():
        return
    try:
        holder6 = socket.socket(socket.AF_INET6)
        holder6.bind(("::1", 0))
    except OSError:
        return  # no IPv6 loopback here
    with holder6:
        holder6.listen()
        assert serve_trace._port_holder(holder6.getsockname()[1]).startswith(f"pid {os.getpid()} (")


def test_serve_checks_its_timeout_and_says_how_to_reach_another_port(monkeypatch, trace):
    for bad in (0, -1.5):
        with pytest.raises(ServeError) as e:
            serve(trace, port=0, timeout=bad, open_browser=False, out=lambda s: None)
        assert str(e.value) == f"timeout must be positive seconds, got {bad}"
    defaults = {k: p.default for k, p in __import__("inspect").signature(serve).parameters.items()}
    assert (defaults["timeout"], defaults["open_browser"], defaults["port"]) == (300.0, True, 9001)
    opened = []
    monkeypatch.setattr(serve_trace, "_open_browser", lambda link, out: opened.append((link, out)))
    # The scripts' --open and inspect_trace.py --open call serve() with its defaults: on 9001 (a free port stands
    # in for it here), a browser is opened on the link printed.
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setattr(serve_trace, "DEFAULT_PORT", port)
    lines = []
    assert serve(trace, port=port, timeout=0.2, out=lines.append) == "timed out"
    assert lines[1] == f"Open in Perfetto: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{port}/{trace.name}"
    assert opened == [(lines[1].removeprefix("Open in Perfetto: "), lines.append)]
    monkeypatch.undo()
    monkeypatch.setattr(serve_trace, "_open_browser", lambda link, out: opened.append((link, out)))
    opened.clear()
    # Another port: the Perfetto UI cannot fetch from it, so the link printed is 9001's, to open once 9001 forwards
    # here, and no browser is opened on a link that cannot work yet.
    s = Running(trace, timeout=None, open_browser=True)  # no deadline: served until fetched
    note = (f"Note: the Perfetto UI only fetches from 127.0.0.1:9001; forward that port to this one first "
            f"(ssh -L 9001:127.0.0.1:{s.port} <this host>), then open the link below.")
    assert s.lines[1:3] == [note, f"Open in Perfetto: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/{trace.name}"]
    assert opened == [] and s.link == f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{s.port}/{trace.name}"
    assert s.request("GET")[1] == TRACE_JSON and s.finish() == "fetched"
    other = Running(trace, allow_origin="http://localhost:8123")  # another origin: no word of Perfetto's port
    assert not any(line.startswith("Note:") for line in other.lines)
    assert other.request("GET", headers={"Origin": "http://localhost:8123"})[1] == TRACE_JSON
    assert other.finish() == "fetched"


def test_the_deadline_is_not_cut_short(trace):
    """Served until the timeout, not a second less: a fetch 0.9 s into a 1.5 s timeout is served."""
    s = Running(trace, timeout=1.5)
    threading.Event().wait(0.9)
    assert s.request("GET")[1] == TRACE_JSON and s.finish() == "fetched"


def test_a_client_still_connected_at_the_handlers_timeout_has_fetched(monkeypatch, trace):
    """It read the whole reply and neither closed nor reset its side: the handler's timeout ends the wait, and
    the trace counts as fetched (a browser tab that keeps its socket open has the file)."""
    monkeypatch.setattr(serve_trace._TraceHandler, "timeout", 0.5)
    s = Running(trace, timeout=10.0)
    with socket.create_connection(("127.0.0.1", s.port), timeout=10) as sock:
        sock.sendall(f"GET {s.path} HTTP/1.0\r\nHost: 127.0.0.1\r\nOrigin: {PERFETTO_ORIGIN}\r\n\r\n".encode())
        reply = b""
        while not reply.endswith(TRACE_JSON):
            reply += sock.recv(1 << 16)
        assert s.finish(wait=5) == "fetched"  # before this side closes


def test_a_client_that_resets_after_the_whole_body_has_not_fetched(trace):
    """The body all read, then a reset (SO_LINGER 0) rather than an orderly close: the server, waiting for the
    client's side to end, sees the reset, and by its rule (a reset is a client that left with bytes unread) the
    trace was not fetched."""
    s = Running(trace, timeout=1.0)  # the reset ends the server's wait at once; the timeout only stops it
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(f"GET {s.path} HTTP/1.0\r\nHost: 127.0.0.1\r\nOrigin: {PERFETTO_ORIGIN}\r\n\r\n".encode())
    reply = b""
    while chunk := sock.recv(1 << 16):  # to the end: the server has sent all and closed its side (FIN) first
        reply += chunk
    assert reply.endswith(TRACE_JSON)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    assert s.finish() == "timed out"


def test_header_names_are_written_as_the_http_spec_spells_them(trace):
    """What `curl -i` shows: each reply's header names, in order, as written on the wire (http.client keeps the
    case the server sent). Clients compare names case-insensitively; a reader comparing with the docs does not."""
    s = Running(trace)

    def names(method, path=None, headers=None):
        resp, _ = s.request(method, path, headers)
        return [n for n, _ in resp.getheaders() if n not in ("Server", "Date")]

    cors = ["Access-Control-Allow-Origin", "Vary"]
    assert names("GET", "/other.json") == [*cors, "Content-Type", "Content-Length"]
    assert names("OPTIONS", None, {"Access-Control-Request-Method": "GET",
                                   "Access-Control-Request-Headers": "range",
                                   "Access-Control-Request-Private-Network": "true"}) == [
        *cors, "Access-Control-Allow-Methods", "Access-Control-Allow-Headers",
        "Access-Control-Allow-Private-Network", "Access-Control-Max-Age", "Content-Length"]
    assert names("GET") == [*cors, "Content-Type", "Content-Length", "Cache-Control"]
    assert s.finish() == "fetched"


# ------------------------------------------------------------------ the command's own rules, in this process

def test_the_command_passes_its_flags_and_turns_outcomes_into_exit_codes(monkeypatch, capsys):
    """Defaults: port 9001, 300 s, a browser; each flag reaches serve(); "interrupted" exits 130 (128 + SIGINT),
    any other outcome 0, a refusal 1 with one line."""
    asked, outcome = [], ["fetched"]

    def fake_serve(path, **kw):
        asked.append((path, kw))
        if outcome[0] == "refuse":
            raise ServeError("trace not found: t.json")
        return outcome[0]

    monkeypatch.setattr(serve_trace, "serve", fake_serve)
    assert serve_trace.main(["t.json"]) == 0
    assert serve_trace.main(["t.json", "--port", "0", "--timeout", "1.5", "--no-browser"]) == 0
    assert asked == [("t.json", {"port": 9001, "timeout": 300.0, "open_browser": True}),
                     ("t.json", {"port": 0, "timeout": 1.5, "open_browser": False})]
    outcome[0] = "interrupted"
    assert serve_trace.main(["t.json"]) == 130
    outcome[0] = "timed out"
    assert serve_trace.main(["t.json"]) == 0
    outcome[0] = "refuse"
    assert serve_trace.main(["t.json"]) == 1
    assert capsys.readouterr().err == "error: trace not found: t.json\n"


def test_the_command_needs_a_trace(capsys):
    with pytest.raises(SystemExit) as e:
        serve_trace.main([])
    assert e.value.code == 2 and "the following arguments are required: trace" in capsys.readouterr().err


@pytest.mark.parametrize("opens, said", [(True, []), (False, ["No browser found: open the link above by hand."]),
                                         (RuntimeError("a broken $BROWSER"),
                                          ["No browser found: open the link above by hand."])])
def test_the_browser_is_asked_for_a_new_tab_and_a_failure_is_one_line(monkeypatch, opens, said):
    import webbrowser

    asked, lines = [], []

    def fake_open(link, new=0):
        asked.append((link, new))
        if isinstance(opens, Exception):
            raise opens
        return opens

    def out(line):
        lines.append(line)

    monkeypatch.setattr(webbrowser, "open", fake_open)
    before = set(threading.enumerate())
    serve_trace._open_browser("http://x", out)
    for t in set(threading.enumerate()) - before:
        assert t.daemon  # a console browser must not keep the command alive
        t.join(5)
    assert asked == [("http://x", 2)] and lines == said
