"""common.py's harness at its edges, found by running every mutant of the file (docs/tests.md): what profile() asks
of torch's profiler (a stand-in records it, so no profile is recorded here), the warnings it silences and no
others, a Ctrl-C that leaves the profiler unable to stop, the flags' bounds, a run's name and description line,
setup's refusals and the folder it tries, the harness's log filter. Each expected value is written by hand."""
import argparse
import logging
import warnings
from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerAction, ProfilerActivity

import common
import safe_output

N, W, R, S = ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE


class Stand:
    """In place of torch.profiler.profile: keeps what it was given, steps, and fails to stop when told to."""

    def __init__(self, fail_to_stop=False, **kwargs):
        self.kwargs, self.steps, self.fail_to_stop = kwargs, 0, fail_to_stop

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.fail_to_stop and exc[0] is not None:
            raise RuntimeError("the profiler could not stop")
        return False

    def step(self):
        self.steps += 1


def args(**kw):
    return argparse.Namespace(**{"dtype": "bf16", "warmup": 0, "sync_each_step": False, "compile": False,
                                 **common.SCHEDULE, **kw})


def run(device="cpu", **kw):
    return common.Run("02_linear", args(**kw), torch.device(device), torch.bfloat16)


@pytest.fixture
def stand(monkeypatch):
    """common.profile with the stand-in profiler and a sync that notes its argument (a "cuda" run on any machine)."""
    synced = []
    monkeypatch.setattr(common, "Profiler", Stand)
    monkeypatch.setattr(common, "sync", synced.append)
    return synced


def test_the_profiler_is_asked_for_shapes_memory_stacks_and_the_devices_activities(stand):
    cpu = common.profile(run(), lambda: None, "step")
    assert cpu.kwargs["activities"] == [ProfilerActivity.CPU]
    assert cpu.kwargs["record_shapes"] is True
    assert cpu.kwargs["profile_memory"] is False and cpu.kwargs["with_stack"] is False
    gpu = common.profile(run("cuda"), lambda: None, "step", profile_memory=True, with_stack=True)
    assert gpu.kwargs["activities"] == [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    assert gpu.kwargs["profile_memory"] is True and gpu.kwargs["with_stack"] is True


def test_the_schedule_runs_once_and_then_stops(stand):
    """wait 2, warm-up 1, active 2 with repeat=1: five steps, then nothing more is recorded (repeat=0 would start a
    second cycle at step 5)."""
    prof = common.profile(run(wait=2, profiler_warmup=1, active=2), lambda: None, "step")
    assert prof.steps == 5
    assert [prof.kwargs["schedule"](i) for i in range(9)] == [N, N, W, R, S, N, N, N, N]


def test_a_sync_per_step_syncs_the_run_each_step(stand):
    """Once after the warm calls, then after each of the 5 steps of the post's schedule."""
    r = run(sync_each_step=True)
    common.profile(r, lambda: None, "step")
    assert stand == [r] * 6


def test_the_compile_line_says_where_it_compiles(stand, capsys):
    common.profile(run(compile=True), lambda: None, "step")
    common.profile(run("cuda", compile=True), lambda: None, "step")
    common.profile(run(), lambda: None, "step")
    assert capsys.readouterr().out == (
        "compiling the forward with torch.compile: the first call takes a while on a CPU (tens of seconds)\n"
        "compiling the forward with torch.compile: the first call takes a while (tens of seconds)\n")


def test_only_the_profilers_two_known_warnings_are_silenced(stand):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        common.profile(run(profiler_warmup=0), lambda: None, "step")
        warnings.warn("Profiler won't be using warmup, this can skew profiler results")
        warnings.warn("The Profiler clears events at the end of each cycle. Only events from the current cycle ...")
        warnings.warn("something else")
    assert [str(w.message) for w in seen] == ["something else"]  # (the filters' patterns ignore case)


def test_an_error_in_a_step_stays_itself_and_a_ctrl_c_stays_a_ctrl_c(monkeypatch):
    """A step's ValueError reaches the caller as it is; a Ctrl-C mid-step whose profiler then fails to stop is
    reported as the Ctrl-C, not as the profiler's error."""
    monkeypatch.setattr(common, "sync", lambda r: None)

    def boom(exc):
        def step():
            raise exc
        return step

    monkeypatch.setattr(common, "Profiler", Stand)
    with pytest.raises(ValueError):
        common.profile(run(), boom(ValueError("a step's own error")), "step")
    monkeypatch.setattr(common, "Profiler", lambda **kw: Stand(fail_to_stop=True, **kw))
    with pytest.raises(KeyboardInterrupt):
        common.profile(run(), boom(KeyboardInterrupt()), "step")
    with pytest.raises(RuntimeError):  # no Ctrl-C: the profiler's own error is what happened
        common.profile(run(), boom(ValueError("x")), "step")


# ---- the flags ----------------------------------------------------------------------------------------------------

def test_whole_numbers_within_their_bounds_both_ends_included():
    parse = common.int_arg(2, 10)
    assert [parse(t) for t in ("2", "10")] == [2, 10]
    for text, said in (("1", "must be between 2 and 10, got 1"), ("11", "must be between 2 and 10, got 11"),
                       ("x", "expected a whole number, got 'x'")):
        with pytest.raises(argparse.ArgumentTypeError) as e:
            parse(text)
        assert str(e.value) == said


def test_warmup_takes_0_to_10000_calls():
    p = common.parser("doc")
    assert [p.parse_args(a).warmup for a in ([], ["--warmup"], ["--warmup", "0"], ["--warmup", "10000"])] == [
        0, common.WARMUP_CALLS, 0, 10000]
    with pytest.raises(common.Fail) as e:
        p.parse_args(["--warmup", "10001"])
    assert "must be between 0 and 10000, got 10001" in str(e.value)


def test_a_runs_name_tags_each_schedule_setting_that_differs():
    assert run(wait=0, profiler_warmup=0, active=20).stem("64") == "64_bf16_cold_wait0_pwarmup0_active20_eager"
    assert run(profiler_warmup=2).stem("64") == "64_bf16_cold_pwarmup2_eager"


def test_the_description_line_names_the_gpu_and_the_sync(monkeypatch, capsys):
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: asked.append(d) or "NVIDIA H200")
    r = run("cuda", sync_each_step=True)
    common.describe(r)
    assert asked == [r.device]
    assert capsys.readouterr().out == (f"02_linear: NVIDIA H200, torch {torch.__version__}, bf16, eager, cold, "
                                       "schedule(wait=1, warmup=1, active=3), sync after each step\n")


