"""Hostile traces: nothing read that the user did not ask for, bounded memory, one line, never a nonsense verdict.

The inputs are built here from the committed H200 traces (tests/data) by editing the parsed JSON; the gzip bombs
are generated in tmp at test time (multi-member gzip: one small compressed block written many times)."""

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import python_for

from trace_reader.reading import tree
from trace_reader.reading import events as trace_events
from trace_reader.analyzers import steps
from trace_reader.analyzers import annotations
import inspect_trace as it
from trace_reader.reading import files as read

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
TRITON = "triton_poi_fused__unsafe_view_gelu_mul_0"


def cli(*args, timeout=60, decoder="msgspec"):
    """The CLI in a child process, decoding with msgspec where installed, or with the stdlib's decoder."""
    return subprocess.run([*python_for(decoder), str(ROOT / "inspect_trace.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


def raw(name: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"h200_{name}.json.gz").read_bytes()))


def one_line_error(proc, *words):
    assert proc.returncode == 2, proc
    assert proc.stdout == "" and "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("inspect_trace.py: error: "), proc.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])


# ------------------------------------------------------------------------------------ files a trace names

def compiled_with_kernel_file(tmp_path: Path, target: str) -> Path:
    data = raw("mlp_compile")
    ops = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == TRITON]
    assert len(ops) == 3
    for e in ops:
        e["args"]["kernel_file"] = target
    path = tmp_path / f"named_{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(data))
    return path


def fused_row(text: str) -> str:
    [row] = [ln for ln in text.splitlines() if TRITON in ln and "triton_poi" in ln.split()[1]]
    return row


def test_kernel_file_is_read_only_when_asked_and_then_bounded(tmp_path):
    # The Inductor source: the first buffer is read and written back (in_out_ptr0), so it counts twice.
    src = tmp_path / "kernel.py"
    src.write_text(f"def {TRITON}(in_out_ptr0, in_ptr0, xnumel, XBLOCK):\n    pass\n")
    good = compiled_with_kernel_file(tmp_path, str(src))
    t = it.load_trace(good)
    assert t.kernel_sources == {}  # not asked: nothing opened
    assert ">=" in fused_row(it.report(t))
    asked = it.load_trace(good, kernel_files=True)
    assert asked.kernel_sources == {str(src): src.read_text()}
    durs = [k.dur for st in asked.steps for k in st.kernels if k.name == TRITON]
    exact = sum((2 * 8192 * 3072 + 8192 * 3072) * 2 / d / 1e3 for d in durs) / len(durs)  # GB/s
    row = fused_row(it.report(asked))
    assert ">=" not in row and f"{exact:,.0f} GB/s" in row

    # Asked, but the path is no regular file, too big, or a FIFO (which would block a plain open for ever).
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * (read.MAX_KERNEL_FILE_BYTES + 1))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in ("/dev/zero", str(big), str(fifo), str(tmp_path)):
        path = compiled_with_kernel_file(tmp_path, target)
        proc = cli("--kernel-files", path, timeout=30)
        assert proc.returncode == 0 and proc.stderr == "", (target, proc.stderr)
        assert ">=" in fused_row(proc.stdout), target
        assert it.load_trace(path, kernel_files=True).kernel_sources == {}, target


# ------------------------------------------------------------------------------------------- gzip bombs

def bomb(path: Path, block: bytes, copies: int, head: bytes = b"") -> Path:
    """A multi-member gzip file: `head`, then `block` `copies` times once decompressed; written in pieces."""
    member = gzip.compress(block, compresslevel=9)
    with open(path, "wb") as f:
        if head:
            f.write(gzip.compress(head))
        for _ in range(copies):
            f.write(member)
    return path


