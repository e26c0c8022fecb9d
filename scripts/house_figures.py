#!/usr/bin/env python3
"""The house's figures, measured the same way before and after a change of plan
(docs/ARCHITECTURE.md, "The plan in figures"), and its rules checked:

    scripts/house_figures.py            the figures, as a Markdown table
    scripts/house_figures.py --json     the same as JSON
    scripts/house_figures.py --check    exit 1 naming every broken rule (a test runs this)

Figures: lines of non-test C++ by folder, files over 600 lines, functions over 80 lines, the
include loops between modules of one folder (a module is a .hpp with its .cpp), and the
includes and library links that point to a higher floor. Rules (--check): no library links
to a library of a higher floor, and no file includes a header of a higher floor; in actors/,
no process's room (coordinator/, agent/, worker/) includes or links another's (wire/ is
shared). The floors are those of docs/ARCHITECTURE.md; a folder's floor is that of its
top-level folder.

Functions are found by reading the code as text (comments and literals blanked, braces
counted), not by compiling it: a body counts from the line of its opening brace to the line
of its closing one."""

import json
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
FLOORS = {"runtime": 1, "checkpoint": 2, "monitoring": 2, "chaos": 2, "strategies": 3,
          "actors": 4, "coordinator": 5, "cli": 6, "python": 6}
# The rooms of actors/: one per process that runs them, and the wire they all share. A room
# may use wire/ and nothing of another room.
ROOMS = {"coordinator", "agent", "worker"}
ROOM_LIBRARIES = {"troupe_coordinator_actors": "coordinator", "troupe_agent": "agent",
                  "troupe_worker": "worker"}
SOURCE_DIRS = list(FLOORS) + ["bench"]
LONG_FILE = 600
LONG_FUNCTION = 80


def sources(include_tests=False):
    for top in SOURCE_DIRS + (["tests"] if include_tests else []):
        for base, dirs, files in os.walk(os.path.join(ROOT, top)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for f in sorted(files):
                if f.endswith((".cpp", ".hpp", ".h", ".cc")):
                    yield os.path.relpath(os.path.join(base, f), ROOT)


def floor_of(path):
    return FLOORS.get(path.split("/", 1)[0])


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="replace") as f:
        return f.read()


