"""common.export and common.main: the trace/table pair lands whole or not at all, and every failure is one line.

In-process and fast (mutmut runs these): a stand-in profiler writes the trace, so each failure of the export
itself can be made to happen. The real profiler on a real full disk is in test_full_disk_*. main() and the pair's
move into place are safe_output.py's (common re-exports main): its state is patched there.
"""

import argparse
import errno
import gzip
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import common
import safe_output

ROOT = Path(__file__).resolve().parent.parent
TRACE = {"traceEvents": [{"name": "ProfilerStep#2", "ph": "X", "ts": 0, "dur": 5, "pid": 1, "tid": 1}]}
STEM = "16x8x12_bf16_cold_eager"


class FakeProfile:
    """What export() uses of torch.profiler.profile: export_chrome_trace(path) and key_averages().table()."""

    def __init__(self, trace=TRACE, table="NEW TABLE", write=None):
        self.trace, self.text, self.write = trace, table, write
        self.sort_by = self.row_limit = None
        self.paths = []

    def export_chrome_trace(self, path):
        self.paths.append(Path(path))
        if self.write:
            return self.write(path)
        Path(path).write_text(json.dumps(self.trace, indent=1) + "\n")  # kineto's files end in a newline too

    def key_averages(self):
        return self

    def table(self, sort_by, row_limit):
        self.sort_by, self.row_limit = sort_by, row_limit
        return self.text


def make_run(out, gzip_=False, cuda=False):
    args = argparse.Namespace(out=out, gzip=gzip_, dtype="bf16", warmup=0, compile=False, open=False,
                              sync_each_step=False, **common.SCHEDULE)
    return common.Run("02_linear", args, torch.device("cuda" if cuda else "cpu"), torch.bfloat16)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    monkeypatch.setattr(safe_output, "written", None)
    monkeypatch.setattr(safe_output, "made_folders", [])


@pytest.fixture
def old_pair(tmp_path):
    """A previous run's pair in tmp_path; returns {path: bytes} to compare against after a failed export."""
    (tmp_path / f"{STEM}.json").write_bytes(b'{"old": "trace"}')
    (tmp_path / f"{STEM}.txt").write_bytes(b"OLD TABLE\n")
    return {p: p.read_bytes() for p in tmp_path.iterdir()}