def max_rss_mib_of(args) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI in a child and return its peak resident memory (ru_maxrss of the waited-for children)."""
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
            "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); sys.exit(p.returncode)")
    proc = subprocess.run([sys.executable, "-c", code, sys.executable, str(ROOT / "inspect_trace.py"), *map(str, args)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    *err, rss = proc.stderr.strip().splitlines()
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, "\n".join(err) + "\n"), int(rss) / 1024


def test_gzip_bomb_of_zeros_costs_no_memory(tmp_path):
    path = bomb(tmp_path / "zeros.json.gz", bytes(64 << 20), 32)  # 2 GiB of zeros in ~2 MB
    assert path.stat().st_size < 8 << 20
    proc, rss = max_rss_mib_of([path])
    one_line_error(proc, "not a torch.profiler trace")
    assert rss < 400, f"{rss:.0f} MiB"  # the interpreter and imports; not the 2 GiB


def test_millions_of_empty_events_are_refused_before_they_become_objects(tmp_path):
    """A 0.2 MB gzip of `{},` 17.8 million times (53 MB of valid JSON, under the byte limit): each event would be a
    Python object (6.6 GB for 33M); counted first, 17.8M objects are past read.MAX_JSON_OBJECTS (2^24): one line,
    and the child's peak memory is the text's, not the events'. A trace of real density at the byte limit (one
    object per 64 B of 1 GiB) is within it."""
    n = 17 * (1 << 20)  # 17.8M > 2^24 = 16.8M
    path = bomb(tmp_path / "empty_events.json.gz", b"{}," * (1 << 20), 17, head=b'{"traceEvents": [')
    with open(path, "ab") as f:
        f.write(gzip.compress(b"{}]}"))
    proc, rss = max_rss_mib_of([path])
    one_line_error(proc, f"{n + 2:,} JSON objects in {3 * n + 21:,} bytes", "limit of 16,777,216")
    assert rss < 500, f"{rss:.0f} MiB"  # the interpreter, imports and 53 MB of text; not 17.8M events
    assert read.MAX_JSON_OBJECTS == 1 << 24 and (1 << 30) // 64 == read.MAX_JSON_OBJECTS


def test_decompressed_size_is_capped_with_one_line(tmp_path, decoder):
    # '{' then blanks: valid so far, so only the cap stops it. In-process with a small cap to keep the test fast;
    # the same code runs under the 1 GiB default.
    path = bomb(tmp_path / "blank.json.gz", b" " * (4 << 20), 8, head=b'{"traceEvents": [')
    with pytest.raises(it.TraceError) as e:
        it.load_trace(path, max_bytes=16 << 20)
    assert str(e.value) == (f"{path}: more than 16 MiB of JSON once decompressed "
                            "(the reader's limit for one trace; a gzip bomb?)")
    # A file of blanks only is an empty file, however long; leading blanks are not kept in memory.
    only = bomb(tmp_path / "only_blank.json.gz", b" \n\t" * (1 << 20), 4)
    with pytest.raises(it.TraceError, match="empty file \\(only whitespace\\)"):
        it.load_trace(only)
    # Blanks over more than one piece of the stream (read._CHUNK), then a trace: read, not taken for an empty file.
    trace = json.dumps({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]})
    late = bomb(tmp_path / "late.json.gz", b" " * (read._CHUNK + 10), 2, head=b"\n")
    with open(late, "ab") as f:
        f.write(gzip.compress(trace.encode()))
    assert [e.name for e in it.load_trace(late).steps[0].spans] == ["aten::mm"]
    assert read.MAX_JSON_BYTES == 1 << 30


def test_plain_file_over_the_cap_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:  # sparse: 2 GiB on paper, nothing on disk
        f.write(b"{")
        f.truncate(2 << 30)
    proc, rss = max_rss_mib_of([path])
    one_line_error(proc, "larger than 1 GiB")
    assert rss < 400


# ---------------------------------------------------------------------------------------- malformed fields

def test_malformed_fields_are_skipped_not_a_traceback(tmp_path, decoder):
    data = raw("mlp_eager")
    data["deviceProperties"][0]["name"] = {"not": "a string"}
    data["deviceProperties"][0]["numSms"] = "132"
    mms = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op" and e.get("name") == "aten::mm"]
    for e in mms[:3]:  # the first step's three GEMMs: shapes as strings
        e["args"]["Input Dims"] = [[str(d) for d in dims] for dims in e["args"]["Input Dims"]]
    for e in mms[3:6]:  # the second step's: absurd sizes, as a made-up trace could say
        e["args"]["Input Dims"] = [[2**39, 2**39], [2**39, 2**39]]
    for e in data["traceEvents"]:
        if e.get("cat") == "cpu_op" and e.get("name") == "aten::gelu":
            e["args"]["Input Dims"] = [[2**39, 2**39, 2**39], []]
    kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
    kernels[2]["dur"] = float("nan")
    kernels[3]["dur"] = -7.0
    kernels[4]["dur"] = 1e308
    kernels[5]["ts"] = "soon"
    path = tmp_path / "malformed.json"
    path.write_text(json.dumps(data))  # json writes NaN as NaN, as a careless exporter would
    proc = cli(path, decoder=decoder)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    text = proc.stdout
    assert "\ndevice  ? (no usable name) (sm_90, 140 GiB)\n" in text
    assert ("\nskipped 4 events with unusable times (missing, NaN, negative or beyond 27 hours): "
            "not counted anywhere below\n") in text
    numbers, body = [], text.split("not counted anywhere below\n")[1]
    for tok in body.replace("–", " ").replace("%", " ").replace(",", "").split():
        try:
            numbers.append(float(tok))
        except ValueError:
            continue
    assert numbers and all(0 <= x < 1e7 for x in numbers), [x for x in numbers if not 0 <= x < 1e7]
    t = it.load_trace(path)
    assert t.skipped == 4 and t.device_name is None
    assert all(0 <= k.dur < 1e3 for st in t.steps for k in st.gpu)
    # each step still gets a verdict from what is valid, and the one-line verdict is a real step's
    verdicts = [ln for ln in text.splitlines() if ln.startswith("=> typical step")]
    assert len(verdicts) == 1 and "-bound, GPU busy" in verdicts[0]


def test_wrong_types_where_numbers_belong_are_one_line(tmp_path, decoder):
    data = raw("mlp_eager")
    data["traceEvents"] = {"not": "a list"}
    path = tmp_path / "events_dict.json"
    path.write_text(json.dumps(data))
    one_line_error(cli(path, decoder=decoder), "no 'traceEvents' list")
    deep = tmp_path / "deep.json"
    deep.write_text('{"traceEvents": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line_error(cli(deep, decoder=decoder), "nested too deeply")


# ------------------------------------------------------------------------------ the JSON, under both decoders

STEP = '{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100}'


def one_op(**fields: str) -> str:
    """A trace of one step and one CPU op whose fields are the given JSON texts (ts, dur, name, args)."""
    op = {"ts": "10", "dur": "5", "name": '"aten::mm"', **fields}
    body = ", ".join(f'"{k}": {v}' for k, v in op.items())
    return f'{{"traceEvents": [{STEP}, {{"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, {body}}}]}}'


def _stdlib_reads_nested(depth: int) -> bool:
    """Whether this Python's json module decodes lists nested `depth` deep (3.11 stops near 1000; 3.12 goes on)."""
    try:
        json.loads("[" * depth + "]" * depth)
    except RecursionError:
        return False
    return True


