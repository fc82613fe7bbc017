"""08_tensor_parallel.py for real: one 2-rank gloo run on the CPU at a tiny shape (the page's torchrun command,
run once in the session: test_readme runs it too), read back by inspect_trace.py; bad launches refused in one line on every rank; one CUDA GPU under torchrun when present."""

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import common
import pytest
import torch
from conftest import RANK_ENV, run_rank_main, run_script_main
from test_readme import COMMANDS, CPU_SHAPE, page_runs

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--batch", "2", "--seq", "32", "--dim", "64", "--hidden", "256", "--dtype", "fp32"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def torchrun(nproc, *args, out, device="cpu"):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                           str(nproc), str(ROOT / "08_tensor_parallel.py"), *args, "--device", device, "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=540, env=env)


PAGE_RUN = ["torchrun", "--standalone", "--nproc-per-node", "2", "08_tensor_parallel.py"]


@pytest.fixture(scope="module")
def gloo_run(shared_runs, tmp_path_factory):
    """The page's 2-rank command on the CPU, which test_readme runs at TINY (its CPU_SHAPE): three processes that
    import torch, so run once for both files."""
    assert PAGE_RUN in COMMANDS and CPU_SHAPE["08_tensor_parallel.py"] == TINY
    pages = page_runs(shared_runs, tmp_path_factory)
    return pages.run(PAGE_RUN), pages.out / "08_tensor_parallel"


def test_two_gloo_ranks_write_a_trace_each_and_rank_0_merges_them(gloo_run):
    proc, folder = gloo_run
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    stem = "2x32x64x256_fp32_cold_tp2_eager"
    for r in (0, 1):
        assert (folder / f"{stem}_rank{r}.json").is_file() and (folder / f"{stem}_rank{r}.txt").is_file()
    assert "BROKEN" not in proc.stdout and "rank 1: broken" not in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"^\s+ok\s+1 all_reduce per step$", proc.stdout, flags=re.M), proc.stdout[-3000:]
    assert "2 rank(s), gloo, CPU" in proc.stdout  # the merged report, printed once, by rank 0
    checks = [line for line in proc.stdout.splitlines() if "check: rank" in line]  # each rank's, on a line of its own
    assert len(checks) == 2 and all(line.count("check:") == 1 and line.startswith("check: ") for line in checks), checks
    assert proc.stdout.count("all 2 rank(s), merged") == 1


