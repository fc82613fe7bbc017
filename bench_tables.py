"""bench.py's printed tables, from its JSON record alone: a shape's table, the summary, the page's markdown table,
and the comparison they share (fused against the best other variant, beyond the rounds' spread). Apart from bench.py,
which times on a GPU, so that the tables of committed records are read and tested on any machine (bench.py
re-exports every name)."""

MLP_NAMES = {"gelu_tanh": "GeGLU", "silu": "SwiGLU"}  # by fused_geglu.ACTIVATIONS (imported on a GPU: needs Triton)


def spread(v):
    """(slowest - fastest round) / median: the noise a difference has to beat."""
    return (max(v["rounds_us"]) - min(v["rounds_us"])) / v["median_us"]


def fused_vs_best(r):
    """(best other variant's name, its µs / fused µs, True when fused is slower beyond both spreads)."""
    others = {k: v for k, v in r["variants"].items() if k != "fused"}
    best = min(others, key=lambda k: others[k]["median_us"])
    fused = r["variants"]["fused"]
    ratio = others[best]["median_us"] / fused["median_us"]
    return best, ratio, ratio < 1 - max(spread(fused), spread(others[best]))


def shape_lines(r, ceiling, bandwidth):
    """One shape's table: every variant's time, spread, fraction of the floor and error; host time; the parts."""
    swiglu = " SwiGLU" if r.get("activation") == "silu" else ""  # records before SwiGLU: GeGLU, and no word
    lines = [f"\nM={r['M']} dim={r['dim']} hidden={r['hidden']}{swiglu}: {r['flops'] / 1e9:.1f} GFLOP, "
             f"{r['bytes'] / 1e6:.0f} MB; floor {r['floor_us']:.1f} µs, {r['bound']}-bound (compute "
             f"{r['floor_compute_us']:.1f} µs at {ceiling:.0f} TFLOP/s, memory {r['floor_memory_us']:.1f} µs at "
             f"{bandwidth:.2f} TB/s)",
             f"  {'variant':<14}{'µs':>9}{'spread':>8}{'TFLOP/s':>9}{'of floor':>10}{'vs eager':>10}"
             f"{'graph µs':>10}{'of floor':>10}{'rel err':>10}"]
    eager_us = r["variants"]["eager"]["median_us"]
    for name, v in r["variants"].items():
        us = v["median_us"]
        graph = (f"{v['graph_median_us']:10.1f}{r['floor_us'] / v['graph_median_us']:10.2f}"
                 if "graph_median_us" in v else f"{'-':>10}{'-':>10}")
        lines.append(f"  {name:<14}{us:9.1f}{spread(v):8.1%}{r['flops'] / us / 1e6:9.0f}{r['floor_us'] / us:10.2f}"
                     f"{eager_us / us:9.2f}x{graph}{v['rel_err']:10.1e}")
    if "host_us" in r["variants"]["fused"]:
        lines.append("  host µs per call (enqueued, not waited for): "
                     + ", ".join(f"{name} {v['host_us']:.1f}" for name, v in r["variants"].items()))
    if all("held_bytes" in v for v in r["variants"].values()):
        lines.append("  MB held after the first call, beyond the parameters: "
                     + ", ".join(f"{name} {v['held_bytes'] / 1e6:.2f}" for name, v in r["variants"].items()))
    lines += [f"  skipped: {note}" for note in r["skipped"]]
    if "fused_gate_up_gemms" in r:  # records before the packing rows have no such line
        lines.append(f"  fused path: {r['fused_path']}" + {None: "", 1: " (gate and up: one GEMM over the packed weights)",
                                                            2: " (gate and up: two GEMMs)"}[r["fused_gate_up_gemms"]])
    best, ratio, slower = fused_vs_best(r)
    lines.append(f"  fused vs best of the others ({best}): {ratio:.2f}x{' SLOWER beyond the spread' if slower else ''}")
    gemm_flops = 2 * r["M"] * r["dim"] * r["hidden"]
    for name, us in r["parts"].items():
        n_gemms = 1 if "down" in name else 2
        lines.append(f"  part (graph): {name:<24}{us:9.1f} µs{n_gemms * gemm_flops / us / 1e6:8.0f} TFLOP/s")
    return lines


