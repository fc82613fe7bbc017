"""The memory timeline as a picture (07_train_step.py --memory): torch's categories stacked over time, the active
steps' phases shaded."""

from __future__ import annotations

import os
from pathlib import Path

from ..analyzers.memory_timeline import COLORS, peaks
from ..analyzers.passes import PHASES, phase_windows
from ..reading.events import Trace, TraceError
from .plot import new_figure, save_png


def draw(timeline: dict, path: str | Path, trace: Trace | None = None, title: str = "") -> Path:
    """The categories stacked over time (ms from the first point), the active steps' phases shaded when the trace
    is given; written atomically, readable by all (0644), its peaks as JSON inside the PNG."""
    times = timeline["times_us"]
    if not times:
        raise TraceError("the memory timeline is empty: nothing to draw")
    t0 = times[0]
    xs = [(t - t0) / 1e3 for t in times]
    fig = new_figure((12, 6))
    ax = fig.add_subplot()
    names = [k for k in timeline["bytes"] if any(timeline["bytes"][k])]
    ax.stackplot(xs, *[[b / 2**20 for b in timeline["bytes"][k]] for k in names], labels=names,
                 colors=[COLORS.get(k, "grey") for k in names], alpha=0.8, step="post")
    if trace is not None:
        shade = {"forward": "#dddddd", "backward": "#bbbbbb", "optimizer": "#999999"}
        for st in trace.steps:
            windows, _ = phase_windows(st)
            for ph in PHASES:
                if ph in windows:
                    lo, hi = ((w - t0) / 1e3 for w in windows[ph])
                    ax.axvspan(lo, hi, color=shade[ph], alpha=0.35, zorder=0, lw=0)
                    ax.text((lo + hi) / 2, 1.0, ph[0].upper(), transform=ax.get_xaxis_transform(), ha="center",
                            va="bottom", fontsize=8)
    ax.set_xlabel("time (ms)" + ("; shaded: F forward, B backward, O optimizer of each active step"
                                 if trace is not None else ""))
    ax.set_ylabel("MiB")
    ax.set_title(title or f"memory by category ({timeline['device']})", pad=14)
    handles, labels = ax.get_legend_handles_labels()  # listed top to bottom, as stacked
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.subplots_adjust(left=0.07, right=0.83)
    p = peaks(timeline)
    out = save_png(fig, path, {"peaks_bytes": p["categories"], "total_peak_bytes": p["total"]})
    os.chmod(out, 0o644)  # like the traces: readable by whoever reads the folder
    return out