# ---- setup ------------------------------------------------------------------------------------------------------

def setup_args(tmp_path, **kw):
    return argparse.Namespace(**{"device": "cpu", "dtype": "bf16", "compile": False, "out": tmp_path, **kw})


def test_plot_on_the_cpu_is_refused_in_one_line(tmp_path):
    with pytest.raises(common.Fail) as e:
        common.setup("02_linear.py", setup_args(tmp_path, plot=True))
    assert str(e.value) == ("--plot on the CPU: a CPU trace has no roofline (no GPU kernels, no device peaks); "
                            "run without --plot")
    assert common.setup("02_linear.py", setup_args(tmp_path, plot=False)).script == "02_linear"


def test_setup_tries_a_file_in_the_scripts_own_folder(tmp_path, monkeypatch):
    tried = []
    real = common.tempfile.TemporaryFile
    monkeypatch.setattr(common.tempfile, "TemporaryFile", lambda dir: tried.append(Path(dir)) or real(dir=dir))
    common.setup("02_linear.py", setup_args(tmp_path))
    assert tried == [tmp_path / "02_linear"]


def test_a_script_that_always_compiles_runs_as_compiled(tmp_path, monkeypatch):
    """FlexAttention's script: compiled=True without --compile names the run _compile (the C++ check and
    Inductor's setting, made on a CPU, are stood in for)."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(common, "check_cpp_compiler", lambda: None)
    # Inductor's own patch, not monkeypatch: monkeypatch's undo deletes a config entry, which torch then hides,
    # and every later compile in this worker fails ("cpp.enable_kernel_profile does not exist").
    with inductor_config.patch({"cpp.enable_kernel_profile": False}):
        r = common.setup("05_attention.py", setup_args(tmp_path), compiled=True)
        assert r.compiled is True and r.mode == "compile" and inductor_config.cpp.enable_kernel_profile is True


# ---- the rest ---------------------------------------------------------------------------------------------------

def test_a_trace_ending_in_a_brace_looks_complete_however_short(tmp_path):
    for text, complete in ((b"}", True), (b"{}\n", True), (b"", False), (b'{"a": [1', False)):
        (tmp_path / "t.json").write_bytes(text)
        assert safe_output.looks_complete(tmp_path / "t.json") is complete, text


def test_the_cuda_runtime_warning_alone_is_dropped_from_the_log():
    def record(message):
        return logging.LogRecord("torch.utils.cpp_extension", logging.WARNING, "x.py", 1, message, None, None)

    (drop,) = [f for f in logging.getLogger("torch.utils.cpp_extension").filters
               if isinstance(f, common.DropMessage)]
    assert drop.filter(record("No CUDA runtime is found, using CUDA_HOME='/usr/local/cuda'")) is False
    assert drop.filter(record("Something else: No CUDA runtime is found")) is True


def test_relative_error_of_small_and_zero_tensors():
    """|a - b| / |b|, with |b| floored at 1e-12 only: 0.25 / 0.25 = 1 for a small b; two zero tensors: 0."""
    assert common.rel_error(torch.tensor([0.5]), torch.tensor([0.25])) == 1.0
    assert common.rel_error(torch.zeros(3), torch.zeros(3)) == 0.0


def test_an_error_exactly_at_the_tolerance_passes(monkeypatch, capsys):
    """err <= tol passes, the tolerance included; just above it, or NaN, fails in one line."""
    r = run()
    tol = common.TOLERANCE[r.dtype]
    for err, ok in ((tol, True), (tol * 1.001, False), (float("nan"), False)):
        monkeypatch.setattr(common, "rel_error", lambda a, b, err=err: err)
        if ok:
            assert common.check_close(r, "fused", torch.zeros(1), torch.zeros(1)) == tol
        else:
            with pytest.raises(common.Fail):
                common.check_close(r, "fused", torch.zeros(1), torch.zeros(1))


def test_an_eager_profile_does_not_import_inductor():
    """torch's profile asks hasattr(torch, "_inductor") as each cycle starts, which imports Inductor and Dynamo (about
    2 s of an eager script's start); common.Profiler hides the lazy module for that question only. In a fresh process:
    an eager profile leaves Inductor unimported, and torch's lazy import works again after it."""
    import subprocess
    import sys

    code = ("import argparse, sys, torch, common\n"
            "args = argparse.Namespace(dtype='fp32', warmup=0, sync_each_step=False, compile=False, **common.SCHEDULE)\n"
            "common.profile(common.Run('02_linear', args, torch.device('cpu'), torch.float32), lambda: torch.ones(2) + 1,"
            " 'step')\n"
            "print('torch._inductor' in sys.modules, '_inductor' in torch._lazy_modules, hasattr(torch, '_inductor'),"
            " 'torch._inductor' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(common.__file__).parent, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["False", "True", "True", "True"], out.stdout


@pytest.mark.parametrize("imported", [False, True])
def test_inductor_is_hidden_only_while_the_profile_prepares_and_only_if_not_imported(monkeypatch, imported):
    """The lazy module is hidden during profile.prepare_trace alone, and put back even when it raises; where Inductor
    is imported already, nothing is hidden."""
    import sys

    lazy = {"_dynamo", "_inductor"}
    monkeypatch.setattr(torch, "_lazy_modules", lazy)
    if imported:
        monkeypatch.setitem(sys.modules, "torch._inductor", sys.modules.get("torch._inductor", object()))
    else:
        monkeypatch.delitem(sys.modules, "torch._inductor", raising=False)
    seen = []

    def prepare(self):
        seen.append(set(lazy))
        raise RuntimeError("kineto failed")

    monkeypatch.setattr(torch.profiler.profile, "prepare_trace", prepare)
    with pytest.raises(RuntimeError, match="kineto failed"):
        common.Profiler.prepare_trace(object.__new__(common.Profiler))
    assert seen == [{"_dynamo", "_inductor"} if imported else {"_dynamo"}]
    assert lazy == {"_dynamo", "_inductor"}


def test_flags_answer_to_either_spelling():
    """--in-dim for the post's --in_dim, --kv_heads and --profiler_warmup for the suite's hyphenated flags, with = or
    a separate value; an unknown flag is still one error; after `--` nothing is rewritten."""
    p = common.parser("x", batch=4, in_dim=8)
    p.add_argument("--kv-heads", type=int, default=1)
    got = p.parse_args(["--in-dim", "5", "--kv_heads=3", "--profiler_warmup", "2", "--sync_each_step"])
    assert (got.in_dim, got.kv_heads, got.profiler_warmup, got.sync_each_step) == (5, 3, 2, True)
    assert p.parse_args(["--in_dim", "6", "--kv-heads", "2"]).in_dim == 6  # the declared spellings, as before
    with pytest.raises(common.Fail, match="unrecognized arguments: --in-dimx"):
        p.parse_args(["--in-dimx", "5"])
    q = common.parser("x", batch=4)
    q.add_argument("rest", nargs="*")
    assert q.parse_args(["--", "--sync_each_step"]).rest == ["--sync_each_step"]