def test_the_reader_merges_the_run_folder(gloo_run):
    proc, folder = gloo_run
    read = subprocess.run([sys.executable, str(ROOT / "inspect_trace.py"), "--json", str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout)
    assert (data["world_size"], data["backend"], data["device"]) == (2, "gloo", "cpu")
    assert [[s["step"] for s in r["steps"]] for r in data["ranks"]] == [[2, 3, 4], [2, 3, 4]]
    # one all-reduce per step of the [2, 32, 64] fp32 output: 2 * 32 * 64 * 4 bytes
    assert [(c["step"], c["kind"], c["bytes"]) for c in data["collectives"]] == \
        [(n, "all_reduce", 2 * 32 * 64 * 4) for n in (2, 3, 4)]
    for r in data["ranks"]:
        for s in r["steps"]:
            assert s["comm_us"] > 0 and s["exposed_us"] + s["overlapped_us"] == pytest.approx(s["comm_us"])


def test_bad_hidden_fails_on_every_rank_in_one_line(tmp_path):
    proc = torchrun(2, *TINY[:6], "--hidden", "255", out=tmp_path)
    lines = [ln for ln in proc.stderr.splitlines() if "08_tensor_parallel.py: error:" in ln]
    # Each rank that gets to its launch check says so; torchrun stops the other once one has exited, and on a busy
    # machine (the H200's suite, 10 workers) a rank still importing torch was stopped before it printed: 1 or 2 lines.
    assert proc.returncode != 0 and 1 <= len(lines) <= 2, proc.stderr[-3000:]
    assert all(ln == "08_tensor_parallel.py: error: --hidden 255 does not split over 2 ranks: pick a multiple of 2"
               for ln in lines), lines
    assert '08_tensor_parallel.py", line' not in proc.stderr  # no traceback through the script (torchrun has its own)
    assert not (tmp_path / "08_tensor_parallel").exists()  # nothing written, no empty folder left
    # what docs/08's "Bad launches" says torchrun adds below the line: its ChildFailedError report, exit code 1
    assert proc.returncode == 1 and "torch.distributed.elastic.multiprocessing.errors.ChildFailedError" in proc.stderr


def test_the_page_says_what_torchrun_adds_to_a_refused_launch():
    """docs/08: a refused launch (--mlp fused on a CPU among them) is each rank's one line, exit code 2, and then
    torchrun's own report: a traceback ending in ChildFailedError, exit code 1 (test_bad_hidden_... sees both)."""
    from doc_pages import page, section

    text = page("docs/08_tensor_parallel.md")
    bad = " ".join(section(text, "## Bad launches").split())
    assert "`--mlp fused` without a CUDA GPU" in bad and "exits with code 2 before it waits for any other" in bad
    assert "`torch.distributed.elastic.multiprocessing.errors.ChildFailedError`" in bad
    assert "`torchrun` itself exits with code 1" in bad
    row = next(line for line in text.splitlines() if line.startswith("| `--mlp eager"))
    assert "exit code 2" not in row and "[Bad launches](#bad-launches)" in row


def test_each_printed_line_leaves_in_one_write():
    """Ranks print to one terminal or file: under PYTHONUNBUFFERED=1 print() wrote a line and its newline apart, and
    two ranks' check lines ran together on one line. common.whole_lines (08's and 09's) makes each printed line one
    write."""
    import io

    writes = []

    class Raw(io.RawIOBase):
        def writable(self):
            return True

        def write(self, b):
            writes.append(bytes(b))
            return len(b)

    stream = io.TextIOWrapper(Raw(), write_through=True)  # as python -u (PYTHONUNBUFFERED=1) makes stdout
    print("check: rank 0", file=stream)
    assert writes == [b"check: rank 0", b"\n"]  # the interleaving the ranks showed
    writes.clear()
    common.whole_lines(stream)
    print("check: rank 1's TP=2 eager MLP", file=stream)
    print("rank 1: broken: x", file=stream)
    assert writes == [b"check: rank 1's TP=2 eager MLP\n", b"rank 1: broken: x\n"]
    common.whole_lines(io.StringIO())  # a test's captured stdout: nothing to set, no error


# In this process: the launch checks come before any rank waits for another.
tp = importlib.import_module("08_tensor_parallel")
def run_here(tmp_path, monkeypatch, env, *args):
    return run_rank_main("08_tensor_parallel.py", tp.main, tmp_path, monkeypatch, env, *TINY, *args)


def test_not_under_torchrun(tmp_path, monkeypatch):
    code, out, err = run_here(tmp_path, monkeypatch, {})
    assert code == 2 and err.count("\n") == 1 and "not started by torchrun" in err and "torchrun --standalone" in err


@pytest.mark.parametrize("args, words", [(["--hidden", "255"], "--hidden 255 does not split over 2 ranks"),
                                         (["--sequence-parallel", "--seq", "31"], "--seq 31 is not a multiple of 2"),
                                         (["--mlp", "fused"], "needs a CUDA GPU"),
                                         (["--chunks", "2", "--sequence-parallel"], "--chunks overlaps the all-reduce"),
                                         # each of --chunks' three refusals on its own: were one dropped, --compile
                                         # would start the ranks, --mlp fused would meet "needs a CUDA GPU" instead
                                         (["--chunks", "2", "--compile"], "--chunks overlaps the all-reduce"),
                                         (["--chunks", "2", "--mlp", "fused"], "--chunks overlaps the all-reduce")])
def test_refused_before_the_process_group_starts(tmp_path, monkeypatch, args, words):
    # MASTER_PORT 1 and --timeout 5: a start-up the check let through fails within seconds, rather than hang
    code, out, err = run_here(tmp_path, monkeypatch, RANK_ENV, *args, "--timeout", "5")
    assert code == 2 and err.count("\n") == 1 and words in err, err


def test_chunked_on_one_rank_in_this_process(tmp_path, monkeypatch):
    """--chunks' own forward (slices, an asynchronous all-reduce each) checked against the whole MLP, on one gloo
    rank in this process: the script's correctness check runs, and the trace has the chunked name."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**RANK_ENV, "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_PORT": port}
    code, out, err = run_here(tmp_path, monkeypatch, env, "--chunks", "2")
    assert code == 0, err[-3000:]
    assert re.search(r"^check: rank 0's TP=1 eager MLP vs the whole MLP on one rank", out, flags=re.M)
    assert (tmp_path / "08_tensor_parallel/2x32x64x256_fp32_cold_tp1_chunks2_eager_rank0.json").is_file()
    assert re.search(r"n/a\s+2 all_reduce per step", out) and "BROKEN" not in out


def test_more_ranks_than_gpus(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for k in common.TORCHRUN_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in RANK_ENV.items():
        monkeypatch.setenv(k, v)
    code, out, err = run_script_main("08_tensor_parallel.py", tp.main, tmp_path, *TINY, device="auto")
    assert code == 2 and err.count("\n") == 1 and "2 ranks on this machine but 1 GPU(s)" in err, err


@cuda
def test_one_gpu_under_torchrun(tmp_path):
    proc = torchrun(1, "--batch", "8", "--seq", "128", out=tmp_path, device="cuda")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "1 rank(s), nccl" in proc.stdout and "BROKEN" not in proc.stdout, proc.stdout[-3000:]
    assert re.search(r"n/a\s+1 all_reduce per step", proc.stdout)


def test_a_ranks_files_end_in_its_rank():
    import argparse

    from trace_reader.analyzers import ranks

    args = common.parser("x", size=64).parse_args(["--active", "5"])
    run = common.Run("08_tensor_parallel", argparse.Namespace(**vars(args)), torch.device("cpu"), torch.bfloat16,
                     rank=3)
    assert run.stem("64", "_tp4_sp") == "64_bf16_cold_active5_tp4_sp_eager_rank3"
    assert ranks.rank_file(Path("t/64_bf16_cold_tp4_eager_rank3.json.gz"), 0) == Path("t/64_bf16_cold_tp4_eager_rank0.json.gz")


def test_expect_reads_each_gloo_rank_back(gloo_run, capsys):
    """--expect 08_tensor_parallel on a saved rank trace gives what the run itself printed: every guess held. Read
    in this process: --expect imports the script, and so torch, which a fresh process would import again."""
    import inspect_trace

    proc, folder = gloo_run
    for r in (0, 1):
        code = inspect_trace.main(["--expect", "08_tensor_parallel",
                                   str(folder / f"2x32x64x256_fp32_cold_tp2_eager_rank{r}.json")])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "08_tensor_parallel eager, TP=2, MLP eager, 3 steps (read from the trace)" in out
        assert re.search(r"^\s+ok\s+1 all_reduce per step$", out, flags=re.M), out[-2000:]
        assert "BROKEN" not in out