CONTROL = one_op(name='"a\x01"').encode()  # a raw control character inside a string
CUT = one_op().encode()[:-3]  # the file ends after the op's last field
# file contents -> (steps, skipped events, the op's name) read, or the one-line error said after the path
HOSTILE_JSON = {
    "nan": (one_op(ts="NaN").encode(), (1, 1, None)),
    "infinity": (one_op(dur="Infinity").encode(), (1, 1, None)),
    "minus_infinity": (one_op(dur="-Infinity").encode(), (1, 1, None)),
    "1e400": (one_op(ts="1e400").encode(), (1, 1, None)),
    "lone_surrogate": (one_op(name='"\\ud800mm"').encode(), (1, 0, "\ud800mm")),
    "utf16": (one_op().encode("utf-16-le"), (1, 0, "aten::mm")),
    "duplicate_key": (one_op(name='"a", "name": "b"').encode(), (1, 0, "b")),
    "huge_int": (one_op(args='{"External id": ' + "9" * 5000 + "}").encode(),
                 "not valid JSON (Exceeds the limit (4300 digits) for integer string conversion)"),
    "deep": (b'{"traceEvents": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "JSON nested too deeply to be a trace"),
    # past msgspec's depth (the recursion limit: it refuses): the stdlib decides, so the answer is this Python's own
    "deep_in_args": (one_op(args="[" * 2000 + "]" * 2000).encode(),
                     (1, 0, "aten::mm") if _stdlib_reads_nested(2000) else "JSON nested too deeply to be a trace"),
    "latin1": (one_op(name='"caf\xe9"').encode("latin-1"), "not text JSON (binary content)"),
    "control_char": (CONTROL, "not valid JSON (Invalid control character at: line 1, column "
                              f"{CONTROL.index(1) + 1}); truncated file?"),
    "extra_data": (b'{"traceEvents": []} x', "not valid JSON (Extra data: line 1, column 21); truncated file?"),
    "cut": (CUT, f"not valid JSON (Expecting ',' delimiter: line 1, column {len(CUT) + 1}); truncated file?"),
    "not_events": (b'{"traceEvents": {"a": 1}}', "JSON, but not a torch.profiler trace (no 'traceEvents' list)"),
    "a_list": (b"[" + STEP.encode() + b"]",
               "not a torch.profiler trace (a JSON object starts with '{', this starts with b'[{\"ph\": ')"),
    # wrong types where msgspec decodes the events into typed fields: read as the stdlib path reads them
    "ts_a_string": (one_op(ts='"10"').encode(), (1, 0, "aten::mm")),  # float("10"), as Event reads it
    "ts_not_a_number": (one_op(ts='"soon"').encode(), (1, 1, None)),
    "dur_a_list": (one_op(dur="[1]").encode(), (1, 1, None)),
    "dur_an_empty_list": (one_op(dur="[]").encode(), (1, 0, "aten::mm")),  # `[] or 0.0`: no duration
    "ts_true": (one_op(ts="true").encode(), (1, 0, "aten::mm")),  # float(True)
    "name_a_number": (one_op(name="7").encode(), (1, 0, "7")),
    "cat_a_list": (one_op(cat='["cpu_op"]').encode(), "malformed trace (TypeError: unhashable type: 'list')"),
    "event_not_an_object": (f'{{"traceEvents": [{STEP}, 3, [], "x", null]}}'.encode(), (1, 0, None)),
    "events_not_a_list": (b'{"traceEvents": "x"}', "JSON, but not a torch.profiler trace (no 'traceEvents' list)"),
    "top_level_twice": (b'{"traceEvents": [], ' + one_op().encode()[1:], (1, 0, "aten::mm")),  # the last one counts
    "reader_field_names": (one_op(children="[1]", end='"x"', parent="{}").encode(), (1, 0, "aten::mm")),
    "latin1_in_args": (one_op(args='{"Input Dims": "caf\xe9"}').encode("latin-1"), "not text JSON (binary content)"),
    "nan_in_args": (one_op(args='{"Input Dims": [NaN]}').encode(), (1, 0, "aten::mm")),
    "deep_in_a_string": (one_op(name='"' + "[" * 5000 + '"').encode(), (1, 0, "[" * 5000)),
    # times at read.MAX_TS and read.MAX_US are read, one step past them skipped (msgspec refuses them: the stdlib
    # skips); an op at 1e17 is outside the step, so no name
    "ts_at_the_limit": (one_op(ts="1e17").encode(), (1, 0, None)),
    "ts_past_the_limit": (one_op(ts="1.0000000000000002e17").encode(), (1, 1, None)),
    "ts_at_minus_the_limit": (one_op(ts="-1e17").encode(), (1, 0, None)),
    "ts_past_minus_the_limit": (one_op(ts="-1.0000000000000002e17").encode(), (1, 1, None)),
    "dur_at_the_limit": (one_op(dur="1e11").encode(), (1, 0, "aten::mm")),
    "dur_past_the_limit": (one_op(dur="100000000000.00002").encode(), (1, 1, None)),
    "dur_zero": (one_op(dur="0").encode(), (1, 0, "aten::mm")),
    "dur_negative": (one_op(dur="-0.001").encode(), (1, 1, None)),
}


@pytest.mark.parametrize("case", list(HOSTILE_JSON))
def test_hostile_json_reads_the_same_under_both_decoders(tmp_path, decoder, case):
    """msgspec refuses NaN, Infinity, 1e400, lone surrogates, UTF-16 and wrong types in the fields it types, which
    the stdlib reads: those go to the stdlib, so both decoders read the same trace or say the same line (the
    stdlib's wording, line and column)."""
    content, expected = HOSTILE_JSON[case]
    path = tmp_path / f"{case}.json"
    path.write_bytes(content)
    if isinstance(expected, str):
        with pytest.raises(it.TraceError) as e:
            it.load_trace(path)
        assert str(e.value) == f"{path}: {expected}"
        return
    t = it.load_trace(path)
    names = [e.name for st in t.steps for e in st.spans]
    assert (len(t.steps), t.skipped, names[0] if names else None) == expected


BIG = 2**70  # past 64 bits: msgspec refuses it, the stdlib reads it
# an op's args, as JSON text -> what the reader reads from them: (its args, the External id it links by)
HOSTILE_ARGS = {
    "beyond_64_bits": ('{"External id": %d, "correlation": 5}' % BIG, ({"External id": BIG, "correlation": 5}, BIG)),
    "1e400": ('{"External id": 3, "Input Dims": 1e400}', ({"External id": 3, "Input Dims": float("inf")}, 3)),
    "1e400_id": ('{"External id": 1e400}', ({"External id": float("inf")}, float("inf"))),
    "a_list": ('[1, 2]', ({}, None)),
    "null": ("null", ({}, None)),
    "a_string": ('"External id"', ({}, None)),
    "duplicate_key": ('{"External id": 1, "External id": 2}', ({"External id": 2}, 2)),
    "lone_surrogate": ('{"External id": 4, "s": "\\ud800"}', ({"External id": 4, "s": "\ud800"}, 4)),
    "id_an_object": ('{"External id": {"a": [1]}}', "malformed trace (TypeError: unhashable type: 'dict')"),
}


@pytest.mark.parametrize("case", list(HOSTILE_ARGS))
def test_hostile_args_read_the_same_under_both_decoders(tmp_path, decoder, case):
    """msgspec leaves an event's args as raw JSON until they are asked for; what it cannot decode there, the
    stdlib does, so both decoders read the same args."""
    text, expected = HOSTILE_ARGS[case]
    path = tmp_path / f"{case}.json"
    path.write_text(one_op(args=text))
    if isinstance(expected, str):
        with pytest.raises(it.TraceError) as e:
            it.load_trace(path)
        assert str(e.value) == f"{path}: {expected}"
        return
    [op] = it.load_trace(path).steps[0].spans
    assert (op.args, op.ext) == expected


def test_an_integer_past_the_stdlib_limit_where_the_reader_does_not_look(tmp_path, decoder):
    """The one difference: msgspec checks the JSON it skips (an event's keys the reader does not use, the args it
    does not link by) but does not decode it, so an integer of more than 4300 digits there, which makes the stdlib
    refuse the whole file, is not read: the args it is in read as none."""
    huge = "9" * 5000
    for name, op in (("args", one_op(args='{"External id": 3, "Input Dims": ' + huge + "}")),
                     ("key", one_op(name='"aten::mm", "unused": ' + huge, args='{"External id": 3}'))):
        path = tmp_path / f"digits_{name}.json"
        path.write_text(op)
        if decoder == "stdlib":
            with pytest.raises(it.TraceError, match="Exceeds the limit \\(4300 digits\\)"):
                it.load_trace(path)
            continue
        [op] = it.load_trace(path).steps[0].spans
        assert (op.name, op.ext, op.args) == ("aten::mm", 3, {} if name == "args" else {"External id": 3})


EVENT_FIELDS = ("name", "cat", "ts", "dur", "end", "pid", "tid", "args", "ext", "corr")


def _events_read(t) -> list[tuple]:
    """Every event of a Trace as the reader holds it: its fields, and its place (parent, step, owner, launch)."""
    named = lambda e: None if e is None else (e.name, e.ts)  # noqa: E731
    out = []
    for st in t.steps:
        for e in [st.span, *st.spans]:
            out.append((*(getattr(e, f) for f in EVENT_FIELDS), named(e.parent), len(e.children), len(e.kernels),
                        [named(c) for c in e.calls], None if e.step is None else e.step.number))
        for k in st.gpu:
            out.append((*(getattr(k.event, f) for f in EVENT_FIELDS), named(k.launch), named(k.op), k.occupancy_query))
    return out


@pytest.mark.parametrize("name", ["h200_mlp_compile", "foreign/h200_foreign_threads", "train/h200_train_gemma_2l"])
def test_msgspec_and_the_stdlib_read_the_same_trace(monkeypatch, name):
    """Not only the report: every event, its fields and its links, the same under both decoders."""
    if read._fast() is None:
        pytest.skip("msgspec is not installed here: the stdlib decodes every trace")
    path = DATA / f"{name}.json.gz"
    fast = it.load_trace(path)
    assert type(fast.steps[0].spans[0]).__name__ == "DecodedEvent"  # msgspec's structs, not the stdlib's dicts
    monkeypatch.setattr(read, "_fast", lambda: None)
    slow = it.load_trace(path)
    assert type(slow.steps[0].spans[0]) is trace_events.Event
    assert (fast.meta, fast.skipped, fast.whole, fast.has_memory_events) == (
        slow.meta, slow.skipped, slow.whole, slow.has_memory_events)
    assert _events_read(fast) == _events_read(slow)


def _layouts(events: str) -> dict[str, tuple[str, bool]]:
    """Whole trace texts around one events list: {case: (text, whether read._split's guess of where the events
    lie must find them)}."""
    props = '"deviceProperties": [{"id": 0, "name": "NVIDIA H200"}]'
    return {
        "torch's order": (f'{{"schemaVersion": 1, {props}, "traceEvents": {events}, "traceName": "t.json"}}', True),
        "pretty, nothing after": (f'{{\n  "traceEvents": {events}\n}}\n', True),
        "] inside the last string": (f'{{"traceEvents": {events}, "traceName": "/tmp/a]b[c].json"}}', True),
        # Where the guess cannot hold, the file is read the long way, with the same result:
        "a list after the events": (f'{{"traceEvents": {events}, {props}}}', False),
        "the key nested before": (f'{{"meta": {{"traceEvents": [1]}}, "traceEvents": {events}}}', False),
        "a key twice, the later wins": (f'{{"traceEvents": [], "traceEvents": {events}}}', False),
        "a key twice, the later empty": (f'{{"traceEvents": {events}, "traceEvents": []}}', False),
        "the hole's own text before": (f'{{"note": {read._HOLE.decode()}, "traceEvents": {events}}}', False),
    }


def test_a_file_without_top_level_events_is_refused_alike_by_both_decoders(tmp_path, monkeypatch):
    """traceEvents only nested, or nowhere: the guess (read._split) finds no hole at the top, and the one line is
    the one the stdlib reader gives."""
    for text in ('{"meta": {"traceEvents": [1]}}', '{"schemaVersion": 1, "items": [2]}'):
        path = tmp_path / "t.json"
        path.write_text(text)
        said = []
        for fast in (read._fast, lambda: None):
            monkeypatch.setattr(read, "_fast", fast)
            with pytest.raises(it.TraceError) as e:
                it.load_trace(path)
            said.append(str(e.value))
        assert said == [f"{path}: JSON, but not a torch.profiler trace (no 'traceEvents' list)"] * 2, text


def test_events_the_reader_cannot_place_are_skipped_alike_by_both_decoders(tmp_path, monkeypatch):
    """An X event of the reader's kinds without a "ts" is skipped and counted, one without a "dur" lasts 0 µs, and
    neither stops the read: the events after them are read, their args too. A list element that is not an object
    (msgspec refuses the file: the stdlib reads it) is passed over the same way."""
    data = raw("mlp_eager")
    events = data["traceEvents"]
    at = next(i for i, e in enumerate(events) if e.get("name") == "ProfilerStep#2") + 1
    tid = {k: events[at][k] for k in ("pid", "tid")}
    odd = [{"ph": "X", "cat": "cpu_op", "name": "no_ts", "dur": 1.0, **tid},
           {"ph": "X", "cat": "kernel", "name": "no_ts either", "dur": 1.0, "pid": 0, "tid": 7},
           {"ph": "X", "cat": "cpu_op", "name": "no_dur", "ts": events[at]["ts"] + 0.5, **tid}]
    for extra, skipped in ((odd, 2), ([5, None, "x", *odd], 2)):
        data["traceEvents"] = events[:at] + extra + events[at:]
        path = tmp_path / "t.json"
        path.write_text(json.dumps(data))
        reads = []
        for fast in (read._fast, lambda: None):
            monkeypatch.setattr(read, "_fast", fast)
            t = it.load_trace(path)
            [no_dur] = [e for st in t.steps for e in st.spans if e.name == "no_dur"]
            reads.append((t.skipped, no_dur.dur, no_dur.end - no_dur.ts, _events_read(t)))
        assert reads[0] == reads[1]
        want_steps = sum(1 for e in events if str(e.get("name", "")).startswith("ProfilerStep#"))
        assert reads[0][:3] == (skipped, 0.0, 0.0) and len(t.steps) == want_steps == 3


def test_the_events_are_found_without_a_second_pass_and_read_as_the_stdlib_reads_them(tmp_path, monkeypatch):
    """read._split guesses where traceEvents' value lies (a torch trace: a few small keys around it) instead of
    skipping through the events once more. Each layout reads exactly as the stdlib reads it, and the guess
    holds where the layout is torch's."""
    fast = read._fast()
    if fast is None:
        pytest.skip("msgspec is not installed here: the stdlib decodes every trace")
    events = json.dumps(raw("mlp_eager")["traceEvents"])
    for case, (text, guessed) in _layouts(events).items():
        data = text.encode()
        _, span = read._split(data, fast)
        # A wrong guess (a list after the events) is a span the events decoder refuses: not one JSON value.
        assert (isinstance(span, memoryview) and bytes(span) == events.encode()) == guessed, case
        path = tmp_path / "t.json"
        path.write_bytes(data)
        read_fast = it.load_trace(path, require_steps=False)
        with monkeypatch.context() as m:
            m.setattr(read, "_fast", lambda: None)
            slow = it.load_trace(path, require_steps=False)
        want = json.loads(text)
        assert read_fast.meta == slow.meta == {k: v for k, v in want.items() if k != "traceEvents"}, case
        steps = sum(e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#") for e in want["traceEvents"])
        assert len(slow.steps) == steps, case  # the raw JSON's own count: ProfilerStep#2..4 or none
        assert _events_read(read_fast) == _events_read(slow), case
        # Read by msgspec still, a wrong guess included: not handed to the stdlib (2-3 times slower).
        assert all(type(e).__name__ == "DecodedEvent" for st in read_fast.steps for e in st.spans), case


def test_args_are_decoded_on_first_use_each_trace_its_own():
    """msgspec decodes an event's links with it, and the args of a trace's events only once one of them is asked
    for: two traces read side by side, asked in turn, each give their own args as the raw JSON has them."""
    if read._fast() is None:
        pytest.skip("msgspec is not installed here")
    names = ("mlp_eager", "mlp_compile")
    traces = {n: it.load_trace(DATA / f"h200_{n}.json.gz") for n in names}
    assert all(e.raw_args is None for t in traces.values() for st in t.steps for e in st.spans)  # none yet
    cats = {"cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset"}
    for n in names:  # until then the trace holds its own events for that pass, and no others (flows, metadata)
        held = [e for e in traces[n].steps[0].spans[0].source.events if e is not None]
        assert len(held) == sum(e.get("ph") == "X" and e.get("cat") in cats or e.get("name") == "[memory]"
                                for e in raw(n)["traceEvents"])
    for n in reversed(names):
        by_time = {(e["name"], float(e["ts"])): e.get("args", {}) for e in raw(n)["traceEvents"] if e.get("ph") == "X"}
        spans = [e for st in traces[n].steps for e in st.spans]
        assert len(spans) > 10 and [e.args for e in spans] == [by_time[e.name, e.ts] for e in spans]
        assert all(e.ext == by_time[e.name, e.ts].get("External id") for e in spans)


def test_both_kinds_of_event_have_the_same_attributes():
    if read._fast() is None:
        pytest.skip("msgspec is not installed here")
    from trace_reader.reading import fast_json

    # what args and the links are made from; a flow end's id (into Trace.flow_ends)
    decode_only = {"ph", "links", "source", "raw_args", "parsed_args", "id"}
    decoded = set(fast_json.DecodedEvent.__struct_fields__) - decode_only | {"args"}
    assert decoded == set(trace_events.Event.__slots__)


def test_msgspec_decodes_only_where_it_refuses_deep_nesting(monkeypatch):
    """A decoder that accepts any depth (orjson 3.13.0 recursed until the process crashed) is not used; one that
    stops is; none installed: the stdlib. What the decoder in use refuses, the stdlib decodes (read._loads)."""
    import types

    import trace_reader.reading as reading_room

    class Refused(ValueError):
        pass

    def stops(text):  # refuses past 1024 levels, and NaN, as msgspec does (at the recursion limit)
        if text.count(b"[") > 1024 or b"NaN" in text:
            raise Refused(text[:8])
        return "fast"

    probe = read._fast.__wrapped__  # the check itself, not its cached answer
    stopping = types.SimpleNamespace(decode=stops, refused=Refused)
    monkeypatch.setattr(reading_room, "fast_json", stopping, raising=False)
    assert probe() is stopping
    monkeypatch.setattr(reading_room, "fast_json", types.SimpleNamespace(decode=lambda text: "fast", refused=Refused))
    assert probe() is None
    monkeypatch.delattr(reading_room, "fast_json")
    for name in {"trace_reader.reading.fast_json", reading_room.__name__ + ".fast_json"}:  # its own name (mutmut's)
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.setitem(sys.modules, "msgspec", None)  # not installed
    assert probe() is None


def test_loads_takes_the_stdlibs_answer_where_msgspec_refuses(monkeypatch):
    """files._loads through fast_json.loads: msgspec's decoder where it accepts, the stdlib's where it refuses."""
    pytest.importorskip("msgspec", reason="fast_json is msgspec's decoding: without msgspec there is none to test")
    from trace_reader.reading import fast_json
    from trace_reader.reading import files as read

    class Refused(ValueError):
        pass

    def stops(text):
        if b"NaN" in text:
            raise Refused(text[:8])
        return "fast"

    monkeypatch.setattr(fast_json, "decode", stops)
    monkeypatch.setattr(fast_json, "refused", Refused)
    monkeypatch.setattr(read, "_fast", lambda: fast_json)
    assert read._loads(b"[1]") == "fast"
    assert repr(read._loads(b"[NaN]")) == "[nan]"  # refused by the fast one: the stdlib's answer


@pytest.mark.subprocess
def test_the_child_without_msgspec_reads_with_the_stdlib(tmp_path):
    """python_for("stdlib") leaves msgspec out of the child (else the CLI tests above would test msgspec twice)."""
    script = tmp_path / "which.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT / 'reader')!r}); from trace_reader.reading import files as read; "
                      "print(read._fast() is not None)")
    said = {}
    for decoder in ("msgspec", "stdlib"):
        proc = subprocess.run([*python_for(decoder), str(script)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        said[decoder] = proc.stdout.strip()
    assert said["stdlib"] == "False"
    assert said["msgspec"] == str(read._fast() is not None)


def test_two_items_alike_but_for_a_launch(tmp_path, capsys):
    """Two kernels over the same µs 10..15, one launched at 2 and one with no launch in the trace: a report, not a
    traceback. Step 0..100: idle before the work 10, 2 of it before the launch (the host) and 8 after; then the
    GPU waits 85 more on the host until the step ends."""

    path = tmp_path / "alike.json"
    path.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 5, "pid": 1, "tid": 1,
         "args": {"External id": 1}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1, "pid": 1, "tid": 1,
         "args": {"External id": 1, "correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "k1", "ts": 10, "dur": 5, "pid": 0, "tid": 7, "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "k2", "ts": 10, "dur": 5, "pid": 0, "tid": 8,
         "args": {"External id": 1}}]}))
    assert steps._idle(it.load_trace(path)) == [(87.0, 8.0)]
    assert it.main([str(path)]) == 0 and "Traceback" not in capsys.readouterr().err


