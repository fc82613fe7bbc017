"""Expectations, "guess first, then look": Expect (a guess and its check), NotApplicable, check() and
print_expectations(). The guesses themselves live beside what they read: analyzers/guesses.py (rungs 01-05),
analyzers/memory.py, training_expect.py, ranks.py, data_parallel.py, modules.py, and the scripts."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Iterable

from .reading.events import Trace, real_steps


class NotApplicable(str):
    """What a check returns when the trace cannot answer it (e.g. no annotations): "not applicable", not broken."""


@dataclass
class Expect:
    text: str  # the guess, in the post's words
    check: Callable[[Trace], bool | str]  # True = confirmed; False or a str (what was seen instead) = broken
    device: str = "any"  # "any", "cuda" (GPU-only: "not applicable" on a CPU trace) or "cpu"


def need_steps(trace: Trace) -> str | None:
    """None when the trace has steps to count per; else why not. A trace recorded without prof.step() cannot
    answer a per-step guess (not applicable: steps() alone says the steps are missing); a trace with steps but
    none active is a run that recorded nothing it meant to (broken)."""
    if trace.steps:
        return None
    return (NotApplicable("no ProfilerStep#N spans (recorded without prof.step()): nothing to count per step")
            if trace.whole else "no active steps in the trace")


def check(trace: Trace, expectations: Iterable[Expect]) -> list[tuple[Expect, str, str]]:
    """(expect, "confirmed" | "broken" | "not applicable", detail) for each; a check that raises is broken.
    Expectations count per ProfilerStep#N: a trace recorded without steps has none to show them."""
    trace = real_steps(trace)
    results = []
    for ex in expectations:
        if ex.device not in ("any", "cuda", "cpu"):  # a typo must not turn into a silent "not applicable"
            results.append((ex, "broken", f"device must be 'any', 'cuda' or 'cpu', got {ex.device!r}"))
            continue
        if ex.device not in ("any", trace.device):
            results.append((ex, "not applicable", f"a {ex.device}-only expectation on a {trace.device} trace"))
            continue
        try:
            seen = ex.check(trace)
        except Exception as e:  # noqa: BLE001 - a failing check is a finding, not a crash
            results.append((ex, "broken", f"check raised {type(e).__name__}: {e}"))
            continue
        if seen is True:
            results.append((ex, "confirmed", ""))
        elif isinstance(seen, NotApplicable):
            results.append((ex, "not applicable", str(seen)))
        elif isinstance(seen, str):
            results.append((ex, "broken", seen))
        else:
            results.append((ex, "broken", "" if seen is False else f"check returned {seen!r}, not True"))
    return results


def print_expectations(results: list[tuple[Expect, str, str]], file=None) -> int:
    """Print each guess with its verdict; broken ones stand out. Returns how many are broken."""
    from rich.console import Console
    from rich.text import Text

    console = Console(file=file or sys.stdout, highlight=False, soft_wrap=True)
    console.print(Text("Expectations (guess first, then look):", style="bold"))
    for ex, verdict, detail in results:
        if verdict == "confirmed":
            line = Text("  ok      ", style="green") + Text(ex.text)
        elif verdict == "broken":
            line = Text("  BROKEN  ", style="bold red") + Text(ex.text, style="red")
            line += Text(f"\n          seen: {detail or '(no detail)'}  <- BROKEN — look here", style="bold red")
        else:
            line = Text("  n/a     ", style="dim") + Text(f"{ex.text} ({detail})", style="dim")
        console.print(line)
    count = Counter(v for _, v, _ in results)
    broken = count["broken"]
    console.print(Text(f"  {count['confirmed']} confirmed, {broken} broken, {count['not applicable']} not applicable",
                       style="bold red" if broken else "bold green"))
    return broken
