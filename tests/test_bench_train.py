"""bench_train.py on the CPU at tiny shapes: the record says it is a CPU run and its arithmetic holds (FLOPs worked
out here from the shapes and the tiny preset's numbers); the gradient check at its edge; bad flags. On a CUDA GPU
(skipped without one): every variant at small shapes, peak memory measured."""

import json

import pytest
import torch

import bench_train

# 06_model.py's tiny preset, as numbers: hidden 64, intermediate 256, 4 heads, 1 KV head, head_dim 16, vocab 512
D, H, HEADS, KV, HD, V = 64, 256, 4, 1, 16, 512


def cpu_run(tmp_path, capsys, *extra):
    out = tmp_path / "bt.json"
    code = bench_train.main(["--device", "cpu", "--shapes", "16x8x24,5x8x12", "--layers", "1", "--batch", "1",
                             "--seq", "8", "--out", str(out), *extra])
    printed, err = capsys.readouterr()
    return code, printed, err, out


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_train")
    out = tmp / "bt.json"
    # batch 3 and 2 layers: a count that leaves out the batch or the layers (the LM head's, the attention's) is off
    code = bench_train.main(["--device", "cpu", "--shapes", "16x8x24,5x8x12", "--layers", "2", "--batch", "3",
                             "--seq", "8", "--variants", "eager,liger,fused,fused-recompute,compile-fused",
                             "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text()), out


def test_cpu_record_says_cpu_and_its_arithmetic_holds(record):
    r, out = record
    assert r["device_type"] == "cpu" and "CPU smoke test" in r["timer"] and r["ceiling_gemm"] == "512x512x512"
    assert out.with_suffix(".txt").exists() and out.with_suffix(".png").exists()
    rows = out.with_suffix(".md").read_text().splitlines()
    # a column per variant asked for (compile was not), "—" where it did not run; no fused, so no comparison
    assert rows[0] == ("| case | floor | eager | liger | fused | fused-recompute | compile-fused "
                       "| fused vs best peer |")
    for s, row in zip(r["shapes"], rows[2:5], strict=True):  # the markdown table: the same numbers
        v = s["variants"]["eager"]
        assert row == (f"| {s['label']} | {s['floor_us']:,.1f} µs | {v['median_us']:,.1f} µs "
                       f"({v['of_floor']:.2f}) | — | — | — | — | — |")
    mlp1, mlp2, model = r["shapes"]
    # forward: three GEMMs of tokens x dim x hidden, 2 FLOP per multiply-add
    assert [s["forward_flops"] for s in (mlp1, mlp2)] == [6 * 16 * 8 * 24, 6 * 5 * 8 * 12]
    layers, batch, seq = 2, 3, 8
    per_token = layers * (D * (HEADS + 2 * KV) * HD + HEADS * HD * D + 3 * D * H)  # q, k, v; o; gate, up, down
    tokens = batch * seq
    attention = layers * 2 * batch * HEADS * seq * seq * HD  # QK^T and PV, causal: half of 4 * b * H * s^2 * d
    # the LM head at every position of every sequence: 2 * V * D per token
    assert model["forward_flops"] == 2 * per_token * tokens + 2 * V * D * tokens + attention
    assert (model["batch"], model["seq"], model["layers"]) == (batch, seq, layers)
    for s in r["shapes"]:
        assert s["flops"] == 3 * s["forward_flops"]
        assert s["floor_us"] == pytest.approx(s["flops"] / r["ceiling_tflops"] / 1e6)
        assert list(s["variants"]) == ["eager"]
        v = s["variants"]["eager"]
        assert v["median_us"] > 0 and v["of_floor"] == pytest.approx(s["floor_us"] / v["median_us"])
        assert v["peak_mib"] is None  # CUDA only
        assert 0 <= v["grad_rel_err"] <= r["grad_tolerance"] == 1e-4  # fp32 on the CPU: the same math as fp32's
        assert s["skipped"] == {name: bench_train.NEEDS_CUDA
                                for name in ("liger", "fused", "fused-recompute", "compile-fused")}


def test_model_forward_flops_by_hand_at_batch_above_one():
    """An odd made-up config (3 layers, d 40, h 72, 5 heads of 8, 1 KV head, vocab 1000) at batch 3, seq 7: a
    training step runs every GEMM, the LM head's included, on all 21 tokens; attention is causal."""
    import types

    config = types.SimpleNamespace(hidden_size=40, intermediate_size=72, num_hidden_layers=3, vocab_size=1000,
                                   num_attention_heads=5, num_key_value_heads=1, head_dim=8)
    b, s = 3, 7
    q, kv, o, mlp = 40 * 5 * 8, 2 * 40 * 1 * 8, 5 * 8 * 40, 3 * 40 * 72  # weights a token multiplies, one layer
    gemms = 2 * 3 * (q + kv + o + mlp) * b * s
    head = 2 * 1000 * 40 * b * s
    attention = 3 * 2 * b * 5 * s * s * 8
    assert bench_train.model_forward_flops(config, b, s, 4) == gemms + head + attention

def test_gradient_check_at_its_edge():
    """An error equal to the tolerance passes, one above stops the run; a call that raises is skipped."""
    calls = {"at": lambda: None, "raises": lambda: None}
    checks = {"at": (lambda: None, lambda: 1e-4), "raises": (lambda: None, lambda: 1 / 0)}
    skipped = {}
    out = bench_train.timed(dict(calls), checks, skipped, 1.0, 1e-4, False, "test")
    assert list(out) == ["at"] and out["at"]["grad_rel_err"] == 1e-4
    assert skipped == {"raises": "failed: ZeroDivisionError: division by zero"}
    with pytest.raises(AssertionError, match="relative error 1.01e-04 > 1e-04"):
        bench_train.timed({"above": lambda: None}, {"above": (lambda: None, lambda: 1.01e-4)}, {}, 1.0, 1e-4, False,
                          "test")
    with pytest.raises(AssertionError, match="nan"):
        bench_train.timed({"nan": lambda: None}, {"nan": (lambda: None, lambda: float("nan"))}, {}, 1.0, 1e-4, False,
                          "test")


def test_fused_against_its_peers_only():
    """"fused vs best peer": the faster of fused and compile-fused against the best of eager, compile and Liger,
    never fused-recompute (the same module, its memory mode); none without a fused form or without a peer. Ratio =
    the peer's µs / the fused form's; slower only beyond both spreads."""
    def case(**us):
        return {"variants": {n: {"median_us": t, "rounds_us": [t]} for n, t in us.items()}}

    assert bench_train.fused_vs_peers(case(eager=300.0, fused=200.0, **{"fused-recompute": 100.0})) == (
        "eager", 1.5, False, "fused")
    assert bench_train.fused_vs_peers(case(eager=300.0, compile=250.0, fused=500.0)) == (
        "compile", 0.5, True, "fused")
    # compile-fused the faster form: set against the fastest peer, whichever mode that peer runs in
    assert bench_train.fused_vs_peers(case(eager=300.0, compile=240.0, fused=320.0, **{"compile-fused": 200.0})) == (
        "compile", 1.2, False, "compile-fused")
    assert bench_train.fused_vs_peers(case(liger=100.0, **{"compile-fused": 400.0})) == (
        "liger", 0.25, True, "compile-fused")
    assert bench_train.fused_vs_peers(case(fused=200.0, **{"fused-recompute": 100.0})) is None
    assert bench_train.fused_vs_peers(case(eager=300.0, **{"fused-recompute": 100.0})) is None
    # within the spread: not "slower" (rounds 190-210 around 200 against 196)
    near = {"variants": {"eager": {"median_us": 196.0, "rounds_us": [196.0]},
                         "fused": {"median_us": 200.0, "rounds_us": [190.0, 200.0, 210.0]}}}
    assert bench_train.fused_vs_peers(near) == ("eager", 0.98, False, "fused")


def fake_gpu_timing(monkeypatch, fail=()):
    """bench_train.timed on a made-up GPU: peak memory 3 MiB, rounds from Python then graph replays as given below,
    graph_step failing for the calls named in fail; returns the order things happened in."""
    import bench

    seen = []
    plain = {"eager": [300.0, 310.0, 290.0], "liger": [280.0] * 3, "fused": [250.0] * 3}
    graph = {"eager": [200.0, 204.0, 196.0], "liger": [190.0] * 3, "fused": [160.0] * 3}

    def round_robin(fns, inference):
        assert inference is False
        by = graph if all(isinstance(f, tuple) for f in fns.values()) else plain
        seen.append(("graph rounds" if by is graph else "rounds", sorted(fns)))
        return {name: by[name] for name in fns}

    def graph_step(step):
        seen.append(("capture", step.__name__))
        if step.__name__ in fail:
            raise RuntimeError("operation not permitted when stream is capturing\nsecond line")
        return ("replay", step)

    monkeypatch.setattr(bench, "time_round_robin", round_robin)
    monkeypatch.setattr(bench_train, "graph_step", graph_step)
    monkeypatch.setattr(bench_train, "peak_bytes", lambda clear, step, cuda: seen.append(("peak", step.__name__))
                        or 3 * 2**20)
    return seen


def three_calls():
    def eager(): pass
    def liger(): pass
    def fused(): pass
    calls = {f.__name__: f for f in (eager, liger, fused)}
    return calls, {name: (lambda: None, lambda: 1e-3) for name in calls}


def test_graph_times_beside_the_times_from_python(monkeypatch):
    """On a GPU an MLP's calls are timed from Python, then captured and replayed: peak memory before any capture;
    graph µs, their rounds and of floor (100 / 160 = 0.625) beside the µs; a failed capture keeps the time from
    Python and says why. By graph time fused is 200 / 160 = 1.25x eager's (liger's 190 is not compared: a peer
    without a graph leaves no graph comparison, one sentence says so); from Python 280 / 250 = 1.12x liger's."""
    seen = fake_gpu_timing(monkeypatch, fail=("liger",))
    calls, checks = three_calls()
    out = bench_train.timed(calls, checks, {}, 100.0, 1e-2, True, "test", graphs=True)
    assert seen == [("peak", "eager"), ("peak", "liger"), ("peak", "fused"), ("rounds", ["eager", "fused", "liger"]),
                    ("capture", "eager"), ("capture", "liger"), ("capture", "fused"),
                    ("graph rounds", ["eager", "fused"])]
    assert out["fused"] == {"median_us": 250.0, "rounds_us": [250.0] * 3, "of_floor": 0.4, "grad_rel_err": 1e-3,
                            "peak_mib": 3.0, "graph_median_us": 160.0, "graph_rounds_us": [160.0] * 3,
                            "graph_of_floor": 0.625}
    assert out["eager"]["graph_median_us"] == 200.0 and out["eager"]["median_us"] == 300.0
    assert out["liger"]["graph_failed"] == "failed: RuntimeError: operation not permitted when stream is capturing"
    assert "graph_median_us" not in out["liger"]
    case = {"label": "MLP fwd+bwd 8x4x16", "forward_flops": 1e9, "flops": 3e9, "floor_us": 100.0, "variants": out,
            "skipped": {}}
    assert bench_train.fused_vs_peers(case, "graph_median_us") is None
    lines = bench_train.case_lines(case)
    assert lines[1].split()[-6:] == ["err", "graph", "µs", "spread", "of", "floor"]
    assert lines[2].split()[-3:] == ["200.0", "4.0%", "0.50"]  # eager: (204 - 196) / 200
    assert lines[3].split()[-3:] == ["-", "-", "-"]
    assert lines[5:] == [
        "  not as a CUDA graph (timed from Python alone): liger: failed: RuntimeError: operation not permitted when "
        "stream is capturing",
        "  fused vs best peer as CUDA graphs: - (not every variant compared was captured)",
        "  fused vs best peer as called: fused against liger, 1.12x"]
    del case["variants"]["liger"]
    assert bench_train.case_lines(case)[-2:] == ["  fused vs best peer as CUDA graphs: fused against eager, 1.25x",
                                                 "  fused vs best peer as called: fused against eager, 1.20x"]
    record = {"shapes": [case], "timer": "T", "graph_timer": "G", "ceiling_tflops": 700.0, "device": "a GPU",
              "dtype": "bf16", "torch": "2.11", "triton": "3.6", "liger_kernel": "0.8.5", "date": "2027-01-02"}
    md = bench_train.markdown(record).splitlines()
    assert md[2] == ("| MLP fwd+bwd 8x4x16 | 100.0 µs | 300.0 µs (0.33, 3 MiB); graph 200.0 µs (0.50) "
                     "| 250.0 µs (0.40, 3 MiB); graph 160.0 µs (0.62) | 1.25× (fused / eager, graphs) |")
    assert " Graph: G; fused vs best peer by graph time where every variant compared has one. a GPU," in md[4]


def test_no_graph_where_not_asked_or_on_a_cpu(monkeypatch):
    """The model's step (graphs=False) and a CPU run: no capture, no graph field; the tables as before."""
    seen = fake_gpu_timing(monkeypatch)
    calls, checks = three_calls()
    out = bench_train.timed(dict(calls), checks, {}, 100.0, 1e-2, True, "test")
    assert [what for what, _ in seen] == ["peak", "peak", "peak", "rounds"]
    assert not any(k.startswith("graph") for v in out.values() for k in v)
    out = bench_train.timed(dict(calls), checks, {}, 100.0, 1e-2, False, "test", graphs=True)  # CPU
    assert not any(k.startswith("graph") for v in out.values() for k in v) and seen[-1][0] == "peak"
    assert not bench_train.graphed({"variants": out})


def test_a_failed_capture_sets_the_stream_back(monkeypatch):
    """torch.cuda.graph's exit stops at a failed capture_end, its side stream still current: graph_step sets the
    stream it found back and waits for the GPU before the error goes on (to timed, which records it)."""
    import bench

    said = []
    monkeypatch.setattr(bench_train.torch.cuda, "current_stream", lambda: "the stream before")
    monkeypatch.setattr(bench_train.torch.cuda, "set_stream", lambda stream: said.append(("set", stream)))
    monkeypatch.setattr(bench_train.torch.cuda, "synchronize", lambda: said.append("sync"))

    def replay(step, inference, warm_ups):
        said.append(("capture", inference, warm_ups))
        raise RuntimeError("capture failed")
    monkeypatch.setattr(bench, "graph_replay", replay)
    with pytest.raises(RuntimeError, match="capture failed"):
        bench_train.graph_step(lambda: None)
    assert said == [("capture", False, 3), ("set", "the stream before"), "sync"]
    monkeypatch.setattr(bench, "graph_replay", lambda step, inference, warm_ups: "the replay")
    assert bench_train.graph_step(lambda: None) == "the replay"


def test_grad_error_names_a_missing_gradient():
    want = {"a": torch.ones(3), "b": torch.ones(2)}
    assert bench_train.grad_error({"a": torch.ones(3), "b": torch.ones(2) * 1.5}, want) == pytest.approx(
        (2 * 0.5**2) ** 0.5 / 5**0.5)  # the two as one vector: ||(0, 0, 0, .5, .5)|| / ||(1, 1, 1, 1, 1)||
    with pytest.raises(AssertionError, match="no gradient for b"):
        bench_train.grad_error({"a": torch.ones(3), "b": None}, want)


@pytest.mark.parametrize("flags, message", [
    (["--variants", "eager,fast"], "--variants: expected a comma-separated list of eager, compile, liger, fused, "
                                   "fused-recompute, compile-fused, got 'eager,fast'"),
    (["--shapes", "0x8x8"], "--shapes: expected MxDIMxHIDDEN"),
    (["--layers", "0"], "must be between 1 and 1000")])
def test_bad_flags_are_one_line(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as done:
        cpu_run(tmp_path, capsys, *flags)
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1 and err.startswith("bench_train.py: ") and message in err, err
    assert not (tmp_path / "bt.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_one_line(capsys):
    assert bench_train.main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_every_variant_at_small_shapes(tmp_path):
    out = tmp_path / "bt.json"
    assert bench_train.main(["--shapes", "1000x256x520", "--model", "tiny", "--batch", "2", "--seq", "64",
                             "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["device_type"] == "cuda"
    for s in r["shapes"]:
        assert {"eager", "fused", "fused-recompute", "compile-fused"} <= set(s["variants"]), s["skipped"]
        for v in s["variants"].values():
            assert v["peak_mib"] > 0 and v["grad_rel_err"] <= r["grad_tolerance"]
    # the MLP as CUDA graphs: each variant replayed, or the reason its capture failed; the model's step from Python
    for v in r["shapes"][0]["variants"].values():
        assert v.get("graph_median_us", 0) > 0 or v["graph_failed"].startswith("failed: "), v
    failed = {n: v["graph_failed"] for s in r["shapes"][:-1] for n, v in s["variants"].items() if "graph_failed" in v}
    assert not failed, failed  # each variant captured at these shapes: a failure here is news, with its reason
    assert not bench_train.graphed(r["shapes"][-1]) and "graph_timer" in r
    model = r["shapes"][-1]["variants"]
    assert (model["compile-fused"]["execution"], model["compile-fused"]["mlp"]) == ("compile", "fused")
    assert (model["compile"]["execution"], model["compile"]["mlp"]) == ("compile", "eager")


def test_cpu_swiglu_run(tmp_path):
    """--activation silu on the CPU: the SwiGLU MLP (transformers' LlamaMLP, eager and compiled) at the shapes asked
    for, then the tiny-llama model's step; the record and its labels say SwiGLU; the gradients within fp32's
    tolerance of fp32 autograd; the Triton variants skipped, with the reason. FLOPs as GeGLU's: the same GEMMs."""
    out = tmp_path / "bt.json"
    assert bench_train.main(["--device", "cpu", "--activation", "silu", "--shapes", "16x8x24", "--layers", "1",
                             "--batch", "1", "--seq", "8", "--variants", "eager,compile,liger,fused",
                             "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    mlp, model = r["shapes"]
    assert r["activation"] == mlp["activation"] == "silu"
    assert mlp["label"] == "SwiGLU MLP fwd+bwd 16x8x24" and mlp["forward_flops"] == 6 * 16 * 8 * 24
    assert model["label"] == "tiny-llama 1L train step 1x8" and model["preset"] == "tiny-llama"
    for s in (mlp, model):
        assert list(s["variants"]) == ["eager", "compile"], s["skipped"]
        assert all(v["grad_rel_err"] <= r["grad_tolerance"] for v in s["variants"].values())
        assert s["skipped"] == {"liger": bench_train.NEEDS_CUDA, "fused": bench_train.NEEDS_CUDA}
    assert bench_train.parse_args(["--device", "cpu"]).model == "tiny"  # GeGLU by default, as before
    assert bench_train.parse_args(["--activation", "silu"]).shapes == [(4096, 4096, 14336), (4096, 3584, 18944),
                                                                        (4096, 896, 4864)]
    assert bench_train.parse_args(["--activation", "silu"]).model == "llama-1b"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_every_swiglu_variant_at_small_shapes(tmp_path):
    out = tmp_path / "bt.json"
    assert bench_train.main(["--activation", "silu", "--shapes", "1000x256x520", "--model", "tiny-llama", "--batch",
                             "2", "--seq", "64", "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    for s in r["shapes"]:
        assert {"eager", "liger", "fused", "fused-recompute", "compile-fused"} <= set(s["variants"]), s["skipped"]
        for v in s["variants"].values():
            assert v["peak_mib"] > 0 and v["grad_rel_err"] <= r["grad_tolerance"]