def summary_lines(results):
    """One line per shape: the floor, every variant's µs, and how the fused MLP stands against the best other."""
    names = ["eager", "compile", "max-autotune", "liger", "fused"]
    lines = [f"\n{'shape':<18}{'bound':>8}{'floor':>9}" + "".join(f"{n:>14}" for n in names)
             + f"{'fused vs best':>15}{'of floor':>10}"]
    for r in results:
        cells = "".join(f"{r['variants'][n]['median_us']:14.1f}" if n in r["variants"] else f"{'-':>14}"
                        for n in names)
        best, ratio, slower = fused_vs_best(r)
        shape = f"{r['M']}x{r['dim']}x{r['hidden']}"
        lines.append(f"{shape:<18}{r['bound']:>8}{r['floor_us']:9.1f}{cells}"
                     f"{ratio:14.2f}x{r['floor_us'] / r['variants']['fused']['median_us']:10.2f}"
                     f"{'  SLOWER than ' + best if slower else ''}")
    return lines


def ceilings_line(record):
    return (f"{record['device']}: {record['dtype']} 8192^3 matmul {record['ceiling_tflops']:.0f} TFLOP/s, "
            f"1 GiB copy {record['copy_tbps']:.2f} TB/s (the ceilings)")


def table_text(record):
    """The whole printed table of a record (what bench.py writes next to it as .txt)."""
    lines = [ceilings_line(record)]
    for r in record["shapes"]:
        lines += shape_lines(r, record["ceiling_tflops"], record["copy_tbps"])
    return "\n".join(lines + summary_lines(record["shapes"])) + "\n"


def markdown_table(record, path="results/bench_h200.json"):
    """A page's benchmark table, from the record this script wrote at path (tests/test_readme.py checks they
    agree)."""
    names = ["eager", "compile", "max-autotune", "liger"]
    lines = [f"Measured on {record['date'][:10]} on an {record['device']} (torch {record['torch']}, triton "
             f"{record['triton']}, CUDA {record['cuda']}, liger-kernel {record['liger_kernel']}, {record['dtype']}"
             f"{', the ' + MLP_NAMES['silu'] + ' MLP' if record.get('activation') == 'silu' else ''}); "
             f"ceilings {record['ceiling_tflops']:.0f} TFLOP/s (GEMM) and {record['copy_tbps']:.2f} TB/s (copy). "
             f"µs, median of {len(record['shapes'][0]['variants']['eager']['rounds_us'])} rounds; full record: `{path}` and `.txt`.", "",
             "| M×dim→hidden | floor (bound) | eager | compile | max-autotune | Liger | fused (of floor) "
             "| fused vs best other | GPU time alone (graph): fused vs best other (fused of floor) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in record["shapes"]:
        v = r["variants"]
        fused = v["fused"]["median_us"]
        best, ratio, slower = fused_vs_best(r)
        graph = "-"
        if "graph_median_us" in v["fused"]:
            g = v["fused"]["graph_median_us"]
            g_best = min(o["graph_median_us"] for k, o in v.items() if k != "fused" and "graph_median_us" in o)
            graph = f"{g:.1f} vs {g_best:.1f} ({r['floor_us'] / g:.2f})"
        post = " (the post's)" if (r["M"], r["dim"], r["hidden"]) == (8192, 768, 3072) else ""
        cells = " | ".join(f"{v[n]['median_us']:.1f}" if n in v else "-" for n in names)
        lines.append(f"| {r['M']}×{r['dim']}→{r['hidden']}{post} | {r['floor_us']:.1f} µs ({r['bound']}) | {cells} "
                     f"| **{fused:.1f}** ({r['floor_us'] / fused:.2f}) "
                     f"| {ratio:.2f}×{' (slower: ' + best + ')' if slower else ''} | {graph} |")
    return "\n".join(lines) + "\n"
