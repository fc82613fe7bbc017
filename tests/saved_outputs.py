"""What the reader prints for every committed trace, kept as hashes: a re-layout must not change a byte.

The cases: every committed trace (tests/data/**/*.json.gz), plain and --json; a script's --expect on each trace of
that script; the comparisons the tests and docs make; every distributed run's ranks merged. Each case's exit code,
stdout and stderr are hashed together; tests/data/saved_outputs.json holds the hashes, and the Python they were made
with. Under another Python the JSON's last digits may differ (3.12's sum() of floats is compensated: 0.4868586892052196
becomes 0.48685868920521946), so there a second hash is compared: of the same output, its JSON's floats rounded to 12
significant digits.

    uv run python tests/saved_outputs.py --write   # after a change meant to alter what the reader prints

Run in-process (inspect_trace.main with stdout and stderr captured): about a second a case in a subprocess, a
tenth of that here.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
SAVED = DATA / "saved_outputs.json"

# A committed trace's stem -> the script whose guesses --expect checks on it (the first pattern that matches).
EXPECT_OF = [
    ("h200_matmul_add", "01_matmul_add"), ("h200_linear", "02_linear"), ("h200_mlp", "03_simple_mlp"),
    ("h200_liger", "03_kernels_mlp"), ("h200_fused", "04_fused_mlp"), ("h200_model", "06_model"),
    ("train/", "07_train_step"), ("train_foreign/", "07_train_step"), ("foreign/h200_foreign_mlp_train", "07_train_step"),
    ("foreign/h200_foreign_llama2_train", "07_train_step"), ("foreign/", "03_simple_mlp"), ("tp/", "08_tensor_parallel"),
    ("dist/", "09_data_parallel"),
]
EXPECT_JSON = ["h200_matmul_add_64_eager", "h200_mlp_eager", "h200_model_decode_eager", "train/h200_train_mlp4_memory",
               "train_foreign/cpu_fsdp_rank0", "tp/h200_tp1_64x128x768x3072_eager_rank0", "dist/cpu_ddp_slow1_rank1"]
# Pairs compared (A B), relative to tests/data.
PAIRS = [
    ("h200_mlp_eager", "h200_mlp_compile"), ("h200_mlp_eager", "h200_fused_eager"), ("h200_mlp_eager", "h200_liger"),
    ("h200_fused_eager", "h200_liger"), ("h200_linear_eager", "h200_linear_compile"),
    ("h200_matmul_add_64_eager", "h200_matmul_add_64_compile"),
    ("h200_matmul_add_4096_warm_eager", "h200_matmul_add_4096_warm_compile"),
    ("h200_model_decode_eager", "h200_model_decode_compile"), ("h200_model_decode_eager", "h200_model_decode_cudagraphs"),
    ("h200_model_decode_eager", "h200_model_decode_fused"), ("h200_model_prefill_eager", "h200_model_prefill_fused"),
    ("h200_attention_math", "h200_attention_sdpa"), ("h200_attention_sdpa", "h200_attention_flex"),
    ("foreign/h200_foreign_gpt2_eager", "foreign/h200_foreign_gpt2_sdpa"),
    ("foreign/h200_foreign_llama4_prefill_eager", "foreign/h200_foreign_llama4_prefill_sdpa"),
    ("foreign/h200_foreign_mlp_eager", "foreign/h200_foreign_mlp_autotune"),
    ("train/h200_train_mlp_forloop", "train/h200_train_mlp_foreach"), ("train/h200_train_mlp_forloop", "train/h200_train_mlp_compile"),
    ("train/h200_train_mlp_forloop", "train/h200_train_mlp_fused"),
    ("dist_compare/cpu_single", "dist_compare/cpu_ddp_rank0"), ("dist_compare/cpu_ddp_rank0", "dist_compare/cpu_fsdp2_rank0"),
    ("train_foreign/cpu_accum", "train_foreign/cpu_ddp_accum_rank0"),
    ("tp/h200_tp1_64x128x768x3072_eager_rank0", "tp/h200_tp1_64x128x768x3072_fused_eager_rank0"),
]


def traces() -> list[str]:
    """Every committed trace, relative to tests/data, without .json.gz."""
    return sorted(str(p.relative_to(DATA))[: -len(".json.gz")] for p in DATA.rglob("*.json.gz"))


def rank_runs() -> list[str]:
    """Each distributed run's rank files, as a glob of stems: tests/data/dist/<run>_rank<N>."""
    runs = {t.rsplit("_rank", 1)[0] for t in traces() if t.startswith("dist/") and "_rank" in t}
    return sorted(r for r in runs if sum(t.startswith(r + "_rank") for t in traces()) > 1)


def expect_script(stem: str) -> str | None:
    return next((script for pattern, script in EXPECT_OF if pattern in stem), None)


def cases() -> dict[str, list[str]]:
    """Case name -> inspect_trace.py's arguments."""
    path = {t: str(DATA / f"{t}.json.gz") for t in traces()}
    out: dict[str, list[str]] = {}
    for t in traces():
        out[f"plain {t}"] = [path[t]]
        out[f"json {t}"] = ["--json", path[t]]
        script = expect_script(t)
        if script:
            out[f"expect {script} {t}"] = ["--expect", script, path[t]]
    for t in EXPECT_JSON:  # the verdicts are the plain case's: their JSON form for one trace of each kind
        out[f"expect-json {expect_script(t)} {t}"] = ["--json", "--expect", expect_script(t), path[t]]
    for a, b in PAIRS:
        out[f"compare {a} {b}"] = [path[a], path[b]]
        out[f"compare-json {a} {b}"] = ["--json", path[a], path[b]]
    for run in rank_runs():
        files = [path[t] for t in traces() if t.startswith(run + "_rank")]
        out[f"ranks {run}"] = files
        out[f"ranks-json {run}"] = ["--json", *files]
    out["plain full-names all-steps h200_mlp_eager"] = ["--full-names", "--all-steps", path["h200_mlp_eager"]]
    return out


def run(args: list[str]) -> tuple[str, str]:
    """The hashes of one case: exit code, stdout and stderr, as printed and portable (see the docstring)."""
    sys.path.insert(0, str(ROOT))
    import inspect_trace

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = inspect_trace.main(args)
    text = out.getvalue()
    try:
        portable = json.dumps(rounded(json.loads(text)), indent=1) + "\n"
    except ValueError:  # text, not JSON
        portable = text
    return tuple(hashlib.sha256(f"{code}\n{t}\n--stderr--\n{err.getvalue()}".replace(str(DATA), "DATA").encode()
                                ).hexdigest() for t in (text, portable))


def rounded(x):
    """x with every float at 12 significant digits."""
    if isinstance(x, float):
        return float(f"{x:.12g}")
    if isinstance(x, list):
        return [rounded(v) for v in x]
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    return x


def python() -> str:
    return "%d.%d" % sys.version_info[:2]


@functools.cache
def saved() -> dict:
    """{"python": the version that made them, "printed": {case: hash}, "portable": {case: hash}}."""
    return json.loads(SAVED.read_text())


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/saved_outputs.py --write")
    hashes = {name: run(args) for name, args in cases().items()}
    SAVED.write_text(json.dumps({"python": python(), "printed": {n: h[0] for n, h in sorted(hashes.items())},
                                 "portable": {n: h[1] for n, h in sorted(hashes.items())}}, indent=1) + "\n")
    print(f"wrote {SAVED.relative_to(ROOT)} ({len(cases())} cases)")
