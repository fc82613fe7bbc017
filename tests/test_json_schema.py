"""What `inspect_trace.py --json` prints, against its JSON Schemas (reader/trace_reader/schemas/, docs/json.md): every
committed trace's report, the comparisons the other tests and the pages make, every committed rank set merged
(by --ranks, by two _rankN files, by a folder). And the schemas' own rules: each file states SCHEMA_VERSION, and a
change to a schema file without a new version fails here (tests/data/schema_lock.json: {version: {file: sha256}}).

The reader runs in-process (inspect_trace.main, stdout captured): no interpreter start per trace. The validation
needs jsonschema (the dev group); without it those tests are skipped, saying so."""

import contextlib
import copy
import hashlib
import io
import json
import re
import shutil
from functools import cache
from pathlib import Path

import pytest
from doc_pages import page

import inspect_trace
from trace_reader.facts.schema import FORMS, SCHEMA_VERSION, schema_path

try:
    import jsonschema
except ImportError:  # the GPU machine's image may lack it: the dev group brings it here
    jsonschema = None

needs_jsonschema = pytest.mark.skipif(jsonschema is None, reason="jsonschema is not installed (the dev group of "
                                      "pyproject.toml has it: uv sync): the --json output is NOT validated")

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
LOCK = DATA / "schema_lock.json"

# Every committed trace; the reader reads them all today. A fixture it refuses on purpose goes here,
# {path under tests/data: what its one-line error says}, and is checked to be refused.
REFUSED: dict[str, str] = {}
TRACES = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*.json.gz"))
# The pairs the other tests and the pages compare (test_compare.py, test_train_step.py, test_compare_comm.py,
# test_foreign_traces.py; README.md and docs/reading_traces.md), and two of a CPU and a GPU trace (no test compares
# those: they are here for the keys that are null on one side only).
PAIRS = [
    ("h200_mlp_eager", "h200_mlp_compile"),  # eager vs compiled
    ("h200_mlp_eager", "h200_liger"),
    ("h200_mlp_compile", "h200_liger"),
    ("h200_mlp_compile", "h200_fused_eager"),  # compiled vs fused
    ("h200_model_decode_eager", "h200_model_decode_fused"),  # eager vs fused, whole modules replaced
    ("train/h200_train_mlp_forloop", "train/h200_train_mlp_foreach"),  # two training steps
    ("dist_compare/cpu_ddp_rank0", "dist_compare/cpu_fsdp2_rank0"),  # the dist_compare pair: CPU, communication
    ("dist_compare/cpu_single", "dist_compare/cpu_ddp_rank0"),  # CPU, one side without distributedInfo
    ("dist_compare/cpu_single", "dist_compare/cpu_single"),
    ("foreign/h200_foreign_llama4_prefill_eager", "foreign/h200_foreign_llama4_prefill_sdpa"),
    ("foreign/h200_foreign_gpt2_eager", "foreign/h200_foreign_gpt2_sdpa"),
    ("foreign/h200_foreign_mlp_eager", "foreign/h200_foreign_mlp_autotune"),
    ("train_foreign/cpu_accum", "train_foreign/h100_accum"),  # CPU vs GPU
    ("train_foreign/h100_compile_break", "train_foreign/cpu_compile_break"),  # GPU vs CPU
]
# Every run under tests/data/dist (two ranks each; cpu_ddp_again_rank1 is another run's rank 1, refused beside
# cpu_ddp_rank0 by test_dist_traces.py) and tests/data/tp (one rank each), read with --ranks.
RANK_SETS = [[f"dist/cpu_{run}_rank{r}" for r in (0, 1)]
             for run in ("ddp", "ddp_accum", "ddp_busy", "ddp_slow1", "ddp_slowall", "fsdp2")] + \
            [[f"tp/h200_tp1_64x128x768x3072_{run}eager_rank0"] for run in ("", "chunks4_", "fused_")]
EXPECTS = [("03_simple_mlp", "h200_mlp_compile"), ("07_train_step", "train/h200_train_mlp_foreach"),
           ("01_matmul_add", "h200_mlp_eager")]  # the last: every guess broken (exit code 1)


def trace(name: str) -> str:
    return str(DATA / (name if name.endswith(".json.gz") else f"{name}.json.gz"))


