"""tune_fused.py's choices from made-up timings (the sweep itself needs a GPU)."""

import json

import pytest

import tune_fused  # imports Triton only inside main, on the GPU machine


def _key(which, kernel, cfg=None):
    return which, kernel, json.dumps(cfg)


def test_choice_is_the_lowest_geometric_mean_against_torch():
    a, b = _key("geglu", "small", {"BM": 16}), _key("geglu", "tma", {"BM": 128})
    torch_ = _key("geglu", "torch")
    # Two widths: a is 0.5x then 1.5x of torch (geomean 0.866), b 0.9x both times (0.9): a wins though it loses once.
    per_width = [{torch_: 100.0, a: 50.0, b: 90.0}, {torch_: 10.0, a: 15.0, b: 9.0}]
    best, score = tune_fused.choose(per_width, "geglu")
    assert best == a and score == pytest.approx((0.5 * 1.5) ** 0.5)
    # Torch itself scores 1.0: where every kernel is slower, the table says torch.
    slow = [{torch_: 10.0, a: 11.0, b: 12.0}]
    assert tune_fused.choose(slow, "geglu") == (torch_, 1.0)


def test_where_torch_wins_the_row_also_names_the_best_fused_candidate():
    """fused_only leaves torch out: the best of the kernels by the same geometric mean (b: 1.1 x 1.2 -> 1.149 against
    a's 1.3 x 1.05 -> 1.168), which bucket_rows writes as the row's "fused"; a row a kernel won has none."""
    a, b, torch_ = _key("geglu", "tma", {"BM": 64}), _key("geglu", "tma", {"BM": 128}), _key("geglu", "torch")
    per_width = [{torch_: 100.0, a: 130.0, b: 110.0}, {torch_: 10.0, a: 10.5, b: 12.0}]
    assert tune_fused.choose(per_width, "geglu") == (torch_, 1.0)
    best, score = tune_fused.choose(per_width, "geglu", fused_only=True)
    assert best == b and score == pytest.approx((1.1 * 1.2) ** 0.5)
    assert tune_fused.choose([{torch_: 1.0}], "geglu", fused_only=True) == (None, None)
    down = {_key("down", "torch"): 5.0}
    geglu, _ = tune_fused.bucket_rows([{**t, **down} for t in per_width], [(768, 3072), (768, 3072)], 256)
    assert geglu == [{"max_m": 256, "max_k": None, "kernel": "torch", "config": None, "vs_torch": 1.0,
                      "fused": {"kernel": "tma", "config": {"BM": 128}, "vs_torch": round((1.1 * 1.2) ** 0.5, 3)}}]
    per_width[0][a] = 50.0  # a: 0.5 x 1.05 -> 0.725, under torch: a row of its own, no "fused"
    geglu, _ = tune_fused.bucket_rows([{**t, **down} for t in per_width], [(768, 3072), (768, 3072)], 256)
    assert geglu[0]["kernel"] == "tma" and geglu[0]["config"] == {"BM": 64} and "fused" not in geglu[0]