def test_the_call_tree_is_the_innermost_containing_span_on_random_traces():
    """tree._build_tree nests spans in one walk where a trace has one thread and no two spans starting together,
    and the long way (per thread, the longer first at one start) at the first span that says otherwise. On random
    spans, with and without threads and shared starts, each parent is the one a brute force over all pairs gives:
    the last span before it (in start order, the longer first, else file order) on its thread that has not ended
    when it ends."""
    import random
    rng = random.Random(7)
    lanes = {"one thread": [(1, 1)], "threads": [(1, 1), (1, 2), (2, 1)], "no ids": [(None, None)]}
    for case in range(300):
        threads = list(lanes.values())[case % 3]
        ties = case % 2 == 0  # integer starts from a small range: many shared; else none
        n = rng.randint(1, 14)
        starts = rng.sample(range(0, 40), n) if not ties else [rng.randint(0, 12) for _ in range(n)]
        raws = [{"ph": "X", "cat": "cpu_op", "name": f"op{i}", "ts": s + (0 if ties else rng.random() / 2),
                 "dur": rng.choice([0, 1, 2, 5, 9, 20]), "pid": (t := rng.choice(threads))[0], "tid": t[1]}
                for i, (s) in enumerate(starts)]
        spans = [trace_events.Event(r) for r in raws]
        tree._build_tree(list(spans))
        order = sorted(range(n), key=lambda i: (raws[i]["ts"], -raws[i]["dur"], i))
        for k, i in enumerate(order):
            r = raws[i]
            before = [j for j in order[:k] if (raws[j]["pid"], raws[j]["tid"]) == (r["pid"], r["tid"])
                      and raws[j]["ts"] + raws[j]["dur"] >= r["ts"] + r["dur"]]
            want = before[-1] if before else None
            got = spans[i].parent
            assert (None if got is None else spans.index(got)) == want, (case, i, raws)
            kids = [spans.index(c) for c in spans[i].children]
            assert kids == [j for j in order if spans[j].parent is spans[i]], (case, i)


