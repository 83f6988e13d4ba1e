"""The report as one list of blocks (headings, paragraphs, tables, lists, plots) that REPORT.md and REPORT.html
both render, so neither shows less than the other. REPORT.md's text is written once (report.markdown and the
sections it calls); `parse` reads it back into blocks, and `markdown` writes blocks as that text."""
import re
from dataclasses import dataclass

IMAGE = re.compile(r"^!\[([^\]]*)\]\(([^)]+)\)$")
RULE = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


@dataclass(slots=True)
class ReportBlock:
    """One part of the report: a heading (level 1 to 3), a paragraph (level 0), a table, a list or a plot."""

    text: str = ""
    level: int = 0
    head: tuple[str, ...] = ()  # a table's columns
    rows: list[list[str]] | None = None  # a table's rows
    items: list[str] | None = None  # a list's lines
    id: str = ""  # the HTML element's id
    image: str = ""  # a plot's file name, beside REPORT.md


def markdown(parts: list[ReportBlock]) -> list[str]:
    """REPORT.md lines of the blocks."""
    from batchlab.report.text import md_table

    out = []
    for b in parts:
        if b.rows is not None:
            out += [""] + md_table(list(b.head), [[c.replace("|", "\\|") for c in r] for r in b.rows])
        elif b.items is not None:
            out += [""] + [f"- {item}" for item in b.items]
        elif b.image:
            out += ["", f"![{b.text}]({b.image})"]
        else:
            out += ["", f"{'#' * b.level} {b.text}" if b.level else b.text]
    return out


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells ('\\|' is a '|' inside a cell)."""
    s = line.strip()
    s = s[1:] if s.startswith("|") else s
    s = s[:-1] if s.endswith("|") and not s.endswith("\\|") else s
    cells = re.split(r"(?<!\\)\|", s)
    return [c.strip().replace("\\|", "|") for c in cells]


def _heading(line: str) -> ReportBlock | None:
    match = re.match(r"^(#{1,6}) (.*)$", line)
    return ReportBlock(match[2], len(match[1])) if match else None


def parse(text: str) -> list[ReportBlock]:
    """REPORT.md's text as blocks: a run of '- ' lines is a list, of '|' lines a table, a line '![n](f)' a plot,
    a '#' line a heading; any other run of lines is a paragraph."""
    out: list[ReportBlock] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif heading := _heading(line):
            out.append(heading)
            i += 1
        elif image := IMAGE.match(line.strip()):
            out.append(ReportBlock(image[1], image=image[2]))
            i += 1
        else:
            i = _run(lines, i, out)
    return out


def _run(lines: list[str], i: int, out: list[ReportBlock]) -> int:
    """A list, a table or a paragraph starting at line i, appended to `out`; the index after it."""
    j = i
    kind = "list" if lines[i].lstrip().startswith("- ") else "table" if lines[i].lstrip().startswith("|") else "text"
    while j < len(lines) and lines[j].strip() and _kind(lines[j]) == kind:
        j += 1
    run = lines[i:j]
    if kind == "list":
        out.append(ReportBlock(items=[re.sub(r"^\s*-\s+", "", line) for line in run]))
    elif kind == "table":
        body = [line for line in run[1:] if not RULE.match(line.strip())]
        out.append(ReportBlock(head=tuple(_cells(run[0])), rows=[_cells(line) for line in body]))
    else:
        out.append(ReportBlock(" ".join(line.strip() for line in run)))
    return j


def _kind(line: str) -> str:
    if _heading(line) or IMAGE.match(line.strip()):
        return "other"
    stripped = line.lstrip()
    return "list" if stripped.startswith("- ") else "table" if stripped.startswith("|") else "text"