def unchanged(tmp_path, before):
    """The folder holds exactly the old files, byte for byte: no temporary folder, no stray new file."""
    return {p: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before and \
        sorted(tmp_path.iterdir()) == sorted(before)


def one_line(e: common.Fail) -> str:
    text = str(e)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_writes_the_pair_and_nothing_else(tmp_path):
    prof = FakeProfile()
    trace, table = common.export(make_run(tmp_path), prof, "16x8x12")
    assert (trace, table) == (tmp_path / f"{STEM}.json", tmp_path / f"{STEM}.txt")
    assert json.loads(trace.read_text()) == TRACE and table.read_text() == "NEW TABLE\n"
    assert sorted(tmp_path.iterdir()) == [trace, table]
    assert (prof.sort_by, prof.row_limit) == ("cpu_time_total", 40) and safe_output.written == trace
    # Written in a hidden temporary folder inside the output folder: the same file system, so os.replace is
    # atomic (a folder in /tmp may be another file system), and .gitignore's *.tmp* pattern covers it.
    (written,) = prof.paths
    assert written.parent.parent == tmp_path and written.parent.name.startswith(".tmp-")


def test_a_scripts_flags_name_the_pair(tmp_path):
    """A script's own tags (01_matmul_add.py's --batched 4: "_bmm4") go into both names, before the mode: two runs
    that differ by a flag never overwrite each other's pair."""
    trace, table = common.export(make_run(tmp_path), FakeProfile(), "16x8x12", "_bmm4")
    assert (trace.name, table.name) == ("16x8x12_bf16_cold_bmm4_eager.json", "16x8x12_bf16_cold_bmm4_eager.txt")
    plain, _ = common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert plain.name == f"{STEM}.json" and trace.exists()


def test_gzip_pair_and_cuda_table_sorted_by_cuda_time(tmp_path):
    prof = FakeProfile()
    trace, table = common.export(make_run(tmp_path, gzip_=True, cuda=True), prof, "16x8x12")
    assert trace == tmp_path / f"{STEM}.json.gz"
    assert json.loads(gzip.decompress(trace.read_bytes())) == TRACE
    assert sorted(tmp_path.iterdir()) == [trace, table] and prof.sort_by == "cuda_time_total"


def test_replaces_an_earlier_pair(tmp_path, old_pair):
    trace, table = common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert json.loads(trace.read_text()) == TRACE and table.read_text() == "NEW TABLE\n"
    assert sorted(tmp_path.iterdir()) == [trace, table]


def full_disk(path):
    raise OSError(errno.ENOSPC, "No space left on device")


def quota(path):
    raise OSError("disk quota exceeded")  # an OSError with a message but no errno/strerror


def kineto_on_a_full_disk(path):
    pass  # torch's C++ exporter logs "Failed to write to log file!" and leaves no file: no exception


def kineto_logs_a_failed_write(path):
    # what torch's exporter prints on a full disk (and no file), then a line of someone else's that must get through
    os.write(2, b"ERROR:2026-11-30 12:00:00 4242:4242 output_json.cpp:123] Failed to write to log file!\n"
                b"another library: a real warning\n")


def cut_off(path):
    Path(path).write_text(json.dumps(TRACE)[:-7])


FULL = "the profiler could not write the trace (is the disk full?)"


@pytest.mark.parametrize("write,says", [(full_disk, "No space left on device"), (quota, "disk quota exceeded"),
                                        (kineto_on_a_full_disk, FULL), (cut_off, FULL)])
@pytest.mark.parametrize("gz", [False, True])
def test_trace_export_failing_leaves_the_old_pair(tmp_path, old_pair, write, says, gz):
    with pytest.raises(common.Fail) as e:
        common.export(make_run(tmp_path, gzip_=gz), FakeProfile(write=write), "16x8x12")
    assert one_line(e.value) == f"could not write {STEM}.json{'.gz' if gz else ''} and {STEM}.txt in {tmp_path}: " \
        f"{says}; the previous files are untouched"
    assert unchanged(tmp_path, old_pair) and safe_output.written is None


def test_kineto_failed_write_is_said_once_in_our_line(tmp_path, old_pair, capfd):
    with pytest.raises(common.Fail) as e:
        common.export(make_run(tmp_path), FakeProfile(write=kineto_logs_a_failed_write), "16x8x12")
    assert FULL in one_line(e.value) and unchanged(tmp_path, old_pair)
    assert capfd.readouterr().err == "another library: a real warning\n"


def test_gzip_failing_leaves_the_old_pair(tmp_path, old_pair, monkeypatch):
    monkeypatch.setattr(common.shutil, "copyfileobj", lambda src, dst: full_disk(None))
    with pytest.raises(common.Fail, match="No space left on device"):
        common.export(make_run(tmp_path, gzip_=True), FakeProfile(), "16x8x12")
    assert unchanged(tmp_path, old_pair)


def test_table_failing_leaves_the_old_pair(tmp_path, old_pair, monkeypatch):
    real = Path.write_text
    monkeypatch.setattr(Path, "write_text", lambda self, *a, **k: full_disk(self) if self.name == "table.txt"
                        else real(self, *a, **k))
    with pytest.raises(common.Fail, match="No space left on device"):
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert unchanged(tmp_path, old_pair)


def fail_second_replace(monkeypatch):
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(Path(dst).name)
        if len(calls) == 2:  # the trace, after the table has landed
            raise OSError(errno.EIO, "Input/output error")
        return real(src, dst)

    monkeypatch.setattr(common.os, "replace", replace)
    return calls


def test_second_replace_failing_puts_the_old_table_back(tmp_path, old_pair, monkeypatch):
    calls = fail_second_replace(monkeypatch)
    with pytest.raises(common.Fail, match="Input/output error"):
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert calls[:2] == [f"{STEM}.txt", f"{STEM}.json"]
    assert unchanged(tmp_path, old_pair) and safe_output.written is None


def test_second_replace_failing_without_an_earlier_pair_leaves_nothing(tmp_path, monkeypatch):
    fail_second_replace(monkeypatch)
    with pytest.raises(common.Fail):
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert list(tmp_path.iterdir()) == []


def test_second_replace_failing_where_hard_links_fail(tmp_path, old_pair, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")  # a file system without hard links

    monkeypatch.setattr(common.os, "link", no_links)
    fail_second_replace(monkeypatch)
    with pytest.raises(common.Fail):
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert unchanged(tmp_path, old_pair)  # the old table came back from a copy


@pytest.mark.parametrize("folder,other,old", [("txt", "json", b'{"old": "trace"}'), ("json", "txt", b"OLD TABLE\n")])
def test_a_name_of_the_pair_taken_by_a_folder(tmp_path, folder, other, old):
    """One line naming the folder; the other file of the old pair stays as it was (neither moves without the other)."""
    (tmp_path / f"{STEM}.{folder}").mkdir()
    (tmp_path / f"{STEM}.{other}").write_bytes(old)
    with pytest.raises(common.Fail) as e:
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert f": {STEM}.{folder} is a folder;" in one_line(e.value)
    assert (tmp_path / f"{STEM}.{other}").read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{STEM}.json", f"{STEM}.txt"]


def test_output_folder_removed_while_the_trace_is_written(tmp_path):
    out = tmp_path / "out"
    out.mkdir()

    def remove_everything(path):
        import shutil

        shutil.rmtree(out)  # the temporary folder goes with it

    with pytest.raises(common.Fail) as e:
        common.export(make_run(out), FakeProfile(write=remove_everything), "16x8x12")
    assert FULL in one_line(e.value) and not out.exists()


def test_output_folder_removed_mid_run(tmp_path):
    """setup() made the folder, then it went while the profiler ran (another run into it failed and removed the
    empty folder it had made): the pair is written all the same, into the folder made again."""
    out = tmp_path / "gone" / "02_linear"
    run = make_run(out)
    trace, table = common.export(run, FakeProfile(), "16x8x12")
    assert trace.parent == table.parent == out and trace.exists() and table.exists()
    assert sorted(p.name for p in out.iterdir()) == sorted([trace.name, table.name])


def test_a_failed_run_beside_a_running_one_leaves_it_its_folder(tmp_path, capsys):
    """Two runs into one new folder: the first makes it, the second finds it; the first fails and removes the folder
    (empty: nothing written yet); the second still writes its pair."""
    def args():
        return setup_args(tmp_path / "shared", device="cpu", gzip=False, warmup=0, open=False, sync_each_step=False,
                          **common.SCHEDULE)

    first = common.setup("02_linear.py", args())  # makes shared/ and shared/02_linear
    second = common.setup("02_linear.py", args())  # finds them
    assert first.args.out == second.args.out == tmp_path / "shared" / "02_linear"
    code, _ = run_main(raise_(common.Fail("the first run's error")), capsys)
    assert code == 2 and not (tmp_path / "shared").exists()  # the first run's cleanup
    trace, table = common.export(second, FakeProfile(), "16x8x12")
    assert trace.exists() and table.exists() and trace.parent == tmp_path / "shared" / "02_linear"


def test_ctrl_c_between_the_two_replaces_waits_for_the_pair(tmp_path, old_pair, monkeypatch):
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        pytest.skip("needs POSIX signal masks in the main thread")
    real = os.replace

    def replace(src, dst):
        if Path(dst).suffix == ".txt" and Path(src).parent != tmp_path:
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C right after the table's move
        return real(src, dst)

    monkeypatch.setattr(common.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
    assert json.loads((tmp_path / f"{STEM}.json").read_text()) == TRACE  # both moved: a whole new pair
    assert (tmp_path / f"{STEM}.txt").read_text() == "NEW TABLE\n"
    assert safe_output.written == tmp_path / f"{STEM}.json"  # so main() says "interrupted after writing"


# --- main(): one line, the right exit code, the truth about what was written ---------------------------------

@pytest.fixture
def prog(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["02_linear.py", "--batch", "16"])
    return "02_linear.py"


def run_main(fn, capsys):
    stdout = sys.stdout
    with pytest.raises(SystemExit) as e:
        common.main(fn)
    assert sys.stdout is stdout  # main() puts back the stdout it wrapped
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return e.value.code, err


def raise_(e):
    def fn():
        raise e
    return fn


def test_main_success_exit_0_and_the_report_gets_through(capsys):
    with pytest.raises(SystemExit) as e:
        common.main(lambda: print("the report"))
    assert e.value.code == 0 and capsys.readouterr() == ("the report\n", "")


def test_main_turns_ctrl_c_back_into_a_keyboard_interrupt():
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are set in the main thread only")
    seen = []
    previous = signal.signal(signal.SIGINT, safe_output.interrupted_while_starting)  # as when a script starts
    try:
        with pytest.raises(SystemExit):
            common.main(lambda: seen.append(signal.getsignal(signal.SIGINT)))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler]  # Ctrl-C during the run: the profiler loop and export can clean up


def test_main_bad_input_exit_2(capsys, prog):
    code, err = run_main(raise_(common.Fail("--batch: must be between 1 and 1048576, got 0")), capsys)
    assert code == 2 and err == "02_linear.py: error: --batch: must be between 1 and 1048576, got 0\n"


def test_main_error_line_is_one_write(monkeypatch, prog):
    # Under torchrun every rank fails at once into one pipe: a line written in two parts (text, then newline, as
    # print() does on stderr) interleaves into "error: ...error: ..." on one line. One write of < 4 KiB does not.
    writes = []

    class Recorder:
        def write(self, text):
            writes.append(text)
            return len(text)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", Recorder())
    with pytest.raises(SystemExit):
        common.main(raise_(common.Fail("--hidden 255 does not split over 2 ranks: pick a multiple of 2")))
    assert writes == ["02_linear.py: error: --hidden 255 does not split over 2 ranks: pick a multiple of 2\n"]


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB"),
                                   RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"),
                                   RuntimeError("[enforce fail at alloc_cpu.cpp:117] out of memory")])