def test_two_processes_traces_merged_into_one_file_are_refused_in_one_line(tmp_path):
    """The same run's events twice, the second copy under another process id (two processes' traces concatenated):
    the same correlation id then names two launches, and a kernel's step cannot be known. One line, exit 2; the
    file with one process reads as before."""
    data = raw("mlp_eager")
    pid = next(e["pid"] for e in data["traceEvents"] if e.get("cat") == "cuda_runtime")
    twin = [dict(e, pid=e["pid"] + 1000) if e.get("pid") == pid else e for e in data["traceEvents"]]
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(dict(data, traceEvents=data["traceEvents"] + twin)))
    one_line_error(cli(merged), f"processes {pid} and {pid + 1000} both made a call with correlation id",
                   "merged into one file?")
    alone = tmp_path / "alone.json"
    alone.write_text(json.dumps(dict(data, traceEvents=twin)))  # the copy alone: one process, read as ever
    assert len(it.load_trace(alone).steps) == 3
    # One process whose pid is a number on one call and a string, or nothing, on the other call of the same id
    calls = [e for e in data["traceEvents"] if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})]
    for spelled in (str(pid), None):
        twin = [dict(e, pid=spelled) for e in calls]
        if spelled is None:
            twin = [{k: v for k, v in e.items() if k != "pid"} for e in twin]
        path = tmp_path / f"spelled_{spelled}.json"
        path.write_text(json.dumps(dict(data, traceEvents=data["traceEvents"] + twin)))
        assert len(it.load_trace(path).steps) == 3, spelled


