"""Peaks: a device's datasheet TFLOP/s and GB/s, from torch's table or our supplement."""

from __future__ import annotations

import ast
import importlib.util
import json
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Peak:
    source: str
    tflops: dict[str, float]  # dense TFLOP/s per dtype name
    gbs: float | None


# torch's datasheet table has no H200 (torch 2.13); this suite runs on one. NVIDIA H200 SXM datasheet, dense
# (its tensor-core figures are quoted with 2:4 sparsity, so halved): bf16/fp16 1,979 -> 989.5 TFLOPS, 4.8 TB/s.
_SUPPLEMENT = {"NVIDIA H200": Peak(
    "NVIDIA H200 datasheet (not in torch's table)",
    {"bfloat16": 989.5, "float16": 989.5, "tf32": 494.5, "float32": 67.0, "float64": 67.0,
     "float8_e4m3fn": 1979.0, "float8_e5m2": 1979.0, "int8": 1979.0},
    4800.0)}
# Entries torch's table lists with NVIDIA's 2:4-sparsity tensor-core figures (datasheets since Hopper quote only
# those) and, before torch 2.13, without tops_sparsity_factor: torch 2.11 says H100 bf16 1979, 2.13 says 1979 / 2.
# Where torch gives no factor, ours applies, so the peak is the dense figure on every torch.
_SPARSE_IN_TORCH = {"NVIDIA H100": 2, "NVIDIA L4": 2}
_torch_table: dict[str, Peak] | None = None
# torch's table as read from the torch named inside: the reader never needs torch, and its answer does not depend on
# which torch is installed. write_snapshot() takes it again from the installed torch:
#   uv run python -c "from trace_reader.facts import peaks; print(peaks.write_snapshot())"
SNAPSHOT = Path(__file__).with_name("torch_peaks.json")


def _read_torch_table() -> dict[str, Peak]:
    """torch/_inductor/analysis/device_info.py's _device_mapping, read as source (no torch import).

    Importing torch._inductor takes seconds; the table is plain literals, so ast reads it in milliseconds.
    Any change in that private file just means "peak unknown".
    """
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(list(spec.submodule_search_locations)[0]) / "_inductor" / "analysis" / "device_info.py"
    return parse_device_info(path.read_text())


def parse_device_info(source: str) -> dict[str, Peak]:
    """The table in device_info.py's source, dense: divided by its tops_sparsity_factor, or by ours
    (_SPARSE_IN_TORCH) where that torch gives none."""
    tree = ast.parse(source)
    table: dict[str, Peak] = {}
    for node in ast.walk(tree):
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not isinstance(value, ast.Dict) or not any(getattr(t, "id", "") == "_device_mapping" for t in targets):
            continue
        for key, call in zip(value.keys, value.values):
            if not (isinstance(key, ast.Constant) and isinstance(call, ast.Call)):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            source = "torch._inductor.analysis.device_info"
            if "tops_sparsity_factor" in kw:
                factor = ast.literal_eval(kw["tops_sparsity_factor"])
            else:
                factor = _SPARSE_IN_TORCH.get(key.value.upper(), 1)
                source += " (sparse figures halved)" if factor == 2 else ""
            tops = {}
            if isinstance(kw.get("tops"), ast.Dict):
                for dk, dv in zip(kw["tops"].keys, kw["tops"].values):
                    # keys are torch.bfloat16 (an attribute) or the string "torch.tf32"
                    name = dk.attr if isinstance(dk, ast.Attribute) else str(getattr(dk, "value", ""))
                    tops[name.removeprefix("torch.")] = ast.literal_eval(dv) / factor
            gbs = ast.literal_eval(kw["dram_bw_gbs"]) if "dram_bw_gbs" in kw else None
            table[key.value.upper()] = Peak(source, tops, gbs)
    # aliases: _device_mapping["AMD INSTINCT MI300X"] = _device_mapping["AMD MI300X"]
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", "") == "_device_mapping":
                    alias, source = ast.literal_eval(t.slice), ast.literal_eval(node.value.slice)
                    if source.upper() in table:
                        table[alias.upper()] = table[source.upper()]
    return table


def _load_snapshot() -> dict[str, Peak]:
    """torch's table as SNAPSHOT keeps it."""
    data = json.loads(SNAPSHOT.read_text())
    return {name: Peak(**p) for name, p in data["devices"].items()}


def write_snapshot() -> str:
    """SNAPSHOT, written again from the installed torch's table; returns what it says."""
    import torch  # only here: this one command is the reader's only use of torch

    table = _read_torch_table()
    SNAPSHOT.write_text(json.dumps({"torch": torch.__version__.split("+")[0],
                                    "devices": {k: asdict(v) for k, v in sorted(table.items())}}, indent=1) + "\n")
    return f"wrote {SNAPSHOT.name}: {len(table)} devices from torch {torch.__version__}"


def device_peak(name: str | None) -> Peak | None:
    """Datasheet peak for a device name: torch's table first (longest matching prefix), then ours."""
    global _torch_table
    if not name:
        return None
    if _torch_table is None:
        try:
            _torch_table = _load_snapshot()
        except Exception:  # noqa: BLE001 - a damaged installation: peaks become unknown, the report goes on
            _torch_table = {}
    upper = name.upper()
    # Device names carry suffixes ("NVIDIA H100 80GB HBM3"); the table is keyed by the family name.
    for table in (_torch_table, {k.upper(): v for k, v in _SUPPLEMENT.items()}):
        matches = [k for k in table if upper == k or upper.startswith(k + " ")]
        if matches:
            return table[max(matches, key=len)]
    return None