def test_main_out_of_memory_exit_2(capsys, prog, error):
    code, err = run_main(raise_(error), capsys)  # exit 2, as the README promises for a shape that cannot fit
    assert code == 2 and err == "02_linear.py: error: out of memory at this shape; try smaller sizes (nothing was written)\n"


def test_main_out_of_memory_after_writing_says_so(tmp_path, capsys, prog):
    def fn():
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
        raise torch.OutOfMemoryError("CUDA out of memory")

    code, err = run_main(fn, capsys)
    assert code == 2 and err == ("02_linear.py: error: out of memory at this shape; try smaller sizes "
                                 f"(the trace was written: {tmp_path / (STEM + '.json')})\n")


def test_main_other_errors_are_not_hidden():
    with pytest.raises(RuntimeError, match="a bug"):
        common.main(raise_(RuntimeError("a bug")))


def test_main_interrupt_says_what_is_true(tmp_path, capsys, prog):
    code, err = run_main(raise_(KeyboardInterrupt), capsys)
    assert code == 130 and err == "02_linear.py: interrupted before writing; earlier traces are untouched\n"

    def interrupted_while_showing():
        common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
        raise KeyboardInterrupt

    code, err = run_main(interrupted_while_showing, capsys)
    assert code == 130 and err == f"02_linear.py: interrupted after writing {tmp_path / (STEM + '.json')}\n"


