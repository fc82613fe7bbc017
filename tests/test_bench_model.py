"""bench_model.py: one CPU smoke run (tiny preset) read back, its floors re-derived from the model's own weights,
the correctness gate, bad input, and a reduced run on a GPU."""

import contextlib
import io
import json

import pytest
import torch
import transformers
from conftest import assert_ceilings_said

import bench_model
import common

SEQ = 32
LAYERS = 1  # tiny's 2 layers cost the cold compile (no Inductor cache, as on CI) 16 s more, for no other check


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The CPU smoke run, once for the module: (record, printed text, output path)."""
    out = tmp_path_factory.mktemp("bench_model") / "b.json"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert bench_model.main(["--device", "cpu", "--seq", str(SEQ), "--layers", str(LAYERS), "--out", str(out)]) == 0
    return json.loads(out.read_text()), buf.getvalue(), out


def test_cpu_run_checks_times_and_records(smoke):
    record, printed, out = smoke
    assert record["device_type"] == "cpu" and record["dtype"] == "bf16" and record["ceiling_tflops"] > 0
    assert {"torch", "transformers", "python", "date", "timer", "copy_tbps"} <= set(record)
    assert record["model"]["preset"] == "tiny" and record["model"]["seq"] == SEQ and record["model"]["batch"] == 1
    prefill, decode = record["shapes"]
    assert (prefill["phase"], prefill["bound"], decode["phase"], decode["bound"]) == (
        "prefill", "compute", "decode", "memory")
    for shape in record["shapes"]:
        # On a CPU: eager and compiled run with transformers' MLP; the Triton MLPs and CUDA graphs say why not.
        assert set(shape["variants"]) == {"eager / eager", "compile / eager"}
        assert all("needs a CUDA GPU" in why for name, why in shape["skipped"].items() if "liger" in name or
                   "fused" in name) and len(shape["skipped"]) == (7 if shape["phase"] == "decode" else 4)
        assert shape["variants"]["eager / eager"]["rel_err"] == 0  # the reference itself
        for v in shape["variants"].values():
            assert 0 < v["median_us"] and v["rel_err"] <= common.TOLERANCE[torch.bfloat16]
            assert v["of_floor"] == pytest.approx(shape["floor_us"] / v["median_us"])
    assert "cuda-graphs / eager" in decode["skipped"] and "cuda-graphs / eager" not in prefill["skipped"]
    for v in prefill["variants"].values():
        assert v["tokens_per_s"] == pytest.approx(SEQ / v["median_us"] * 1e6)
    for v in decode["variants"].values():
        assert v["ms_per_token"] == pytest.approx(v["median_us"] / 1e3)
    table = out.with_suffix(".txt").read_text()
    assert table.splitlines()[0] in printed and "compile      eager" in table
    assert_ceilings_said(printed.splitlines()[0], record["ceiling_tflops"], record["copy_tbps"] * 1e3)
    assert out.with_suffix(".png").stat().st_size > 0


def test_floors_are_the_formula_on_the_models_weights(smoke):
    """P counted from the built model's own weight matrices (not the formula's terms), then the docstring's floors."""
    record, _, _ = smoke
    config = bench_model.model_script.preset_config("tiny")
    config.num_hidden_layers = LAYERS
    model = transformers.AutoModelForCausalLM.from_config(config)
    P = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    assert record["model"]["params_per_token"] == P
    d, V, L = config.hidden_size, config.vocab_size, config.num_hidden_layers
    H, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    flops = 2 * P * SEQ + 2 * V * d + L * 4 * H * SEQ * SEQ * hd / 2  # causal attention: half the scores
    weights = 2 * (P + model.lm_head.weight.numel())  # bf16
    kv_cache = 2 * 2 * L * kv * SEQ * hd
    prefill, decode = record["shapes"]
    assert (prefill["flops"], decode["bytes"], decode["kv_cache_bytes"]) == (flops, weights + kv_cache, kv_cache)
    assert prefill["floor_us"] == pytest.approx(flops / record["ceiling_tflops"] / 1e6)
    assert decode["floor_us"] == pytest.approx((weights + kv_cache) / record["copy_tbps"] / 1e6)
    rows = [line.split(" | ")[:2] for line in bench_model.markdown(record).splitlines()[2:] if line.startswith("| ")]
    assert rows == [["| eager", "eager"], ["| compile", "eager"]]


