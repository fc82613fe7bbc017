"""bench.py's printed tables, from its JSON record alone: a shape's table, the summary, the page's markdown table,
and the comparisons they share (fused against the best other variant, beyond the rounds' spread). Apart from bench.py,
which times on a GPU, so that the tables of committed records are read and tested on any machine (bench.py
re-exports every name).

Two kinds of record. One with "graph_every_row" (made since issue 57) has CUDA-graph replays and host µs at every
shape: its tables set fused against the best other by graph time (the GPU's time alone) and its host µs per call
against eager's. One without (the committed records before) has them at M <= 128 only: its tables compare the
times from Python, as they were printed then (the tests check that they still are, byte for byte)."""

MLP_NAMES = {"gelu_tanh": "GeGLU", "silu": "SwiGLU"}  # by fused_geglu.ACTIVATIONS (imported on a GPU: needs Triton)
ROUNDS_OF = {"median_us": "rounds_us", "graph_median_us": "graph_rounds_us", "host_us": "host_bursts_us"}
SLOWER = " SLOWER beyond the spread"


def spread(v, key="median_us"):
    """(slowest - fastest round) / median: the noise a difference has to beat. key: which time (its rounds are
    ROUNDS_OF[key]: the rounds from Python, of the graph replays, or the host's bursts)."""
    rounds = v[ROUNDS_OF[key]]
    return (max(rounds) - min(rounds)) / v[key]


def fused_vs_best(r, key="median_us"):
    """(best other variant's name, its µs / fused µs, True when fused is slower beyond both spreads). key
    "graph_median_us": by the graph replays, the best other the one whose graph time is the least."""
    others = {k: v for k, v in r["variants"].items() if k != "fused" and key in v}
    best = min(others, key=lambda k: others[k][key])
    fused = r["variants"]["fused"]
    ratio = others[best][key] / fused[key]
    return best, ratio, ratio < 1 - max(spread(fused, key), spread(others[best], key))


def host_vs_eager(r):
    """(eager's host µs per call / fused's, True when fused's is the longer beyond both bursts' spreads): >= 1.00
    where one fused forward takes the host no longer to enqueue than eager's."""
    eager, fused = r["variants"]["eager"], r["variants"]["fused"]
    ratio = eager["host_us"] / fused["host_us"]
    return ratio, ratio < 1 - max(spread(eager, "host_us"), spread(fused, "host_us"))