def blank_comments_and_literals(text):
    """The text with comments, string and character literals replaced by spaces (newlines
    kept), so that braces and parentheses in them do not count."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if not m:
                out.append(c)
                i += 1
                continue
            end = text.find(")" + m.group(1) + '"', i)
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(" " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


FUNCTION_TAIL = re.compile(r"\)\s*(const|override|final|noexcept|mutable|&|&&|\s|->\s*[\w:<>,\s*&]+)*$")


def functions(path):
    """(name, first line, last line) of each function body that is not inside another."""
    text = blank_comments_and_literals(read(path))
    found, stack, since = [], [], 0  # since: where the text before the next '{' starts
    line = 1
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "{":
            head = text[since:i]
            kind = "block"
            if not any(k == "function" for k, _, _ in stack):
                words = head.strip()
                if re.search(r"\bnamespace\b", words) or re.search(r'\bextern\s*$', words):
                    kind = "namespace"
                elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", words):
                    kind = "type"
                elif FUNCTION_TAIL.search(words) and not re.search(r"[=,]\s*\[[^\]]*\]\s*\(", words) \
                        and not re.match(r"^(if|for|while|switch|catch)\b", words.split("\n")[-1].strip()):
                    kind = "function"
            name = ""
            if kind == "function":
                m = re.search(r"([~\w:]+)\s*\([^()]*(\([^()]*\)[^()]*)*\)[^()]*$", head)
                name = m.group(1) if m else "?"
            stack.append((kind, line, name))
            since = i + 1
        elif c == "}":
            if stack:
                kind, first, name = stack.pop()
                if kind == "function":
                    found.append((name, first, line))
            since = i + 1
        elif c == ";":
            since = i + 1
    return found


INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def includes(path):
    return INCLUDE.findall(read(path))


def module_of(path):
    return os.path.splitext(path)[0]


def include_loops(paths):
    """Strongly connected groups of two or more modules of one folder."""
    graph = {}
    known = set(paths)
    for p in paths:
        m = module_of(p)
        graph.setdefault(m, set())
        for inc in includes(p):
            if inc in known and os.path.dirname(inc) == os.path.dirname(p) and module_of(inc) != m:
                graph[m].add(module_of(inc))
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def upward_includes(paths):
    out = []
    for p in paths:
        mine = floor_of(p)
        if mine is None:
            continue
        for inc in includes(p):
            theirs = floor_of(inc)
            if theirs is not None and theirs > mine:
                out.append(f"{p} includes {inc} (floor {mine} -> {theirs})")
    return out


def room_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "actors" and parts[1] in ROOMS else None


def cross_room_includes(paths):
    out = []
    for p in paths:
        mine = room_of(p)
        if mine is None:
            continue
        for inc in includes(p):
            theirs = room_of(inc)
            if theirs is not None and theirs != mine:
                out.append(f"{p} includes {inc} (actors/{mine} -> actors/{theirs})")
    return out


ADD_LIBRARY = re.compile(r"add_library\(\s*([\w-]+)")
LINK = re.compile(r"target_link_libraries\(\s*([\w-]+)([^)]*)\)", re.S)


def library_floors():
    """Each library target troupe defines, with the floor of the folder that defines it."""
    out = {}
    for top, floor in FLOORS.items():
        for base, dirs, files in os.walk(os.path.join(ROOT, top)):
            if "CMakeLists.txt" in files:
                text = read(os.path.relpath(os.path.join(base, "CMakeLists.txt"), ROOT))
                for name in ADD_LIBRARY.findall(text):
                    out[name] = (floor, os.path.relpath(base, ROOT))
    return out


def upward_links():
    floors = library_floors()
    out = []
    for top in FLOORS:
        for base, dirs, files in os.walk(os.path.join(ROOT, top)):
            if "CMakeLists.txt" not in files:
                continue
            rel = os.path.relpath(os.path.join(base, "CMakeLists.txt"), ROOT)
            text = re.sub(r"#[^\n]*", "", read(rel))
            for target, rest in LINK.findall(text):
                if target not in floors:
                    continue
                mine = floors[target][0]
                for dep in re.findall(r"[\w-]+", rest):
                    if dep in floors and floors[dep][0] > mine:
                        out.append(f"{rel}: {target} (floor {mine}) links {dep} "
                                   f"(floor {floors[dep][0]}, {floors[dep][1]})")
                    room, other = ROOM_LIBRARIES.get(target), ROOM_LIBRARIES.get(dep)
                    if room and other and room != other:
                        out.append(f"{rel}: {target} (actors/{room}) links {dep} "
                                   f"(actors/{other})")
    return out


def figures():
    paths = list(sources())
    lines = {}
    long_files, long_functions = [], []
    for p in paths:
        n = read(p).count("\n")
        top = p.split("/", 1)[0]
        lines[top] = lines.get(top, 0) + n
        if n > LONG_FILE:
            long_files.append((p, n))
        for name, first, last in functions(p):
            if last - first + 1 > LONG_FUNCTION:
                long_functions.append((f"{p}:{first}", name, last - first + 1))
    return {
        "cpp_lines": dict(sorted(lines.items())),
        "cpp_lines_total": sum(lines.values()),
        "files_over_600_lines": sorted(long_files, key=lambda x: -x[1]),
        "functions_over_80_lines": sorted(long_functions, key=lambda x: -x[2]),
        "include_loops": include_loops(paths),
        "upward_includes": upward_includes(paths) + cross_room_includes(paths),
        "upward_links": upward_links(),
    }


def markdown(f):
    def listed(items, text):
        return f"{len(items)}: " + text if items else "0"

    rows = [("non-test C++ lines", f"{f['cpp_lines_total']:,} (" +
             ", ".join(f"{k} {v:,}" for k, v in f["cpp_lines"].items()) + ")"),
            ("files over 600 lines", listed(f["files_over_600_lines"], ", ".join(
                f"{p} ({n})" for p, n in f["files_over_600_lines"]))),
            ("functions over 80 lines", str(len(f["functions_over_80_lines"]))),
            ("include loops inside a folder", listed(f["include_loops"], "; ".join(
                " <-> ".join(g) for g in f["include_loops"]))),
            ("includes of a higher floor or another room", str(len(f["upward_includes"]))),
            ("links to a higher floor", listed(f["upward_links"], "; ".join(f["upward_links"])))]
    out = ["| figure | value |", "|---|---|"]
    out += [f"| {a} | {b} |" for a, b in rows]
    out.append("")
    out.append("Functions over 80 lines, longest first:")
    out += [f"- {where} `{name}`: {n}" for where, name, n in f["functions_over_80_lines"]]
    return "\n".join(out)


def main(argv):
    f = figures()
    if "--check" in argv:
        broken = f["upward_links"] + f["upward_includes"]
        for b in broken:
            print(f"floor rule broken: {b}")
        if broken:
            print("A folder may use only the folders of lower floors, and a process's room in "
                  "actors/ only wire/ (docs/ARCHITECTURE.md, The floors): move the code down "
                  "or into wire/, or pass what it needs in from above.")
            return 1
        print(f"floors kept: {len(library_floors())} libraries, "
              f"{sum(1 for _ in sources())} files")
        return 0
    print(json.dumps(f, indent=1) if "--json" in argv else markdown(f))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
