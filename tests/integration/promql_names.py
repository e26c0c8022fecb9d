"""Metric names as the Prometheus tests need them (standard library only):

- metric_names(expr): the metric names a PromQL expression selects, found by a small lexer
  (strings, label matchers, ranges, durations, numbers, function and aggregation names,
  keywords and the label lists of by/without/on/ignoring/group_left/group_right are not
  names; a {__name__="x"} matcher is);
- rule_entries(path): the record/alert names and exprs of a rules file written in the style of
  monitoring/prometheus/troupe.rules.yml (no YAML library needed);
- dashboard_queries(path): every PromQL query of a Grafana dashboard JSON, templating included;
- readme_series(path): the series the README's Metrics paragraph names, and which of them it
  calls histograms;
- exposition_samples(text) / exposition_types(text): what a /metrics body holds.
"""

import json
import re

KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
            "group_left", "group_right", "atan2"}
# Keywords followed by a parenthesised list of label names (skipped whole).
LABEL_LIST_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values", "group", "limitk", "limit_ratio"}
NUMBER_WORDS = {"inf", "nan"}
IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
NUMBER = re.compile(r"(0[xX][0-9a-fA-F]+|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)[A-Za-z0-9_.]*")


class PromQLError(ValueError):
    pass


def _skip_string(text, i):
    """Index after the string literal that starts at text[i]."""
    quote = text[i]
    i += 1
    while i < len(text):
        if text[i] == "\\" and quote != "`":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    raise PromQLError(f"unterminated string in {text!r}")


def _skip_spaces(text, i):
    while i < len(text):
        if text[i].isspace():
            i += 1
        elif text[i] == "#":  # a comment runs to the end of the line
            while i < len(text) and text[i] != "\n":
                i += 1
        else:
            break
    return i