def run_json(argv: list[str], code: int = 0) -> dict:
    """inspect_trace.py --json ARGV, in this process: the JSON it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        got = inspect_trace.main(["--json", *argv])
    assert got == code, f"inspect_trace.py --json {' '.join(argv)}: exit code {got}: {err.getvalue()[-2000:]}"
    data = json.loads(out.getvalue())
    return data


@cache
def schema(form: str) -> dict:
    return json.loads(schema_path(form).read_text(encoding="utf-8"))


@cache
def validator(form: str):
    return jsonschema.Draft202012Validator(schema(form))


def problems(form: str, data: dict, against: dict | None = None) -> list[str]:
    """Where `data` breaks the form's schema (or `against`), one line each, at the innermost causes: a nullable
    object (anyOf: the object, or null) that fails says what failed in the object, not that it is not null."""
    v = validator(form) if against is None else jsonschema.Draft202012Validator(against)
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:300]}"
            for top in v.iter_errors(data) for e in causes(top)]


def causes(e):
    if not e.context:
        yield e
        return
    inner = [c for c in e.context if not (c.validator == "type" and c.validator_value == "null")]
    for c in inner or e.context:
        yield from causes(c)


# ------------------------------------------------------------------------------------------------ the outputs

@needs_jsonschema
@pytest.mark.parametrize("name", TRACES)
def test_every_committed_traces_report_follows_the_schema(name):
    if name in REFUSED:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            assert inspect_trace.main(["--json", trace(name)]) == 2
        assert REFUSED[name] in err.getvalue() and out.getvalue() == ""
        return
    assert problems("report", run_json([trace(name)])) == []


@needs_jsonschema
@pytest.mark.parametrize("script, name", EXPECTS)
def test_a_report_with_expectations_follows_the_schema(script, name):
    data = run_json(["--expect", script, trace(name)], code=1 if script == "01_matmul_add" else 0)
    assert data["expectations"] and problems("report", data) == []


@needs_jsonschema
@pytest.mark.parametrize("a, b", PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_every_comparison_follows_the_schema(a, b):
    assert problems("comparison", run_json([trace(a), trace(b)])) == []


@needs_jsonschema
@pytest.mark.parametrize("names", RANK_SETS, ids=[n[0] for n in RANK_SETS])
def test_every_committed_rank_set_follows_the_schema(names):
    data = run_json(["--ranks", *map(trace, names)])
    assert data["world_size"] == len(names) and problems("ranks", data) == []


@needs_jsonschema
def test_a_run_named_by_its_files_or_its_folder_is_the_same_form(tmp_path):
    """Two _rankN files of one run are merged without --ranks, and so is a folder holding them: the ranks form."""
    pair = [trace(n) for n in RANK_SETS[0]]
    for p in pair:
        shutil.copy(p, tmp_path)
    by_files, by_folder = run_json(pair), run_json([str(tmp_path)])
    assert "collectives" in by_files and problems("ranks", by_files) == []
    assert by_folder["world_size"] == 2 and problems("ranks", by_folder) == []


@needs_jsonschema
def test_the_pages_snippet_validates_a_report_and_refuses_a_broken_one(tmp_path, monkeypatch):
    """docs/json.md's Python block, run as a reader would, on a saved report: it passes; with a key retyped, the
    snippet raises."""
    (snippet,) = re.findall(r"```python\n(.*?)```", page("docs/json.md"), flags=re.S)
    monkeypatch.chdir(tmp_path)
    data = run_json([trace("h200_mlp_eager")])
    (tmp_path / "report.json").write_text(json.dumps(data))
    exec(snippet, {})
    data["steps"][0]["cpu_us"] = None
    (tmp_path / "report.json").write_text(json.dumps(data))
    with pytest.raises(jsonschema.ValidationError, match="None is not of type 'number'"):
        exec(snippet, {})


# ------------------------------------------------------------------------------------------------ the schemas can fail

@needs_jsonschema
@pytest.mark.parametrize("form", FORMS)
def test_each_schema_is_a_valid_draft_2020_12_schema(form):
    jsonschema.Draft202012Validator.check_schema(schema(form))
    assert schema(form)["$schema"] == "https://json-schema.org/draft/2020-12/schema"


@cache
def sample(form: str) -> dict:
    """One real output of each form, with most of its parts filled in (a training trace, a training comparison
    with communication on one side, a two-rank run)."""
    if form == "report":
        return run_json([trace("train/h200_train_mlp_foreach")])
    if form == "comparison":
        return run_json([trace("dist_compare/cpu_single"), trace("dist_compare/cpu_ddp_rank0")])
    return run_json(["--ranks", *map(trace, RANK_SETS[0])])


# (form, path to a fixed-key object in the output, one of its keys)
NESTED = [("report", ["steps", 0], "wall_us"), ("report", ["training", "phases", "backward"], "gemm_flops"),
          ("report", ["training"], "links_per_step"), ("comparison", ["training", "b"], "micro_batches"),
          ("comparison", ["communication", "b", "total"], "exposed_us"), ("ranks", ["collectives", 0], "skew_us"),
          ("ranks", ["ranks", 0, "steps", 0], "wait_us")]


def at(data, path):
    for key in path:
        data = data[key]
    return data


@needs_jsonschema
@pytest.mark.parametrize("form, path, key", NESTED)
def test_a_key_added_removed_or_retyped_in_the_output_fails(form, path, key):
    """The schemas are closed: a new key without a schema change fails, as do a missing key and a wrong type."""
    assert problems(form, sample(form)) == []
    added, removed, retyped = (copy.deepcopy(sample(form)) for _ in range(3))
    at(added, path)["a_new_key"] = 1
    del at(removed, path)[key]
    at(retyped, path)[key] = "12.5"
    assert any("a_new_key" in p for p in problems(form, added))
    assert any(key in p and "required" in p for p in problems(form, removed))
    assert any("'12.5' is not of type" in p for p in problems(form, retyped))


def object_with(s: dict, node: dict, key: str) -> dict:
    """The object schema at or under `node` that lists `key`: through a $ref (to the file's $defs), a nullable
    anyOf's object branch, an array's items."""
    while key not in node.get("properties", {}):
        if "anyOf" in node:
            node = next(b for b in node["anyOf"] if b.get("type") != "null")
        elif "$ref" in node:
            node = s["$defs"][node["$ref"].rsplit("/", 1)[-1]]
        else:
            node = node["items"]
    return node


@needs_jsonschema
@pytest.mark.parametrize("form, path, key", NESTED)
def test_the_output_fails_a_schema_that_lost_one_of_its_keys_or_says_another_type(form, path, key):
    """The other way round: a schema that lost a key, or says another type for it, no longer passes the output."""
    lost, retyped = copy.deepcopy(schema(form)), copy.deepcopy(schema(form))
    for s in (lost, retyped):
        node = s
        for name in (p for p in path if isinstance(p, str)):  # list indices: object_with goes through items
            node = object_with(s, node, name)["properties"][name]
        parent = object_with(s, node, key)
        if s is lost:
            del parent["properties"][key]
            parent["required"].remove(key)
        else:
            parent["properties"][key] = {"type": "string"}
    assert any(f"'{key}'" in p for p in problems(form, sample(form), against=lost))
    assert any("is not of type 'string'" in p for p in problems(form, sample(form), against=retyped))


# ------------------------------------------------------------------------------------------------ the versions

def contract_hash(text: str) -> str:
    """sha256 of a schema file's JSON, canonical (keys sorted, no spaces): its indentation and line endings (a
    Windows checkout's CRLF) do not count; every other change does, descriptions included."""
    canonical = json.dumps(json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def lock_problems(texts: dict[str, str], version: int, lock: dict) -> list[str]:
    """What breaks the versioning rule, given the schema files' texts ({file name: text}), SCHEMA_VERSION and the
    lock ({"1": {file name: contract_hash}, ...}): each a sentence saying what to do."""
    now = {name: contract_hash(text) for name, text in sorted(texts.items())}
    out = []
    versions = [int(v) for v in lock]
    if versions != list(range(1, len(versions) + 1)):
        out.append(f"{LOCK.name}: its versions must be 1, 2, ... in order, one line each; they are {versions}")
    if str(version) not in lock:
        out.append(f"SCHEMA_VERSION is {version} but {LOCK.name} has no line for it: add "
                   f"{json.dumps({str(version): now})}")
    elif versions and version != max(versions):
        out.append(f"SCHEMA_VERSION is {version} but {LOCK.name} goes up to {max(versions)}: a version never goes back")
    elif lock[str(version)] != now:
        changed = sorted(set(now) ^ set(lock[str(version)]) | {n for n in now if lock[str(version)].get(n) != now[n]})
        out.append(f"{', '.join(changed)} changed, but SCHEMA_VERSION is still {version}: a change to the --json "
                   f"schema bumps the version. Set SCHEMA_VERSION = {version + 1} in reader/trace_reader/facts/schema.py and in "
                   f"each schema file (x-version, the end of $id, schema_version's const), then add this line to "
                   f"tests/data/{LOCK.name}: {json.dumps({str(version + 1): now})}")
    return out


def schema_texts() -> dict[str, str]:
    return {schema_path(form).name: schema_path(form).read_text(encoding="utf-8") for form in FORMS}


def test_each_schema_file_states_the_version():
    assert isinstance(SCHEMA_VERSION, int) and SCHEMA_VERSION >= 1
    for form in FORMS:
        s = schema(form)
        assert s["x-version"] == SCHEMA_VERSION, form
        assert s["$id"] == f"urn:torch-trace:schema:{form}:{SCHEMA_VERSION}", form
        assert s["properties"]["schema_version"]["const"] == SCHEMA_VERSION, form
        assert "schema_version" in s["required"], form
    assert sorted(p.name for p in schema_path("report").parent.iterdir()) == sorted(schema_texts())


def test_a_change_to_a_schema_bumps_the_version():
    assert lock_problems(schema_texts(), SCHEMA_VERSION, json.loads(LOCK.read_text())) == []


def test_the_version_rule_catches_a_change_a_missing_line_and_a_step_back():
    """lock_problems itself, on a changed schema, on a version with no lock line, on a version below the lock's."""
    texts, lock = schema_texts(), json.loads(LOCK.read_text())
    changed = dict(texts)
    s = json.loads(texts["report.schema.json"])
    s["$defs"]["step"]["properties"]["wall_us"]["type"] = "integer"
    changed["report.schema.json"] = json.dumps(s, indent=2)
    (said,) = lock_problems(changed, SCHEMA_VERSION, lock)
    assert said.startswith("report.schema.json changed, but SCHEMA_VERSION is still") and "bumps the version" in said
    assert lock_problems({**texts, "report.schema.json": json.dumps(json.loads(texts["report.schema.json"]))},
                         SCHEMA_VERSION, lock) == []  # the same JSON, laid out otherwise: no change
    (said,) = lock_problems(changed, SCHEMA_VERSION + 1, lock)
    assert "has no line for it" in said
    assert "never goes back" in lock_problems(texts, SCHEMA_VERSION, {**lock, str(SCHEMA_VERSION + 1): {}})[0]


def test_the_training_parts_are_one_schema_in_both_files():
    """report and comparison each carry the training summary's $defs (a file stands alone for a user's
    validator); the copies must not drift."""
    for name in ("phase", "phases", "optimizer_summary", "training_summary"):
        assert schema("report")["$defs"][name] == schema("comparison")["$defs"][name], name


def test_schema_path_names_the_three_forms():
    assert [schema_path(f).name for f in FORMS] == ["report.schema.json", "comparison.schema.json", "ranks.schema.json"]
    with pytest.raises(ValueError, match="the forms are report, comparison, ranks"):
        schema_path("reports")


def every_description_says_what(s: dict, where: str = "") -> list[str]:
    """The properties (and tables' values, arrays' items) without a description, anywhere in a schema."""
    missing = []
    for name, prop in s.get("properties", {}).items():
        if "description" not in prop:
            missing.append(f"{where}/{name}")
        missing += every_description_says_what(prop, f"{where}/{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(s.get(key), dict):
            if "description" not in s[key] and "$ref" not in s[key]:
                missing.append(f"{where}/{key}")
            missing += every_description_says_what(s[key], f"{where}/{key}")
    for branch in s.get("anyOf", []):
        missing += every_description_says_what(branch, where)
    for name, d in s.get("$defs", {}).items():
        missing += every_description_says_what(d, f"$defs/{name}")
    return missing


@pytest.mark.parametrize("form", FORMS)
def test_every_property_has_a_description(form):
    assert every_description_says_what(schema(form)) == []


def test_a_crafted_distributed_info_still_follows_the_schema(tmp_path):
    """distributedInfo is the trace's word: a backend that is an object and a rank that is a word are no backend and
    no rank (null) in the comparison and the merged ranks, not copied through."""
    import gzip

    def crafted(name, **info):
        data = json.loads(gzip.decompress(Path(trace(name)).read_bytes()))
        data["distributedInfo"] = {**data["distributedInfo"], **info}
        path = tmp_path / (Path(name).name + ".json")
        path.write_text(json.dumps(data))
        return str(path)

    a = crafted("dist_compare/cpu_ddp_rank0", backend={"x": [1]}, rank="zero")
    comparison = run_json([a, trace("dist_compare/cpu_single")])
    assert problems("comparison", comparison) == []
    side = comparison["communication"]["a"]
    assert side["backend"] is None and side["rank"] is None and side["world_size"] == 2
    r0 = crafted("dist/cpu_ddp_rank0", backend=["gloo"])
    r1 = crafted("dist/cpu_ddp_rank1", backend=["gloo"])
    merged = run_json(["--ranks", r0, r1])
    assert merged["backend"] is None and problems("ranks", merged) == []