def test_a_step_numbered_in_other_scripts_digits_is_no_step(tmp_path):
    """ProfilerStep#٣ (Arabic-Indic three, which int() reads as 3) beside ProfilerStep#3: only the ASCII one is a
    step, so no two steps share a number; the other is an annotation like any."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": 10}
          for name, ts in (("ProfilerStep#3", 0), ("ProfilerStep#\u0663", 20))]
    path = tmp_path / "digits.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    t = it.load_trace(path)
    assert [st.number for st in t.steps] == [3] and t.steps[0].span.ts == 0


def test_the_reading_page_states_the_readers_limits_as_the_code_has_them():
    """docs/reading_traces.md's untrusted-input paragraph: the byte and object caps, the walks' depth, the ranks'
    skew, each the constant the reader uses; the bytes per object, from the committed traces' own JSON."""
    from trace_reader.analyzers import ranks as ranks_mod

    page = " ".join((ROOT / "docs" / "reading_traces.md").read_text().split())
    assert read.MAX_JSON_BYTES == 1 << 30 and "at most 1 GiB of JSON" in page
    assert read.MAX_JSON_OBJECTS == 1 << 24 and "at most 2^24 JSON objects" in page
    assert annotations.MAX_NESTING == 1024 and "stop at 1,024 levels" in page
    assert ranks_mod.MAX_SKEW_US == 3600e6 and "more than an hour apart" in page
    per = [len(t) / t.count(b"{") for path in sorted(DATA.rglob("*.json.gz"))
           for t in [gzip.decompress(path.read_bytes())]]
    assert (round(min(per)), round(max(per))) == (102, 208) and len(per) > 50, per
    assert "the committed traces have one per 102 to 208 bytes" in page