def _skip_group(text, i, open_, close):
    """Index after the bracket group that starts at text[i] (strings inside respected)."""
    if i >= len(text) or text[i] != open_:
        raise PromQLError(f"expected {open_!r} at {i} in {text!r}")
    depth = 0
    while i < len(text):
        c = text[i]
        if c in "\"'`":
            i = _skip_string(text, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PromQLError(f"unbalanced {open_!r} in {text!r}")


def _matcher_names(block):
    """Metric names given in a {...} block as __name__="x"."""
    return set(re.findall(r'__name__\s*=\s*"([^"]*)"', block))


def metric_names(expr):
    """The set of metric names `expr` selects."""
    names = set()
    i = 0
    n = len(expr)
    while True:
        i = _skip_spaces(expr, i)
        if i >= n:
            return names
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "{":
            end = _skip_group(expr, i, "{", "}")
            names |= _matcher_names(expr[i:end])
            i = end
        elif c == "[":
            i = _skip_group(expr, i, "[", "]")
        elif c.isdigit() or (c == "." and i + 1 < n and expr[i + 1].isdigit()):
            m = NUMBER.match(expr, i)
            i = m.end()
        elif IDENT.match(expr, i):
            m = IDENT.match(expr, i)
            word = m.group(0)
            i = m.end()
            after = _skip_spaces(expr, i)
            following = expr[after] if after < n else ""
            low = word.lower()
            if low in LABEL_LIST_KEYWORDS:
                if following == "(":
                    i = _skip_group(expr, after, "(", ")")
            elif low in KEYWORDS or low in NUMBER_WORDS:
                pass
            elif following == "(":
                pass  # a function or an aggregation: sum(...), rate(...)
            elif word in AGGREGATIONS and IDENT.match(expr, after) and \
                    IDENT.match(expr, after).group(0).lower() in ("by", "without"):
                pass  # sum by (x) (...)
            else:
                names.add(word)
        else:
            i += 1  # operators, parentheses, commas, @


def rule_entries(path):
    """[(kind, name, expr)] of a rules file: kind 'record' or 'alert'. Reads the layout that
    troupe.rules.yml uses: `- record: NAME` / `- alert: NAME` followed by `expr: EXPR` on one
    line or as a `|` / `>` block. Raises ValueError when the counts do not agree."""
    with open(path) as f:
        lines = f.read().splitlines()
    entries = []
    current = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*-\s*(record|alert):\s*(\S+)\s*$", line)
        if m:
            current = [m.group(1), m.group(2), None]
            entries.append(current)
            i += 1
            continue
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m:
            if current is None or current[2] is not None:
                raise ValueError(f"{path}:{i + 1}: expr without its own record/alert")
            indent, value = len(m.group(1)), m.group(2).strip()
            if value[:1] in ("|", ">"):
                block = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    block.append(lines[i].strip())
                    i += 1
                joiner = "\n" if value[0] == "|" else " "
                current[2] = joiner.join(block).strip()
                continue
            if value[:1] in ("'", '"'):
                value = json.loads(value) if value[0] == '"' else value[1:-1].replace("''", "'")
            current[2] = value
        i += 1
    for kind, name, expr in entries:
        if not expr:
            raise ValueError(f"{path}: {kind} {name} has no expr")
    declared = sum(1 for line in lines if re.match(r"^\s*-\s*(record|alert):", line))
    if declared != len(entries):
        raise ValueError(f"{path}: {declared} rules declared, {len(entries)} read")
    return [tuple(e) for e in entries]


GRAFANA_RANGE_VARIABLES = ("$__rate_interval", "$__interval", "$__range", "${__rate_interval}",
                           "${__interval}", "${__range}")


def grafana_to_promql(query, variables):
    """`query` with Grafana's range variables as 5m and each of `variables` (names of the
    dashboard's own variables) as a regex that matches anything. Raises ValueError if a `$`
    that is none of them remains."""
    for v in GRAFANA_RANGE_VARIABLES:
        query = query.replace(v, "5m")
    for name in sorted(variables, key=len, reverse=True):
        query = query.replace("${" + name + "}", ".*").replace("$" + name, ".*")
    if re.search(r"\$[A-Za-z_{]", query):  # $1 of a label_replace is not a variable
        raise ValueError(f"unknown variable left in {query!r}")
    return query


def dashboard_queries(path):
    """(queries, problems): every PromQL query of the dashboard at `path` as
    [(where, promql)] with the variables replaced (grafana_to_promql), and a list of what is
    not a valid provisionable panel query (no datasource variable, an unknown variable)."""
    with open(path) as f:
        dash = json.load(f)
    problems = []
    variables = [v["name"] for v in dash.get("templating", {}).get("list", [])]
    queries = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        for t in p.get("targets", []):
            where = f"panel {p.get('title')!r} target {t.get('refId')}"
            if "expr" not in t:
                problems.append(f"{where} has no expr")
                continue
            try:
                queries.append((where, grafana_to_promql(t["expr"], variables)))
            except ValueError as e:
                problems.append(f"{where}: {e}")
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v.get("query")
        q = q.get("query", "") if isinstance(q, dict) else (q or "")
        m = re.fullmatch(r"\s*label_values\(\s*(.*)\s*,\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", q)
        if m:
            q = m.group(1)
        try:
            queries.append((f"variable {v['name']!r}", grafana_to_promql(q, variables)))
        except ValueError as e:
            problems.append(f"variable {v['name']!r}: {e}")
    return queries, problems


def _expand_braces(token):
    """troupe_step_{compute,comm}_seconds -> [troupe_step_compute_seconds, ...]; a {label}
    group at the end of the token is a label set and is dropped."""
    token = re.sub(r"\{[^{}]*\}$", "", token)
    m = re.search(r"\{([^{}]*)\}", token)
    if not m:
        return [token]
    out = []
    for alt in m.group(1).split(","):
        out += _expand_braces(token[:m.start()] + alt.strip() + token[m.end():])
    return out


def readme_series(path):
    """(names, histograms): every troupe_* series the README's '### Metrics' paragraph names
    in backticks (brace groups expanded, label sets dropped), in order, and the subset it
    calls a histogram ("`x` (histogram)", "`x` and `y` (histograms)")."""
    with open(path) as f:
        text = f.read()
    m = re.search(r"^### Metrics\n(.*?)(?=^#)", text, re.S | re.M)
    if not m:
        raise ValueError(f"{path} has no '### Metrics' section")
    para = m.group(1)
    names = []
    for token in re.findall(r"`([^`]+)`", para):
        if token.startswith("troupe_"):
            for name in _expand_braces(token):
                if name not in names:
                    names.append(name)
    histograms = set()
    for group in re.findall(r"((?:`[^`]+`\s+and\s+)*`[^`]+`)\s*\(histograms?\)", para):
        for token in re.findall(r"`([^`]+)`", group):
            histograms.update(_expand_braces(token))
    return names, histograms


def exposition_samples(text):
    """The sample names of a text exposition (histograms as _bucket/_sum/_count)."""
    names = set()
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.match(r"[^{\s]+", line).group(0))
    return names


def exposition_types(text):
    """{family: type} from the # TYPE lines of a text exposition."""
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
