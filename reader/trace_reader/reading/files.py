"""Reading a trace file: JSON or gzip, capped (a trace is untrusted input: bytes, objects, nesting), decoded by
msgspec where it can (fast_json.py) and by the stdlib's json otherwise, then built into a Trace (tree.py); the
Inductor kernel sources a trace names, only on request."""

from __future__ import annotations

import contextlib
import functools
import gc
import gzip
import json
import os
import stat
import time
import zlib
from pathlib import Path

from .events import Trace, TraceError
from .tree import Side, assemble, event_lists, parse_trace

# A trace is untrusted input. What it may cost to read is bounded here, well above any real trace
# (the 35 MB, 600-step traces this suite was tried on are ~3% of it): past a limit, one line, nothing more.
MAX_JSON_BYTES = 1 << 30  # JSON text, after gzip


# ...and in objects: each event becomes a Python object of ~200 B, so that 100 MB of `{},` (33M events) took 6.6 GB.
# Real traces hold one `{` per 102-208 B of JSON (events and their args, the traces in tests/data): 2^24 is a 1 GiB trace at 64 B per object.
MAX_JSON_OBJECTS = 1 << 24


# Inductor's kernel sources are read only on request (--kernel-files), and then: regular files, this small,
# this long in all.
MAX_KERNEL_FILE_BYTES = 1 << 20


KERNEL_FILES_SECONDS = 2.0


_CHUNK = 1 << 20


def _size(n: int) -> str:
    return f"{n / 2**30:g} GiB" if n >= 2**30 else f"{n / 2**20:g} MiB"


