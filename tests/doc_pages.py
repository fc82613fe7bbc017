"""The pages a reader walks through, as the tests read them: README.md, then every docs/*.md."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def page(name: str) -> str:
    """One page's text, by its path from the repository root (`README.md`, `docs/05_attention.md`)."""
    return (ROOT / name).read_text()


def all_text() -> str:
    """Every page, one after another: a number or a block is found wherever the reader meets it."""
    return "\n\n".join(p.read_text() for p in pages())


def section(text: str, heading: str) -> str:
    """The part of `text` under the heading line `heading` (e.g. "## No GPU?"), up to the next heading of the
    same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + 1
    end = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], flags=re.M)
    return text[start:start + len(heading) + end.start()] if end else text[start:]


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped (but `-` and `_`), spaces to `-`."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def links(text: str) -> list[str]:
    """The targets of the markdown links and images in `text`, code spans and code blocks left out."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return re.findall(r"\]\(([^)\s]+)\)", prose)