def _side_truth(events: list) -> tuple[list, list]:
    """(the fwdbwd flow ends, the "[memory]" instants as (ts, pid, tid, args)) of a raw JSON events list, by the
    rules the reader states (Trace.flow_ends): a flow end needs a number for its time, an int or str id and
    threads that are no list or object."""
    def thread(x):
        return not isinstance(x, (list, dict))

    flows = [(e["id"], e["ph"], e.get("pid"), e.get("tid"), float(e["ts"])) for e in events
             if isinstance(e, dict) and e.get("cat") == "fwdbwd" and e.get("ph") in ("s", "f")
             and type(e.get("ts")) in (int, float) and type(e.get("id")) in (int, str)
             and thread(e.get("pid")) and thread(e.get("tid"))]
    memory = [(e.get("ts"), e.get("pid"), e.get("tid"), e.get("args")) for e in events
              if isinstance(e, dict) and e.get("name") == "[memory]" and e.get("ph") in ("i", "I")
              and not (e.get("cat") == "fwdbwd" and e.get("ph") in ("s", "f"))]
    return flows, memory


@pytest.mark.parametrize("name", ["train/h200_train_gemma_2l_memory", "train_foreign/cpu_fsdp_rank0",
                                  "foreign/h200_foreign_llama2_train_forloop", "h200_attention_math"])