def _read_capped(p: Path, max_bytes: int) -> bytes:
    """The file's JSON text (gunzipped whatever its name), at most max_bytes of it; streamed, so a gzip bomb
    costs no more memory than the cap. A trace is a JSON object: anything else is refused at its first byte."""
    with open(p, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise TraceError(f"{p}: not a regular file")
        zipped = f.read(2) == b"\x1f\x8b"  # gzip magic
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        if not zipped and size > max_bytes:
            raise TraceError(f"{p}: larger than {_size(max_bytes)}, the reader's limit for one trace")
        src = gzip.GzipFile(fileobj=f) if zipped else f
        # A plain file, its size known and capped, is read in one piece: nothing to join (87 MB: 0.28 -> 0.15 s).
        piece = _CHUNK if zipped else size + 1
        parts, total, started = [], 0, False
        while chunk := src.read(piece):
            total += len(chunk)
            if total > max_bytes:
                raise TraceError(f"{p}: more than {_size(max_bytes)} of JSON{' once decompressed' if zipped else ''}"
                                 " (the reader's limit for one trace; a gzip bomb?)")
            if not started:  # leading whitespace is not kept: a gzip of blanks costs nothing
                chunk = chunk.lstrip()
                if not chunk:
                    continue
                if chunk[:1] != b"{":
                    raise TraceError(f"{p}: not a torch.profiler trace (a JSON object starts with '{{', "
                                     f"this starts with {chunk[:8]!r})")
                started = True
            parts.append(chunk)
    if not parts:
        raise TraceError(f"{p}: empty file" + (" (only whitespace)" if total else ""))
    return b"".join(parts)


@functools.cache
def _fast():
    """The module fast_json (msgspec's decoders) where msgspec is installed and refuses deep nesting (a decoder
    that recursed without limit would crash the process on a deeply nested file, as orjson 3.13.0 did); else None.
    Only a speed-up: the stdlib decodes everything without it."""
    try:
        from . import fast_json
    except ImportError:
        return None
    try:
        fast_json.decode(b"[" * 2048 + b"]" * 2048)
    except fast_json.refused:
        return fast_json
    return None


def _loads(text: bytes) -> object:
    """The JSON value of text, by msgspec where usable (see _fast; what it refuses goes to the stdlib), else the
    stdlib's."""
    fast = _fast()
    return json.loads(text) if fast is None else fast.loads(text)


def _fast_events(text: bytes) -> tuple[dict, list, object] | None:
    """(the top-level keys but traceEvents, decoded; the events, as msgspec's structs; the fast_json.Source of
    their args) of a trace's JSON; None where msgspec is not in use or refuses any of it (then the stdlib reads it
    all, or says why it cannot). What the reader does not use is checked as JSON but not decoded: an integer of
    more than 4300 digits there does not refuse the file as the stdlib does (see fast_json.args_of)."""
    fast = _fast()
    if fast is None:
        return None
    try:
        if not text.isascii():
            text.decode()  # msgspec checks the UTF-8 of what it decodes, not of the args it skips
        top, raw = _split(text, fast)
        if raw is None:
            return None
        try:
            events = fast.events(raw)
        except fast.refused:
            if not isinstance(raw, memoryview):  # the file's own events: msgspec refuses them
                raise
            top = fast.top(text)  # a wrong guess (see _split): the long way (the guess saw the key: it is there)
            events = fast.events(raw := top.pop("traceEvents"))
        return {k: fast.decode(v) for k, v in top.items()}, events, fast.Source(events, raw)
    except (*fast.refused, UnicodeDecodeError):
        return None


_HOLE = b'"(trace_reader: the traceEvents list was here)"'


def _split(text: bytes, fast) -> tuple[dict, object]:
    """(the top-level keys but traceEvents, as raw JSON; the JSON of traceEvents' value, None if there is none).

    Cheap: the events are nearly all of the file, and finding their end by decoding skips through all of them (0.17
    s of 87 MB). A torch trace has a few small keys around them, so their value is guessed as the span from the
    first "[" after the first '"traceEvents"' to one of the file's last "]" (a memoryview), and the rest, with a
    hole where the span was, is decoded alone. It must be a JSON object whose traceEvents (the last of that key,
    as a decoder keeps) is the hole: the text before the span is the same in both, so the span begins where the
    top-level traceEvents' value begins. A "]" inside a string of the last keys cannot pass (the quotes after it
    pair up wrongly); one of a list there can, and then the events decoder, which takes only one whole JSON value,
    refuses the span and _fast_events reads the file the long way, as it does when no guess passes."""
    key = text.find(b'"traceEvents"')
    start = text.find(b"[", key) if key >= 0 else -1
    end = len(text)
    for _ in range(3 if start >= 0 else 0):
        end = text.rfind(b"]", start, end)
        if end < 0:
            break
        rest = text[:start] + _HOLE + text[end + 1:]
        try:
            top = fast.top(rest)
        except fast.refused:
            continue
        hole = top.pop("traceEvents", None)
        if hole is not None and bytes(hole) == _HOLE and rest.count(_HOLE) == 1:
            return top, memoryview(text)[start:end + 1]
    top = fast.top(text)
    return top, top.pop("traceEvents", None)


@contextlib.contextmanager
def _reading(p: Path):
    """Reading and decoding a trace file: what can go wrong, each in one line."""
    try:
        yield
    except (OSError, EOFError, zlib.error) as e:
        raise TraceError(f"{p}: cannot read ({e.__class__.__name__}: {e}); truncated or not gzip?") from None
    except UnicodeDecodeError:
        raise TraceError(f"{p}: not text JSON (binary content)") from None
    except json.JSONDecodeError as e:
        raise TraceError(f"{p}: not valid JSON ({e.msg}: line {e.lineno}, column {e.colno}); truncated file?") from None
    except ValueError as e:  # an integer of more than sys.get_int_max_str_digits() digits (4300)
        raise TraceError(f"{p}: not valid JSON ({str(e).split(':')[0]})") from None
    except RecursionError:
        raise TraceError(f"{p}: JSON nested too deeply to be a trace") from None
    except MemoryError:
        raise TraceError(f"{p}: out of memory while parsing the JSON") from None


def _read_text(path: str | Path, max_bytes: int | None = None) -> bytes:
    p = Path(path)
    if not p.exists():
        raise TraceError(f"{p}: no such file")
    if not p.is_file():
        raise TraceError(f"{p}: not a file")
    with _reading(p):
        text = _read_capped(p, MAX_JSON_BYTES if max_bytes is None else max_bytes)
    if (objects := text.count(b"{")) > MAX_JSON_OBJECTS:  # an upper bound (a brace in a string counts too), in C
        raise TraceError(f"{p}: {objects:,} JSON objects in {len(text):,} bytes, past this reader's limit of "
                         f"{MAX_JSON_OBJECTS:,} (a real trace holds one per 100-200 bytes): not read")
    return text


def _decode(text: bytes, path: str | Path) -> object:
    with _reading(Path(path)):
        return _loads(text)


def read_json(path: str | Path) -> dict:
    return _decode(_read_text(path), path)


@contextlib.contextmanager
def no_gc():
    """A trace is 10^5-10^6 small objects: the cyclic GC would rescan them again and again while we work.

    On the way out they go straight to the oldest generation (freeze, then unfreeze: a list splice), so the
    collector's next young pass does not scan them all either; a full collection still frees them when due."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.freeze()
            gc.unfreeze()
            gc.enable()


def load_trace(path: str | Path, require_steps: bool = True, kernel_files: bool = False,
               max_bytes: int | None = None) -> Trace:
    """Read a Chrome trace exported by torch.profiler (.json or .json.gz). Raises TraceError on bad input.

    A trace recorded without prof.step() (no ProfilerStep#N spans) is read as one step spanning all of it
    (Trace.whole); require_steps refuses a trace with nothing to read at all.
    kernel_files: also read the Inductor kernel sources the trace names (bounded; see read_kernel_sources).
    Off by default: a trace is untrusted input and must not make the reader open other files.
    """
    with no_gc():
        text = _read_text(path, max_bytes)
        try:
            trace = _parse_fast(text, str(path))
            if trace is None:
                trace = parse_trace(_decode(text, path), str(path))
        except (TypeError, ValueError, AttributeError, KeyError) as e:  # odd types where a trace has numbers
            raise TraceError(f"{path}: malformed trace ({type(e).__name__}: {e})") from None
    if require_steps and not trace.steps:
        raise TraceError(f"{path}: no CPU ops, runtime calls or GPU work in the trace: nothing to read")
    if kernel_files:
        trace.kernel_sources = read_kernel_sources(trace)
    return trace


def read_kernel_sources(trace: Trace) -> dict[str, str]:
    """{path: text} of the Inductor kernel files the trace's ops name ("kernel_file"), where each is a regular
    file of at most MAX_KERNEL_FILE_BYTES on this machine, within KERNEL_FILES_SECONDS in all; others are left out."""
    paths = {e.args["kernel_file"] for st in trace.steps for e in st.spans
             if isinstance(e.args.get("kernel_file"), str) and e.args["kernel_file"]}
    out: dict[str, str] = {}
    deadline = time.monotonic() + KERNEL_FILES_SECONDS
    for path in sorted(paths):
        if time.monotonic() > deadline:
            break
        try:  # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        except (OSError, ValueError):
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_KERNEL_FILE_BYTES:
                out[path] = os.read(fd, MAX_KERNEL_FILE_BYTES).decode()
        except (OSError, UnicodeDecodeError):
            pass
        finally:
            os.close(fd)
    return out


def _parse_fast(text: bytes, path: str) -> Trace | None:
    """The Trace of a trace's JSON text, decoded by msgspec (see fast_json); None where msgspec is not in use or
    refuses any of it."""
    decoded = _fast_events(text)
    if decoded is None:
        return None
    meta, events, source = decoded
    spans, calls, gpu, into = event_lists()
    skipped, sort, side = 0, into.get, Side()
    for i, e in enumerate(events):  # as parse_trace does with each dict, and Event.__init__ with what it keeps
        if e.ph != "X" or (out := sort(e.cat)) is None:
            if side.take(e.ph, e.cat, e.name, e.id, e.pid, e.tid, e.ts, lambda: e):  # its args, from the args pass
                e.source = source
            else:
                events[i] = None  # not the reader's: freed now, not held for the args pass (see fast_json.Source)
            continue
        ts = e.ts  # in range, or msgspec refused it (fast_json.DecodedEvent): then the stdlib skips the event
        if ts is None:
            skipped += 1
            events[i] = None
            continue
        e.dur = dur = e.dur or 0.0
        e.end, e.source = ts + dur, source
        if (links := e.links) is not None:
            e.ext, e.corr = links.ext, links.corr
        out.append(e)
    return assemble(spans, calls, gpu, skipped, meta, path, side)