def test_failed_run_leaves_no_empty_output_folders(tmp_path, capsys):
    args = argparse.Namespace(out=tmp_path / "new" / "traces", device="cpu", dtype="bf16", compile=False, open=False)

    made = []

    def fails_after_setup():
        run = common.setup("02_linear.py", args)
        made.append(run.args.out)
        raise common.Fail("the model does not fit")

    code, _ = run_main(fails_after_setup, capsys)
    assert made == [tmp_path / "new/traces/02_linear"]  # setup made the three folders...
    assert code == 2 and list(tmp_path.iterdir()) == []  # ... and the failed run removed them all


def test_failed_run_keeps_folders_that_hold_files(tmp_path, capsys):
    (tmp_path / "traces/02_linear").mkdir(parents=True)
    (tmp_path / "traces/02_linear/old.json").write_text("{}")
    args = argparse.Namespace(out=tmp_path / "traces", device="cpu", dtype="bf16", compile=False, open=False)
    code, _ = run_main(lambda: (common.setup("02_linear.py", args), raise_(common.Fail("no"))()), capsys)
    assert code == 2 and (tmp_path / "traces/02_linear/old.json").exists()


class BrokenStdout:
    """A stdout whose writes fail; with buffered=True only the flush does (a block-buffered /dev/full)."""

    def __init__(self, error, buffered=False):
        self.error, self.buffered = error, buffered
        self.devnull = open(os.devnull, "w")

    def write(self, text):
        if not self.buffered:
            raise self.error
        return len(text)

    def flush(self):
        raise self.error

    def fileno(self):
        return self.devnull.fileno()


