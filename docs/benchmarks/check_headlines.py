#!/usr/bin/env python3
"""Checks the headline table of docs/BENCHMARKS.md against the notes it links to.

For every row: the linked file (and its #anchor, if any) exists; every number in the
what / troupe / peer / ratio cells, the date and each `command` in the command cell appear
in that file. A cell that says "computed" holds a figure derived here, not in the notes:
its numbers are listed, not checked. Dashes (– or -), the space before % and line breaks
inside a command are normalised. Prints one line per row; exit status 1 if anything is missing.

Usage: python3 docs/benchmarks/check_headlines.py"""

import pathlib
import re
import sys

DOCS = pathlib.Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"[+\-~]?\d[\d,]*(?:\.\d+)?(?:-\d[\d,]*(?:\.\d+)?)?")


def norm(text):
    return text.replace("–", "-").replace("\u00a0", " ").replace(" %", "%")


def slug(heading):  # GitHub's anchor for a heading
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def present(token, text):
    token = token.lstrip("~").rstrip(",")
    return re.search(r"(?<![\d.])(?<!\d,)" + re.escape(token) + r"(?!\d|[.,]\d)", text) is not None


def main():
    table = norm((DOCS / "BENCHMARKS.md").read_text())
    rows = [l for l in table.splitlines() if l.startswith("| [")]
    bad = 0
    for line in rows:
        what, troupe, peer, ratio, machine, date, command = cells(line)
        target = re.search(r"\]\(([^)#]+)(?:#([^)]*))?\)", what)
        path, anchor = DOCS / target.group(1), target.group(2)
        label = re.sub(r"^\[|\]\(.*$", "", what)
        problems, computed = [], []
        if not path.exists():
            print(f"MISSING FILE {path} for: {label}")
            bad += 1
            continue
        notes = norm(path.read_text())
        flat = re.sub(r"\s+", " ", notes)  # a command may wrap across lines in the notes
        if anchor and anchor not in {slug(h.lstrip("#")) for h in notes.splitlines() if h.startswith("#")}:
            problems.append(f"anchor #{anchor}")
        figures = 0
        for cell in (re.sub(r"\]\(.*?\)", "]", what), troupe, peer, ratio):
            for token in NUMBER.findall(cell.replace("**", "")):
                if "computed" in cell and not present(token, notes):
                    computed.append(token)
                    continue
                figures += 1
                if not present(token, notes):
                    problems.append(f"figure {token}")
        if date.replace(" UTC", "") not in notes:
            problems.append(f"date {date}")
        commands = re.findall(r"`([^`]+)`", command)
        for cmd in commands:
            if cmd not in flat:
                problems.append(f"command `{cmd}`")
        status = "ok  " if not problems else "MISS"
        bad += bool(problems)
        extra = f"; computed, not in the notes: {', '.join(computed)}" if computed else ""
        print(f"{status} {path.name:15} {figures:2} figures, date, {len(commands)} command(s): "
              f"{label[:70]}{extra}" + (f"  -> missing: {'; '.join(problems)}" if problems else ""))
    print(f"{len(rows)} rows, {bad} with something missing")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