def test_the_committed_table_is_its_own_measurements_chosen_by_the_rule():
    """fused_geglu_tuned.json's kernel rows, and the fused kernel named where torch won, follow from the times it
    records (rows_from_measured: the tuner's rule, no GPU); vs_torch to its rounding (the times are kept to 0.01
    µs). At 384 tokens of width 4096 the fused row is the TMA kernel's 128 x 128 tile with two dots: the default
    tile (ONE_DOT) took 458.6 µs there against 155.8."""
    record = json.loads((tune_fused.Path(tune_fused.__file__).with_name("fused_geglu_tuned.json")).read_text())
    geglu, down = tune_fused.rows_from_measured(record)
    for mine, want in zip(record["geglu"] + record["down"], geglu + down, strict=True):
        assert {k: v for k, v in mine.items() if k != "vs_torch"} == {k: v for k, v in want.items() if k != "vs_torch"}
        assert mine["vs_torch"] == pytest.approx(want["vs_torch"], abs=0.002)
    if "geglu_narrow" in record:  # the MoE experts' rows, by the same rule from their own measurements
        narrow = tune_fused.narrow_from_measured(record)
        for mine, want in zip(record["geglu_narrow"], narrow, strict=True):
            assert {k: v for k, v in mine.items() if k != "vs_torch"} == {k: v for k, v in want.items()
                                                                         if k != "vs_torch"}
            assert mine["vs_torch"] == pytest.approx(want["vs_torch"], abs=0.002)
    row = next(r for r in record["geglu"] if r["max_m"] == 384 and r["max_k"] is None)
    assert row["kernel"] == "torch" and row["fused"]["kernel"] == "tma"
    assert row["fused"]["config"]["BM"] == row["fused"]["config"]["BN"] == 128 and not row["fused"]["config"]["ONE_DOT"]
    us = next(m["us"] for m in record["measured"] if (m["M"], m["dim"], m["hidden"]) == (384, 4096, 14336))
    assert us["geglu tma " + json.dumps(row["fused"]["config"])] == 155.79


def test_a_candidate_missing_at_one_width_is_not_chosen():
    a, torch_ = _key("geglu", "small", {"BM": 16}), _key("geglu", "torch")
    per_width = [{torch_: 100.0, a: 10.0}, {torch_: 100.0}]  # a failed (left out) at the second width
    assert tune_fused.choose(per_width, "geglu")[0] == torch_


@pytest.mark.parametrize("M", tune_fused.BUCKETS)
def test_candidates_fit_a_hopper_sm(M):
    """Every tile asked for fits 227 KB of shared memory: stages of the x, gate and up tiles (bf16), and the TMA
    kernel's output tile; torch is always there to compare with."""
    cands = tune_fused.geglu_candidates(M)
    assert ("torch", None) in cands and len(cands) <= 14  # each ~30 ms of timing and a compile: the sweep stays minutes
    for kernel, cfg in cands:
        if kernel == "torch":
            continue
        stage = (cfg["BM"] + 2 * cfg["BN"]) * cfg["BK"] * 2
        epilogue = cfg["BM"] * cfg["BN"] * 2 if kernel == "tma" else 0
        if cfg.get("ONE_DOT"):  # the interleaved weight tile is staged in shared memory once more
            epilogue += 2 * cfg["BN"] * cfg["BK"] * 2
        assert cfg["num_stages"] * stage + epilogue <= 227 * 1024, (kernel, cfg)
        if kernel == "small":
            assert cfg["BM"] >= min(M, 128) or cfg["BM"] == 128  # one row tile holds M up to 128
    assert tune_fused.down_candidates(M)[0] == ("torch", None)