@pytest.mark.parametrize("open_", [True, False])
def test_setup_checks_the_open_port_first(tmp_path, open_):
    import socket

    args = argparse.Namespace(out=tmp_path, device="cpu", dtype="bf16", compile=False, open=open_, port=0)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        args.port = holder.getsockname()[1]
        if not open_:  # without --open the port is none of our business
            assert common.setup("02_linear.py", args).args.out == tmp_path / "02_linear"
            return
        with pytest.raises(common.Fail) as e:
            common.setup("02_linear.py", args)
    assert one_line(e.value).startswith(f"port {args.port} is in use") and "--port" in str(e.value)


@pytest.mark.parametrize("error,says", [(OSError(errno.ENOSPC, "No space left on device"), "No space left on device"),
                                        (BrokenPipeError(errno.EPIPE, "Broken pipe"), "Broken pipe"),
                                        (OSError("the terminal went away"), "the terminal went away")])
@pytest.mark.parametrize("buffered", [False, True], ids=["write fails", "flush fails"])
def test_main_report_to_a_broken_stdout_is_one_line(tmp_path, capsys, monkeypatch, prog, error, says, buffered):
    broken = BrokenStdout(error, buffered)
    monkeypatch.setattr(sys, "stdout", broken)
    try:
        code, err = run_main(lambda: print("the report"), capsys)
        assert code == 2 and err == f"02_linear.py: error: cannot write the report to standard output: {says}\n"

        def after_writing():
            common.export(make_run(tmp_path), FakeProfile(), "16x8x12")
            print("the report")

        code, err = run_main(after_writing, capsys)
        assert err == (f"02_linear.py: error: cannot write the report to standard output: {says} "
                       f"(the trace was written: {tmp_path / (STEM + '.json')})\n")
    finally:
        broken.devnull.close()


# --- end to end: the real profiler, a real full disk, real signals (subprocesses) ------------------------------

LINEAR = ["--batch", "16", "--in_dim", "8", "--out_dim", "12", "--device", "cpu"]


def messages(stderr: str) -> str:
    """stderr without kineto's two 'USDT: ... profiler_start/stop' trace lines (torch 2.13 prints them every run)."""
    return "".join(line for line in stderr.splitlines(keepends=True)
                   if not (line.startswith("USDT:") and line.rstrip().endswith(("profiler_start", "profiler_stop"))))


def script(*args, env=None, **kw):
    return subprocess.run([sys.executable, str(ROOT / "02_linear.py"), *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **(env or {})}, timeout=300, **kw)