def test_flows_and_memory_events_are_kept_in_the_one_read_as_the_raw_json_has_them(tmp_path, monkeypatch, name):
    """The training reader's fwdbwd flows and the memory reader's allocations come from the same read as the call
    tree, under either decoder: what they hold is the raw JSON's, and the file is not opened again (removed after the
    read, the step's analysis and peaks are what they were)."""
    from trace_reader.analyzers import memory, training

    with gzip.open(DATA / f"{name}.json.gz") as f:
        events = json.load(f)["traceEvents"]
    flows, instants = _side_truth(events)
    assert flows or instants
    path = tmp_path / "t.json.gz"
    path.write_bytes((DATA / f"{name}.json.gz").read_bytes())
    seen = []
    for fast in (read._fast, lambda: None):
        monkeypatch.setattr(read, "_fast", fast)
        t = it.load_trace(path)
        assert list(t.flow_ends) == flows
        assert [(float(e.ts), e.pid, e.tid, e.args) for e in t.memory_events] == [
            (float(ts), pid, tid, args) for ts, pid, tid, args in instants]
        before = (training.analyze(t), memory.step_peaks(t))
        seen.append(before)
        moved = path.rename(tmp_path / "gone.json.gz")
        t2 = it.load_trace(moved)
        moved.unlink()
        assert (training.analyze(t2), memory.step_peaks(t2)) == before
        path.write_bytes((DATA / f"{name}.json.gz").read_bytes())
    assert seen[0] == seen[1]


def test_odd_flow_and_memory_fields_are_left_out_alike_by_both_decoders(tmp_path, monkeypatch):
    """Flow ends whose id, thread or time the reader cannot use are left out, memory events whose args are no
    object are skipped, and none of them stops the read (an integer time of 400 digits: the stdlib reads the file,
    and float() of it overflows)."""
    from trace_reader.analyzers.memory import read_allocs

    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 100, "pid": 1, "tid": 1}
    flow = {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "id": 7, "ts": 10, "pid": 1, "tid": 1}
    mem = {"ph": "i", "name": "[memory]", "ts": 20, "pid": 1, "tid": 1,
           "args": {"Bytes": 64, "Total Allocated": 64, "Device Type": 0, "Device Id": 0}}
    odd = [dict(flow, id=[7]), dict(flow, id=1.5), dict(flow, tid=[1]), dict(flow, pid={"a": 1}), dict(flow, ts="10"),
           dict(flow, ts=True), dict(flow, ts=None), dict(flow, ph="t"), dict(flow, cat="ac2g"),
           dict(mem, args=[1]), dict(mem, args=None), dict(mem, ph="X", cat="cpu_instant_event")]
    good = [flow, dict(flow, ph="f", id="7", ts=30.5, tid="1"), mem]
    for extra in ([], [dict(flow, ts=10 ** 400)]):
        evs = [step, *odd, *good, *extra]
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"traceEvents": evs}))
        for fast in (read._fast, lambda: None):
            monkeypatch.setattr(read, "_fast", fast)
            t = it.load_trace(path)
            assert t.flow_ends == ((7, "s", 1, 1, 10.0), ("7", "f", 1, "1", 30.5)), (extra, fast)
            assert [a.nbytes for a in read_allocs(t)] == [64.0] and len(t.memory_events) == 3