def shape_lines(r, ceiling, bandwidth, graphs=False):
    """One shape's table: every variant's time, spread, fraction of the floor and error; host time; the parts.
    graphs (a record with "graph_every_row"): fused against the best other as CUDA graphs, then as called from
    Python, then its host µs per call against eager's; else the one comparison from Python."""
    swiglu = " SwiGLU" if r.get("activation") == "silu" else ""  # records before SwiGLU: GeGLU, and no word
    lines = [f"\nM={r['M']} dim={r['dim']} hidden={r['hidden']}{swiglu}: {r['flops'] / 1e9:.1f} GFLOP, "
             f"{r['bytes'] / 1e6:.0f} MB; floor {r['floor_us']:.1f} µs, {r['bound']}-bound (compute "
             f"{r['floor_compute_us']:.1f} µs at {ceiling:.0f} TFLOP/s, memory {r['floor_memory_us']:.1f} µs at "
             f"{bandwidth:.2f} TB/s)",
             f"  {'variant':<14}{'µs':>9}{'spread':>8}{'TFLOP/s':>9}{'of floor':>10}{'vs eager':>10}"
             f"{'graph µs':>10}{'spread' if graphs else '':>{8 * graphs}}{'of floor':>10}{'rel err':>10}"]
    eager_us = r["variants"]["eager"]["median_us"]
    for name, v in r["variants"].items():
        us = v["median_us"]
        graph_spread = f"{spread(v, 'graph_median_us'):8.1%}" if graphs else ""  # what "SLOWER" is judged by
        graph = (f"{v['graph_median_us']:10.1f}{graph_spread}{r['floor_us'] / v['graph_median_us']:10.2f}"
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
    if graphs:
        for how, key in (("as CUDA graphs", "graph_median_us"), ("as called", "median_us")):
            best, ratio, slower = fused_vs_best(r, key)
            lines.append(f"  fused vs best of the others {how} ({best}): {ratio:.2f}x{SLOWER if slower else ''}")
        ratio, slower = host_vs_eager(r)
        lines.append(f"  fused vs eager, host µs per call (eager's / fused's): {ratio:.2f}x{SLOWER if slower else ''}")
    else:
        best, ratio, slower = fused_vs_best(r)
        lines.append(f"  fused vs best of the others ({best}): {ratio:.2f}x{SLOWER if slower else ''}")
    gemm_flops = 2 * r["M"] * r["dim"] * r["hidden"]
    for name, us in r["parts"].items():
        n_gemms = 1 if "down" in name else 2
        lines.append(f"  part (graph): {name:<24}{us:9.1f} µs{n_gemms * gemm_flops / us / 1e6:8.0f} TFLOP/s")
    return lines


def summary_lines(results, graphs=False):
    """One line per shape: the floor, every variant's µs, and how the fused MLP stands against the best other.
    graphs: the µs are the graph replays' (the GPU's time alone), and a last column sets eager's host µs per call
    against fused's."""
    names = ["eager", "compile", "max-autotune", "liger", "fused"]
    key = "graph_median_us" if graphs else "median_us"
    header = (f"{'shape':<18}{'bound':>8}{'floor':>9}" + "".join(f"{n:>14}" for n in names)
              + f"{'fused vs best':>15}{'of floor':>10}" + (f"{'host vs eager':>15}" if graphs else ""))
    lines = (["\nµs of CUDA-graph replays (the GPU's time alone); host vs eager: eager's host µs per call / fused's",
              header] if graphs else ["\n" + header])
    for r in results:
        cells = "".join(f"{r['variants'][n][key]:14.1f}" if n in r["variants"] else f"{'-':>14}" for n in names)
        best, ratio, slower = fused_vs_best(r, key)
        shape = f"{r['M']}x{r['dim']}x{r['hidden']}"
        line = (f"{shape:<18}{r['bound']:>8}{r['floor_us']:9.1f}{cells}"
                f"{ratio:14.2f}x{r['floor_us'] / r['variants']['fused'][key]:10.2f}")
        flags = f"  SLOWER than {best}" if slower else ""
        if graphs:
            host, host_slower = host_vs_eager(r)
            line += f"{host:14.2f}x"
            flags += "  host SLOWER than eager" if host_slower else ""
        lines.append(line + flags)
    return lines


def ceilings_line(record):
    return (f"{record['device']}: {record['dtype']} 8192^3 matmul {record['ceiling_tflops']:.0f} TFLOP/s, "
            f"1 GiB copy {record['copy_tbps']:.2f} TB/s (the ceilings)")


def table_text(record):
    """The whole printed table of a record (what bench.py writes next to it as .txt)."""
    graphs = record.get("graph_every_row", False)
    lines = [ceilings_line(record)]
    for r in record["shapes"]:
        lines += shape_lines(r, record["ceiling_tflops"], record["copy_tbps"], graphs)
    return "\n".join(lines + summary_lines(record["shapes"], graphs)) + "\n"


def markdown_table(record, path="results/bench_h200.json"):
    """A page's benchmark table, from the record this script wrote at path (tests/test_readme.py checks they
    agree). A record with "graph_every_row": the µs are the graph replays', the times from Python and the host's
    in columns of their own."""
    names = ["eager", "compile", "max-autotune", "liger"]
    graphs = record.get("graph_every_row", False)
    key = "graph_median_us" if graphs else "median_us"
    rounds = len(record["shapes"][0]["variants"]["eager"]["rounds_us"])
    timed = (f"µs of CUDA-graph replays (the GPU's time alone), median of {rounds} rounds; host: µs per call to enqueue "
             "one forward" if graphs else f"µs, median of {rounds} rounds")
    last = ("called from Python: fused vs best other | host µs per call: fused vs eager" if graphs else
            "GPU time alone (graph): fused vs best other (fused of floor)")
    lines = [f"Measured on {record['date'][:10]} on an {record['device']} (torch {record['torch']}, triton "
             f"{record['triton']}, CUDA {record['cuda']}, liger-kernel {record['liger_kernel']}, {record['dtype']}"
             f"{', the ' + MLP_NAMES['silu'] + ' MLP' if record.get('activation') == 'silu' else ''}); "
             f"ceilings {record['ceiling_tflops']:.0f} TFLOP/s (GEMM) and {record['copy_tbps']:.2f} TB/s (copy). "
             f"{timed}; full record: `{path}` and `.txt`.", "",
             f"| M×dim→hidden | floor (bound) | eager | compile | max-autotune | Liger | fused (of floor) "
             f"| fused vs best other | {last} |",
             "| --- " * (10 if graphs else 9) + "|"]
    for r in record["shapes"]:
        v = r["variants"]
        fused = v["fused"][key]
        best, ratio, slower = fused_vs_best(r, key)
        if graphs:  # from Python: fused's µs against the best other's (by that time), and their ratio
            called, c_ratio, c_slower = fused_vs_best(r)
            host, h_slower = host_vs_eager(r)
            last = (f"{v['fused']['median_us']:.1f} vs {v[called]['median_us']:.1f} ({c_ratio:.2f}×"
                    f"{', slower: ' + called if c_slower else ''}) | {v['fused']['host_us']:.1f} vs "
                    f"{v['eager']['host_us']:.1f} ({host:.2f}×{', slower' if h_slower else ''})")
        elif "graph_median_us" in v["fused"]:
            g = v["fused"]["graph_median_us"]
            g_best = min(o["graph_median_us"] for k, o in v.items() if k != "fused" and "graph_median_us" in o)
            last = f"{g:.1f} vs {g_best:.1f} ({r['floor_us'] / g:.2f})"
        else:
            last = "-"
        post = " (the post's)" if (r["M"], r["dim"], r["hidden"]) == (8192, 768, 3072) else ""
        cells = " | ".join(f"{v[n][key]:.1f}" if n in v else "-" for n in names)
        lines.append(f"| {r['M']}×{r['dim']}→{r['hidden']}{post} | {r['floor_us']:.1f} µs ({r['bound']}) | {cells} "
                     f"| **{fused:.1f}** ({r['floor_us'] / fused:.2f}) "
                     f"| {ratio:.2f}×{' (slower: ' + best + ')' if slower else ''} | {last} |")
    return "\n".join(lines) + "\n"