def test_without_a_gpu_one_line_and_exit_2(capsys, monkeypatch):
    monkeypatch.setattr(tune_fused.torch.cuda, "is_available", lambda: False)
    assert tune_fused.main([]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err


def test_k_classes_split_at_the_geometric_middles():
    # dims 768, 2304, 4096 (twice): tops isqrt(768 * 2304) = 1330, isqrt(2304 * 4096) = 3072, then open-ended
    widths = [(4096, 11008), (768, 3072), (2304, 9216), (4096, 14336)]
    assert tune_fused.k_classes(widths) == [(1330, [1]), (3072, [2]), (None, [0, 3])]
    assert tune_fused.k_classes([(64, 128)]) == [(None, [0])]
    # all: 768, 2048, 2304, 3584, 4096: sqrt(768 * 2048) = 1254.1, sqrt(2048 * 2304) = 2172.2, sqrt(2304 * 3584) = 2873.6,
    # sqrt(3584 * 4096) = 3831.4
    assert [top for top, _ in tune_fused.k_classes(tune_fused.WIDTHS["all"])] == [1254, 2172, 2873, 3831, None]


def test_down_classes_go_by_the_input_width_hidden():
    """DOWN_WIDTHS' hidden sizes 3072, 9216, 11008, 13824, 14336, 16384, 18944, 28672: tops at the geometric
    middles, isqrt(3072 * 9216) = 5320, isqrt(9216 * 11008) = 10072, ..., isqrt(18944 * 28672) = 23305."""
    assert [top for top, _ in tune_fused.k_classes(tune_fused.DOWN_WIDTHS, at=1)] == [
        5320, 10072, 12335, 14077, 15325, 17617, 23305, None]
    assert tune_fused.k_classes([(4096, 14336), (8192, 14336), (768, 3072)], at=1) == [(6636, [2]), (None, [0, 1])]


def test_the_written_table_is_what_fused_geglu_reads(monkeypatch, tmp_path):
    """main() end to end with made-up timings (no GPU here): at M <= 8 the first small-M candidate is fastest;
    up to 256 torch; past it the first TMA candidate, except at dim 4096 from M = 4096 on, where torch is
    (the epilogue's saving is smaller there); at the MoE experts' widths (hidden < dim) the TMA tiles never win.
    fused_geglu reads the file back and picks the same, by M, by K, and by whether hidden < dim."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")

    def made_up(fg, M, dim, hidden, dtype, tol, down=True):
        times = {_key("geglu", k, c): 100.0 for k, c in tune_fused.geglu_candidates(M)}
        times.update({_key("down", k, c): 50.0 for k, c in tune_fused.down_candidates(M)} if down else {})
        winner = next(((k, c) for k, c in tune_fused.geglu_candidates(M) if k == ("small" if M <= 8 else "tma")),
                      None)
        if winner and not 8 < M <= 256 and (hidden >= dim or M <= 8):
            times[_key("geglu", *winner)] = 80.0 if dim < 4096 or M < 4096 else 110.0
        return times

    monkeypatch.setattr(tune_fused, "time_candidates", made_up)
    monkeypatch.setattr(tune_fused, "time_down", _made_up_down)
    monkeypatch.setattr(tune_fused, "measure_packing", _made_up_packing)
    monkeypatch.setattr(tune_fused.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune_fused.torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(tune_fused.bench, "versions", lambda device: {"device": "a made-up GPU"})
    monkeypatch.setattr(fused_geglu.table, "tuned", {})
    out = tmp_path / "tuned.json"
    assert tune_fused.main(["--out", str(out)]) == 0
    monkeypatch.setattr(fused_geglu.table, "tuned", fused_geglu.table.load_tuned(out))
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    gpu = tune_fused.torch.device("cuda", 0)
    for M, K, want in [(1, 768, "small"), (8, 4096, "small"), (9, 768, "torch"), (256, 4096, "torch"),
                       (257, 768, "tma"), (257, 4096, "tma"), (2048, 5120, "tma"), (2049, 3072, "tma"),
                       (2049, 3073, "torch"), (20000, 768, "tma"), (20000, 8192, "torch")]:
        kernel, cfg = fused_geglu.table.by_m(gpu, M, "geglu", K)
        assert kernel == want, (M, K)
        if want != "torch":
            bucket = next(b for b in tune_fused.BUCKETS if M <= b) if M <= tune_fused.BUCKETS[-1] else 16384
            assert cfg == next(c for k, c in tune_fused.geglu_candidates(bucket) if k == want)
    # hidden < dim: the narrow rows (TMA never won there), by their own classes of K; hidden >= dim: the dense ones
    for M, K, N, want in [(1, 2048, 1408, "small"), (8, 7168, 2048, "small"), (257, 2048, 1408, "torch"),
                          (4096, 2048, 768, "torch"), (20000, 7168, 2048, "torch"), (257, 2048, 2048, "tma"),
                          (257, 2048, None, "tma"), (4096, 1000, 999, "torch")]:
        assert fused_geglu.table.by_m(gpu, M, "geglu", K, N)[0] == want, (M, K, N)
    # where torch won a narrow row, the scripts that show the kernel run the best fused candidate measured there
    assert fused_geglu.table.by_m(gpu, 4096, "fused", 2048, 768)[0] == "tma"
    record = json.loads(out.read_text())
    assert record["narrow_widths"] == [f"{d}x{h}" for d, h in tune_fused.NARROW_WIDTHS]
    assert tune_fused.narrow_from_measured(record) == record["geglu_narrow"]
    assert len(record["geglu_narrow"]) == len(tune_fused.BUCKETS) * len({d for d, _ in tune_fused.NARROW_WIDTHS})
    n_widths, n_classes = len(tune_fused.WIDTHS["models"]), len({d for d, _ in tune_fused.WIDTHS["models"]})
    assert len(record["measured"]) == len(tune_fused.BUCKETS) * n_widths
    assert len(record["geglu"]) == len(tune_fused.BUCKETS) * n_classes
    _check_down(fused_geglu, gpu, record)
    _check_packing(fused_geglu, gpu, record)


def _made_up_down(fg, M, dim, hidden, dtype, tol):
    """Made-up down_proj times: up to 8 tokens the first small candidate takes 40 µs against cuBLAS's 50 where the
    input is narrower than 13000, and 55 from there; every other candidate, and every other M, ties with cuBLAS."""
    times = {_key("down", k, c): 50.0 for k, c in tune_fused.down_candidates(M)}
    first = next(((k, c) for k, c in tune_fused.down_candidates(M) if k == "small"), None)
    if first and M <= 8:
        times[_key("down", *first)] = 40.0 if hidden < 13000 else 55.0
    return times


def _check_down(fused_geglu, gpu, record):
    """The down_proj rows fused_geglu reads back, by M and by its input width K (hidden): small up to 8 tokens for K
    up to isqrt(11008 * 13824) = 12335, cuBLAS from 12336 (the class of 13824) and beyond 8 tokens (ties: cuBLAS,
    listed first), and past the measured buckets."""
    small = [c for k, c in tune_fused.down_candidates(8) if k == "small"][0]
    for M, K, want in [(1, 3072, "small"), (8, 11008, "small"), (8, 12335, "small"), (8, 12336, "torch"),
                       (1, 14336, "torch"), (1, 29568, "torch"), (9, 3072, "torch"), (300, 3072, "torch")]:
        kernel, cfg = fused_geglu.table.by_m(gpu, M, "down", K)
        assert kernel == want, (M, K)
        assert cfg == (small if want == "small" else None)
    n_classes = len(tune_fused.DOWN_WIDTHS)  # one hidden each
    assert len(record["down_measured"]) == len(tune_fused.down_buckets()) * n_classes
    assert len(record["down"]) == len(tune_fused.down_buckets()) * n_classes + 1
    assert record["down_widths"] == [f"{d}x{h}" for d, h in tune_fused.DOWN_WIDTHS]
    assert tune_fused.down_from_measured(record) == record["down"]  # what a test checks the committed table by


def _made_up_packing(fg, record, dtype):
    """Made-up (packed µs, unpacked µs): packed 2% faster at every width from 96 tokens on, except 640 tokens of
    4096 -> 14336 (3% slower) and 3072 tokens of 2048 -> 16384 (0.4% slower: within the margin)."""
    pairs = {}
    for M in (96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024, 1536, 2048, 3072, 4096, 12288, 16384):
        for d, h in tune_fused.PACKING_WIDTHS:
            pairs[M, d, h] = (98.0, 100.0)
    pairs[640, 4096, 14336] = (103.0, 100.0)
    pairs[3072, 2048, 16384] = (100.4, 100.0)
    return pairs


def _check_packing(fused_geglu, gpu, record):
    """The packing rows fused_geglu reads back: two GEMMs for the class of K holding 4096 (3832..4579: isqrt(3584 *
    4096), isqrt(4096 * 5120)) at 640 tokens and between 640 and the measured Ms beside it (512, 768); packed everywhere
    else, and at 3072 tokens of width 2048 (0.4% slower: within the margin)."""
    for M, K, want in [(513, 4096, False), (639, 4000, False), (640, 3832, False), (641, 4579, False),
                       (767, 4096, False), (768, 4096, True), (512, 4096, True), (640, 3831, True), (640, 4580, True),
                       (3072, 2048, True), (1, 4096, True), (20000, 4096, True)]:
        assert fused_geglu.packs_gate_up(gpu, M, K) is want, (M, K)
    assert len(record["packing_measured"]) == 18 * len(tune_fused.PACKING_WIDTHS)
    row = next(r for r in record["packing"] if r["max_m"] == 640 and r["max_k"] == 4579)
    assert row == {"max_m": 640, "max_k": 4579, "packed": False, "worst_packed_vs_unpacked": 1.03}
    assert next(r for r in record["packing"] if r["max_m"] == 1)["worst_packed_vs_unpacked"] is None  # nothing measured


@pytest.mark.parametrize("pairs, want", [
    ([], (True, None)),  # cuBLAS does not run gate and up there: packing costs nothing
    ([(100.4, 100.0), (90.0, 100.0)], (True, 1.004)),  # 0.4% slower once: within the margin
    ([(100.6, 100.0), (90.0, 100.0)], (False, 1.006)),  # 0.6% slower once: two GEMMs, though faster on average
    ([(99.0, 100.0), (50.0, 100.0)], (True, 0.99))])
def test_packing_only_where_never_slower_beyond_the_margin(pairs, want):
    assert tune_fused.choose_packing(pairs) == want


def test_packing_is_measured_at_each_buckets_edge_and_middle():
    assert tune_fused.packing_ms()[:7] == [1, 4, 8, 20, 32, 48, 64]
    ms = tune_fused.packing_ms()
    assert ms[-5:] == [4096, 6144, 8192, 12288, 16384] and {320, 384, 448, 512, 640, 768, 896} <= set(ms)
    assert len(ms) == len(set(ms)) == 2 * len(tune_fused.BUCKETS) - 1  # bucket 1's middle is 1 itself


def test_packing_spans_between_two_measured_ms_take_both():
    assert tune_fused.packing_spans([1, 4, 5, 8]) == [(1, [1]), (3, [1, 4]), (4, [4]), (5, [5]), (7, [5, 8]),
                                                      (None, [8])]


def test_packing_only_keeps_the_kernel_rows(monkeypatch, tmp_path, capsys):
    """--packing-only rewrites the packing rows of the table at --out and nothing else of it; with no readable
    table there, one line and exit 2."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")
    monkeypatch.setattr(tune_fused.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune_fused.bench, "versions", lambda device: {"device": "a made-up GPU"})
    monkeypatch.setattr(tune_fused, "measure_packing", _made_up_packing)
    monkeypatch.setattr(fused_geglu.table, "tuned", {})
    out = tmp_path / "tuned.json"
    assert tune_fused.main(["--packing-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read the table's kernel rows" in err
    old = {"capability": "9.0", "device": "a made-up GPU", "geglu": [{"max_m": None, "kernel": "torch"}],
           "down": [{"max_m": None, "kernel": "torch"}], "measured": [{"M": 1}],
           "packing": [{"max_m": None, "max_k": None, "packed": False}]}
    out.write_text(json.dumps(old))
    assert tune_fused.main(["--packing-only", "--out", str(out)]) == 0
    new = json.loads(out.read_text())
    assert {k: new[k] for k in ("capability", "device", "geglu", "down", "measured")} == {
        k: old[k] for k in ("capability", "device", "geglu", "down", "measured")}
    assert new["packing"] != old["packing"] and new["date"]
    monkeypatch.setattr(fused_geglu.table, "tuned", fused_geglu.table.load_tuned(out))
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    _check_packing(fused_geglu, tune_fused.torch.device("cuda", 0), new)


def test_down_only_keeps_the_other_rows(monkeypatch, tmp_path, capsys):
    """--down-only rewrites the down_proj rows (and their measurements and rule) of the table at --out, and keeps
    its gate/up and packing rows; with no readable table there, one line and exit 2; it cannot go with
    --packing-only."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")
    monkeypatch.setattr(tune_fused.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune_fused.bench, "versions", lambda device: {"device": "a made-up GPU"})
    monkeypatch.setattr(tune_fused, "time_down", _made_up_down)
    monkeypatch.setattr(tune_fused, "measure_packing", lambda *a: pytest.fail("--down-only measured the packing"))
    monkeypatch.setattr(fused_geglu.table, "tuned", {})
    out = tmp_path / "tuned.json"
    assert tune_fused.main(["--down-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--down-only: cannot read the table's kernel rows" in err
    kept = {"capability": "9.0", "device": "a made-up GPU", "geglu": [{"max_m": None, "kernel": "torch"}],
            "measured": [{"M": 1}], "packing": [{"max_m": None, "max_k": None, "packed": False}]}
    out.write_text(json.dumps({**kept, "down": [{"max_m": None, "kernel": "torch"}]}))
    assert tune_fused.main(["--down-only", "--out", str(out)]) == 0
    new = json.loads(out.read_text())
    assert {k: new[k] for k in kept} == kept and "class of K (hidden)" in new["rule"]
    assert new["down_date"] and "date" not in new  # the table's own date stays its other rows
    assert new["down_device"] == "a made-up GPU"  # the GPU these rows were measured on, beside the table's
    monkeypatch.setattr(fused_geglu.table, "tuned", fused_geglu.table.load_tuned(out))
    monkeypatch.setattr(fused_geglu.machine, "INTERPRET", False)
    monkeypatch.setattr(fused_geglu.machine, "capability", lambda device: (9, 0))
    _check_down(fused_geglu, tune_fused.torch.device("cuda", 0), new)
    with pytest.raises(SystemExit):
        tune_fused.parse_args(["--down-only", "--packing-only"])


def test_narrow_only_keeps_the_other_rows(monkeypatch, tmp_path, capsys):
    """--narrow-only rewrites the MoE experts' rows (geglu_narrow, their measurements and widths) of the table at --out
    and keeps every other row and the table's date; with no readable table there, one line and exit 2."""
    fused_geglu = pytest.importorskip("fused_geglu", reason="needs Triton (Linux wheels only)")
    monkeypatch.setattr(tune_fused.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(tune_fused.bench, "versions", lambda device: {"device": "a made-up GPU"})
    monkeypatch.setattr(fused_geglu.table, "tuned", {})  # the tuner clears the table it measures around
    seen = []

    def made_up(fg, M, dim, hidden, dtype, tol, down=True):
        assert not down and hidden < dim  # gate/up only, at the narrow widths only
        seen.append((M, dim, hidden))
        return {_key("geglu", k, c): 100.0 for k, c in tune_fused.geglu_candidates(M)}

    monkeypatch.setattr(tune_fused, "time_candidates", made_up)
    for name in ("time_down", "measure_packing"):
        monkeypatch.setattr(tune_fused, name, lambda *a, name=name: pytest.fail(f"--narrow-only ran {name}"))
    out = tmp_path / "tuned.json"
    assert tune_fused.main(["--narrow-only", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--narrow-only: cannot read the table's kernel rows" in err
    kept = {"capability": "9.0", "date": "then", "geglu": [{"max_m": None, "kernel": "torch"}],
            "down": [{"max_m": None, "kernel": "torch"}], "packing": [{"max_m": None, "max_k": None, "packed": False}]}
    out.write_text(json.dumps(kept))
    assert tune_fused.main(["--narrow-only", "--out", str(out)]) == 0
    new = json.loads(out.read_text())
    assert {k: new[k] for k in kept} == kept and new["narrow_date"] and new["narrow_device"] == "a made-up GPU"
    assert len(seen) == len(tune_fused.BUCKETS) * len(tune_fused.NARROW_WIDTHS)
    assert {r["kernel"] for r in new["geglu_narrow"]} == {"torch"}  # ties go to torch, listed first
