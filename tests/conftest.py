import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pytest_collection_modifyitems(config, items):
    """Under mutmut (pyproject's [tool.mutmut]), keep the fast in-process tests only.

    A test that records a real profile (the `cpu` fixture) or starts a subprocess (`cli`) takes seconds;
    mutmut runs the covering tests once per mutant, so those would not fit its 15-minute budget.
    """
    if "mutmut" not in sys.modules:
        return
    slow = [i for i in items if "cpu" in getattr(i, "fixturenames", ()) or "cli" in i.name or "subprocess" in i.keywords]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in slow]