@pytest.mark.parametrize("layers", [2, 3])
def test_floor_counts_grow_with_the_layers(layers):
    """The smoke run has one layer, where a count that forgets the layers is still right: costs() at 2 and 3 layers,
    batch 3, against the built model's own weights."""
    config = bench_model.model_script.preset_config("tiny")
    config.num_hidden_layers = layers
    model = transformers.AutoModelForCausalLM.from_config(config)
    P = sum(p.numel() for n, p in model.named_parameters() if ".layers." in n and p.dim() == 2)
    head = model.lm_head.weight.numel()
    H, kv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    batch, seq = 3, 20
    scores = layers * batch * 4 * H * seq * seq * hd / 2  # QK^T and PV, causal: half the scores
    kv_cache = 2 * layers * batch * kv * seq * hd  # K and V entries; x 2 bytes below
    assert bench_model.costs(config, batch, seq, 2) == {
        "params_per_token": P, "prefill_flops": 2 * P * batch * seq + 2 * head * batch + scores,
        "decode_bytes": 2 * (P + head + kv_cache), "weight_bytes": 2 * (P + head), "kv_cache_bytes": 2 * kv_cache}


def test_wrong_variant_stops_the_run_and_writes_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "b.json"
    out.write_text("an earlier record\n")
    real = bench_model.executed

    def executed(model, execution):  # "compile" is the eager model with its logits off by half
        forward = real(model, "eager")
        if execution == "eager":
            return forward

        def wrong(**kw):
            result = forward(**kw)
            result.logits = result.logits * 1.5
            return result
        return wrong

    monkeypatch.setattr(bench_model, "executed", executed)
    assert bench_model.main(["--device", "cpu", "--seq", "16", "--exec", "eager,compile", "--mlp", "eager",
                             "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("bench_model.py: wrong result") and "compile / eager prefill" in err
    assert out.read_text() == "an earlier record\n" and sorted(p.name for p in tmp_path.iterdir()) == ["b.json"]


@pytest.mark.parametrize("flags", [["--exec", "eager,jit"], ["--mlp", ""], ["--seq", "1"], ["--layers", "0"],
                                   ["--device", "tpu"], ["--preset", "gemma-7b"], ["--dtype", "fp8"]])
def test_bad_flags_one_line_exit_2(flags, capsys):
    with pytest.raises(SystemExit) as done:
        bench_model.parse_args(flags)
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("bench_model.py: ")


def test_seq_past_the_positions_and_no_gpu_one_line_exit_2(tmp_path, capsys, monkeypatch):
    out = tmp_path / "b.json"
    assert bench_model.main(["--device", "cpu", "--seq", "4096", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_model.py: --seq 4096 is longer") and len(err.strip().splitlines()) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_model.main(["--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_model.py needs a CUDA GPU") and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_run_writes_record(tmp_path):
    out = tmp_path / "b.json"
    assert bench_model.main(["--layers", "1", "--seq", "128", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["device"] == torch.cuda.get_device_name() and record["model"]["preset"] == "gemma-2b"
    prefill, decode = record["shapes"]
    assert {"eager / eager", "compile / eager", "eager / fused", "compile / fused"} <= set(prefill["variants"])
    assert {"cuda-graphs / eager", "cuda-graphs / fused"} <= set(decode["variants"])
    for shape in record["shapes"]:
        assert all("liger" in name for name in shape["skipped"])  # only a missing liger-kernel may skip a row
        for v in shape["variants"].values():
            assert v["rel_err"] <= common.TOLERANCE[torch.bfloat16]
            # A floor: nothing runs much faster (a pure read may beat a copy's read + write rate a little);
            # a unit slip in a floor (x 1000) would show here.
            assert 0 < v["of_floor"] <= 1.2
        # Every other MLP's row is paired with transformers' MLP's row of the same execution, round by round.
        for name, v in shape["variants"].items():
            execution, mlp = name.split(" / ")
            if mlp == "eager":
                assert "vs_eager_mlp" not in v
            else:
                partner = shape["variants"][f"{execution} / eager"]["rounds_us"]
                ratios = sorted(a / b for a, b in zip(partner, v["rounds_us"]))
                assert v["paired_rounds"] == bench_model.ROUNDS == len(v["rounds_us"])
                assert v["vs_eager_mlp"] == ratios[len(ratios) // 2]
                assert v["faster_rounds"] == sum(r > 1 for r in ratios)


# --- the pairing against transformers' MLP, on hand-made rounds -----------------------------------------------------

def test_paired_is_the_middle_per_round_ratio_and_the_rounds_faster():
    # Round by round: 10/8 = 1.25, 10/10 = 1 (a tie is not faster), 12/15 = 0.8, 20/16 = 1.25, 9/10 = 0.9.
    # Sorted 0.8, 0.9, 1, 1.25, 1.25: the middle is 1; faster in 2 of 5. The rows' own medians (10 and 10) would say
    # nothing; a ratio of medians would be 1 as well, but rounds 1 and 4 (each 1.25) are where it won.
    assert bench_model.paired([10, 10, 12, 20, 9], [8, 10, 15, 16, 10]) == {
        "vs_eager_mlp": 1.0, "faster_rounds": 2, "paired_rounds": 5}
    # A slow spell of the host (rounds 3 and 4 twice as slow on both sides) leaves the ratio where it was.
    steady = bench_model.paired([100, 100, 100, 100], [90, 90, 90, 90])
    spell = bench_model.paired([100, 100, 200, 200], [90, 90, 180, 180])
    assert steady["vs_eager_mlp"] == spell["vs_eager_mlp"] == pytest.approx(100 / 90)
    assert steady["faster_rounds"] == spell["faster_rounds"] == 4


def test_versus_is_said_only_where_there_is_a_pair():
    assert bench_model.versus({"vs_eager_mlp": 1.034, "faster_rounds": 11, "paired_rounds": 15}) == "1.03x 11/15"
    assert bench_model.versus({"vs_eager_mlp": 0.996, "faster_rounds": 0, "paired_rounds": 15}) == "1.00x 0/15"
    assert bench_model.versus({"median_us": 5.0}) == ""  # transformers' MLP's own row, or a record from before


def test_bench_phase_pairs_each_mlp_with_the_same_executions_eager_mlp(monkeypatch):
    table = {"eager / eager": [100.0, 300.0, 100.0], "eager / fused": [90.0, 330.0, 80.0],
              "compile / eager": [50.0, 50.0, 50.0], "compile / fused": [60.0, 40.0, 40.0],
              "cuda-graphs / fused": [10.0, 10.0, 10.0]}  # no cuda-graphs / eager row: nothing to pair with
    seen = {}
    monkeypatch.setattr(bench_model, "check", lambda phase, calls, skipped, ref, tol: {n: 0.0 for n in calls})
    groups = []

    def timed(calls, rounds, rep_ms):
        seen.update(rounds=rounds, rep_ms=rep_ms)
        groups.append(sorted(calls))
        return {n: table[n] for n in calls}
    monkeypatch.setattr(bench_model.bench, "time_interleaved", timed)
    out = bench_model.bench_phase("decode", dict.fromkeys(table), {}, None, 50.0, 1, 0.1, cuda=True)
    assert seen == {"rounds": bench_model.ROUNDS, "rep_ms": bench_model.REP_MS}
    # each execution's rows interleaved among themselves: a CUDA-graph step never timed after a host-bound one
    assert groups == [["eager / eager", "eager / fused"], ["compile / eager", "compile / fused"],
                      ["cuda-graphs / fused"]]
    # eager / fused: 100/90 = 1.11, 300/330 = 0.91, 100/80 = 1.25 -> middle 1.11, faster in 2 of 3
    assert out["eager / fused"]["vs_eager_mlp"] == pytest.approx(100 / 90) and out["eager / fused"]["faster_rounds"] == 2
    # compile / fused: 50/60 = 0.83, 50/40 = 1.25, 1.25 -> middle 1.25, faster in 2 of 3
    assert out["compile / fused"]["vs_eager_mlp"] == 1.25 and out["compile / fused"]["faster_rounds"] == 2
    assert out["eager / fused"]["median_us"] == 90.0  # the row's own middle round, unchanged by the pairing
    for name in ("eager / eager", "compile / eager", "cuda-graphs / fused"):
        assert "vs_eager_mlp" not in out[name]


def test_the_tables_show_the_pairing():
    v = {"execution": "eager", "mlp": "fused", "median_us": 2000.0, "rounds_us": [1900.0, 2000.0, 2100.0],
         "rel_err": 0.01, "of_floor": 0.25, "ms_per_token": 2.0, "vs_eager_mlp": 1.034, "faster_rounds": 2,
         "paired_rounds": 3}
    e = {"execution": "eager", "mlp": "eager", "median_us": 2068.0, "rounds_us": [2068.0] * 3, "rel_err": 0.0,
         "of_floor": 0.24, "ms_per_token": 2.068}
    phase = {"phase": "decode", "label": "x", "bound": "memory", "floor_us": 500.0, "flops": 1.0, "bytes": 1e6,
             "weight_bytes": 1e6, "kv_cache_bytes": 0.0, "variants": {"eager / eager": e, "eager / fused": v},
             "skipped": {}}
    lines = bench_model.format_phase(phase).splitlines()
    assert lines[2].endswith("vs eager MLP")
    assert lines[3].endswith("0.0e+00") and lines[4].endswith("1.0e-02  1.03x 2/3")
    pre = dict(phase, phase="prefill", variants={"eager / eager": dict(e, tokens_per_s=1000.0),
                                                 "eager / fused": dict(v, tokens_per_s=1034.0)})
    record = {"shapes": [pre, phase], "model": {"preset": "p", "layers": 1, "batch": 1, "seq": 2},
              "ceiling_tflops": 700.0, "copy_tbps": 4.0, "dtype": "bf16", "device": "d", "torch": "t",
              "transformers": "x"}
    rows = bench_model.markdown(record).splitlines()
    assert rows[0] == bench_model.TABLE_HEADER and rows[1] == "| --- " * 6 + "|"
    assert rows[2] == "| eager | eager | 1,000 (0.24) | 2.068 (0.24) | — | — |"
    assert rows[3] == "| eager | fused | 1,034 (0.25) | 2.000 (0.25) | 1.03x 2/3 | 1.03x 2/3 |"