@pytest.fixture
def tiny_disk(tmp_path):
    """A 1 MiB tmpfs (root on Linux), or a skip saying why not."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if sys.platform != "linux" or os.geteuid() != 0:
        pytest.skip("a tiny tmpfs needs root on Linux (mount -t tmpfs)")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("this machine does not allow mounting a tmpfs")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk, leave=4096):
    with open(disk / "filler", "wb") as f:
        try:
            f.write(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - leave))
        except OSError:
            pass


@pytest.mark.subprocess
@pytest.mark.parametrize("gz", [[], ["--gzip"]], ids=["json", "gzip"])
def test_full_disk_is_one_line_and_keeps_the_old_pair(tiny_disk, gz):
    folder = tiny_disk / "02_linear"
    folder.mkdir()
    (folder / f"{STEM}.json{'.gz' if gz else ''}").write_bytes(b'{"old": "trace"}')  # an earlier run's pair
    (folder / f"{STEM}.txt").write_bytes(b"OLD TABLE\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    fill(tiny_disk)
    proc = script(*LINEAR, *gz, "--out", str(tiny_disk))
    err = messages(proc.stderr)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "could not write" in proc.stderr and "previous files are untouched" in proc.stderr
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # no temporary folder either


@pytest.mark.subprocess
@pytest.mark.parametrize("delay", [0.3, 0.8, 2.0])  # the issue saw Ctrl-C swallowed near 0.8 s
def test_ctrl_c_while_importing_torch(tmp_path, delay):
    # A run far longer than the delay (1000 steps of ~0.1 s): any Ctrl-C in the first seconds must stop it,
    # whether it lands in `import torch`, in the set-up or in the profiler loop. A "wrote" means it was swallowed.
    long_run = ["--batch", "4096", "--in_dim", "1024", "--out_dim", "1024", "--active", "1000", "--device", "cpu"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "02_linear.py"), *long_run, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    err = messages(err)
    assert "wrote " not in out, "the Ctrl-C was swallowed: the run went on and wrote its trace"
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and "interrupted before writing" in err and "Traceback" not in err, err
    assert not list(tmp_path.rglob("*.json"))


@pytest.mark.subprocess
@pytest.mark.parametrize("where", ["full disk", "closed pipe"])
def test_report_to_a_broken_stdout(tmp_path, where):
    if where == "full disk":
        if not Path("/dev/full").exists():
            pytest.skip("no /dev/full on this system")
        stdout = os.open("/dev/full", os.O_WRONLY)
    else:
        read_end, stdout = os.pipe()
        os.close(read_end)  # the reader is gone: `| head` after its lines
    try:
        proc = subprocess.run([sys.executable, str(ROOT / "02_linear.py"), *LINEAR, "--out", str(tmp_path)],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=ROOT, timeout=300)
    finally:
        os.close(stdout)
    err = messages(proc.stderr)
    assert proc.returncode == 2, err
    assert err.count("\n") == 1 and "cannot write the report to standard output" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.subprocess
def test_compile_on_the_cpu_without_a_cpp_compiler(tmp_path):
    proc = script(*LINEAR, "--compile", "--out", str(tmp_path / "out"), env={"CXX": str(tmp_path / "no-such-g++")})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "needs a C++ compiler" in proc.stderr and "no-such-g++" in proc.stderr and "without --compile" in proc.stderr
    assert not (tmp_path / "out").exists()  # a failed run leaves no empty folders


@pytest.mark.subprocess
def test_open_with_a_busy_port_fails_before_the_run(tmp_path):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = script(*LINEAR, "--open", "--port", str(port), "--out", str(tmp_path / "out"), env={"BROWSER": "true"})
    assert proc.returncode == 2 and f"port {port} is in use" in proc.stderr and proc.stderr.count("\n") == 1
    assert "wrote" not in proc.stdout and not (tmp_path / "out").exists()


def test_inspect_trace_open_with_a_busy_port_fails_before_the_report(capsys):
    import socket

    import inspect_trace

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        code = inspect_trace.main(["--open", "--port", str(port), str(ROOT / "tests/data/h200_linear_eager.json.gz")])
    said = capsys.readouterr()
    assert code == 2 and said.out == ""  # no report first
    assert said.err.startswith(f"inspect_trace.py: error: port {port} is in use") and said.err.count("\n") == 1


@pytest.mark.subprocess
def test_ctrl_c_while_serving_after_the_run(tmp_path):
    proc = subprocess.Popen([sys.executable, str(ROOT / "02_linear.py"), *LINEAR, "--open", "--port", "0",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1", "BROWSER": "true"})
    try:
        for line in proc.stdout:
            if line.startswith("Open in Perfetto:"):
                break
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    trace = tmp_path / "02_linear" / f"{STEM}.json"
    assert proc.returncode == 130, err
    assert messages(err) == f"02_linear.py: interrupted after writing {trace}\n"  # the truth: the new trace is there
    assert trace.is_file() and trace.with_suffix(".txt").is_file()


def test_free_memory_is_unknown_where_os_has_no_sysconf(monkeypatch):
    """Windows has no os.sysconf: the shape check then says nothing rather than crash every script."""
    import common
    import torch

    monkeypatch.delattr(common.os, "sysconf")
    assert common.free_bytes(torch.device("cpu")) is None


# --- setup(): the device, the memory check, the output folder, before any work --------------------------------

def setup_args(out, **kw):
    return argparse.Namespace(**{"out": out, "device": "auto", "dtype": "bf16", "compile": False, **kw})


@pytest.mark.parametrize("gpu", [False, True])
def test_setup_resolves_the_device_and_dtype(tmp_path, monkeypatch, gpu):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    for asked, got in (("auto", "cuda" if gpu else "cpu"), ("cpu", "cpu")) + ((("cuda", "cuda"),) if gpu else ()):
        run = common.setup("/somewhere/02_linear.py", setup_args(tmp_path, device=asked, dtype="fp16"))
        assert (run.script, run.device, run.dtype) == ("02_linear", torch.device(got), torch.float16), asked
        assert run.args.out == tmp_path / "02_linear" and run.args.out.is_dir() and list(run.args.out.iterdir()) == []
    if not gpu:
        with pytest.raises(common.Fail) as e:
            common.setup("02_linear.py", setup_args(tmp_path, device="cuda"))
        assert one_line(e.value) == "--device cuda, but this machine has no CUDA GPU that PyTorch can use; try " \
            "--device cpu"


def test_setup_refuses_a_shape_that_cannot_fit(tmp_path, monkeypatch):
    asked = []
    free = 10 * 2**30

    def free_bytes(device):
        asked.append(device)
        return free

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(common, "free_bytes", free_bytes)
    fits = int(0.9 * free) // 4  # fp32: 4 bytes an element; up to 90% of what is free is allowed
    assert common.setup("02_linear.py", setup_args(tmp_path, dtype="fp32"), elements=fits).device.type == "cpu"
    assert asked == [torch.device("cpu")]
    with pytest.raises(common.Fail) as e:
        common.setup("02_linear.py", setup_args(tmp_path, dtype="fp32"), elements=fits + 1)
    assert one_line(e.value) == "this shape needs about 9.0 GiB but the cpu has 10.0 GiB free; try smaller sizes"
    with pytest.raises(common.Fail, match="needs about 18.0 GiB but the cpu has 10.0 GiB free"):
        common.setup("02_linear.py", setup_args(tmp_path, dtype="bf16"), elements=9 * 2**30)
    asked.clear()
    common.setup("02_linear.py", setup_args(tmp_path), elements=0)  # nothing said: nothing checked
    assert asked == []
    free = None  # unknown free memory: no check
    common.setup("02_linear.py", setup_args(tmp_path), elements=10**15)


def test_setup_output_folder_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(common.Fail) as e:
        common.setup("02_linear.py", setup_args(tmp_path / "file"))
    assert one_line(e.value) == f"cannot write to output folder {tmp_path / 'file' / '02_linear'}: Not a directory"


@pytest.mark.parametrize("gpu", [False, True])
def test_setup_compile_on_the_cpu_names_its_cpp_kernels(tmp_path, monkeypatch, gpu):
    import torch._inductor.config as inductor_config

    checked = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(common, "check_cpp_compiler", lambda: checked.append(True))
    with inductor_config.patch({"cpp.enable_kernel_profile": False}):  # put back as it was afterwards
        common.setup("02_linear.py", setup_args(tmp_path))
        assert checked == [] and inductor_config.cpp.enable_kernel_profile is False
        common.setup("02_linear.py", setup_args(tmp_path, compile=True))
        assert checked == ([] if gpu else [True]) and inductor_config.cpp.enable_kernel_profile is (not gpu)


def test_free_memory_of_each_device(monkeypatch):
    monkeypatch.setattr(common.os, "sysconf", lambda name: {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
    assert common.free_bytes(torch.device("cpu")) == 4096 * 1000
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: asked.append(device) or (123, 456))  # (free, total)
    assert common.free_bytes(torch.device("cuda", 1)) == 123 and asked == [torch.device("cuda", 1)]
