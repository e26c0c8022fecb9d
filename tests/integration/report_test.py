"""`troupe report RUN_DIR` (issue 28): one self-contained HTML file about a run.

A real job of 2 ranks loses rank 1 (kill -9 at step 15), recovers on 1 rank and checkpoints every
10 steps; its report must name no http(s) address and load no script, and its headline table
must agree with events.jsonl (steps, generations, the recovery, the lost rank, checkpoints).
Debian's chromium then renders it headless: --dump-dom must show each chart's <svg> with drawn
lines or areas and the table's rows, and the screenshot (decoded here with zlib) must hold many
colours, the charts' among them, not a blank page. Also: a missing run directory and one without
events.jsonl are exit 2 naming the problem; garbage lines appended to events.jsonl are skipped
and counted (so are events of a known kind with a field missing or of the wrong type, while a
kind this build does not know is read and ignored), text from events is escaped, and a goodput
event and step phases are shown; a job
still running gets a report of what it wrote so far, and 100 damaged copies of the events file
(the events reader fuzz test's mutations) each get a report. Without chromium the browser part is
reported Skipped (exit 77)."""

import html.parser
import json
import os
import pathlib
import random
import signal
import struct
import subprocess
import tempfile
import time
import zlib

import harness
from harness import SMALL_MODEL, TROUPE, Job, fail, main, wait_until
import events_reader_fuzz_test  # noqa: E402  (its mutations of an events file)

CHROMIUM = "/usr/bin/chromium"
MUTATIONS = 100
CHART_IDS = ["chart-loss", "chart-throughput", "chart-phases", "chart-timeline"]
JOB = SMALL_MODEL + ["--metrics-port", "0", "--world", "2", "--steps", "30",
                     "--checkpoint-every", "10", "--eval-every", "10",
                     "--fault", "kill:rank=1:step=15"]


def report(args, timeout=60):
    p = subprocess.run([TROUPE, "report"] + args, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


class Page(html.parser.HTMLParser):
    """What the checks need from a report (or chromium's DOM of it): the headline table's rows,
    the ids of <svg> elements, and per chart the drawn shapes."""

    def __init__(self):
        super().__init__()
        # rows: the headline table's; run: the run table's ("The run": config, version, times);
        # labels: per chart, the text of its x-label and y-label; a shape's <title> is its "title"
        self.rows, self.run, self.svgs, self.labels, self.scripts = {}, {}, {}, {}, 0
        self._svg, self._cell, self._th, self._td, self._table = None, None, "", "", None
        self._label, self._shape, self._in_title = None, None, False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "script":
            self.scripts += 1
        elif tag == "svg":
            self._svg = a.get("id", "")
            self.svgs[self._svg] = {"polyline": [], "path": [], "rect": [], "circle": [],
                                    "polygon": []}
            self.labels[self._svg] = {}
        elif self._svg is not None and tag in ("polyline", "path", "rect", "circle", "polygon"):
            self.svgs[self._svg][tag].append(a)
            self._shape = a
        elif self._svg is not None and tag == "title":
            self._in_title = True
        elif self._svg is not None and tag == "text" and a.get("class") in ("x-label", "y-label"):
            self._label = a["class"]
            self.labels[self._svg][self._label] = ""
        elif tag == "table" and a.get("id") in ("headline", "run"):
            self._table = self.rows if a["id"] == "headline" else self.run
        elif self._table is not None and tag in ("th", "td"):
            self._cell = tag
            if tag == "th":
                self._th, self._td = "", ""

    def handle_endtag(self, tag):
        if tag == "svg":
            self._svg = None
        elif tag == "title":
            self._in_title = False
        elif tag == "text":
            self._label = None
        elif tag in ("polyline", "path", "rect", "circle", "polygon"):
            self._shape = None
        elif tag == "table":
            self._table = None
        elif tag == "td" and self._table is not None:
            self._table[self._th.strip()] = self._td.strip()
        if tag in ("th", "td"):
            self._cell = None

    def handle_data(self, data):
        if self._cell == "th":
            self._th += data
        elif self._cell == "td":
            self._td += data
        elif self._label is not None:
            self.labels[self._svg][self._label] += data
        elif self._in_title and self._shape is not None:
            self._shape["title"] = self._shape.get("title", "") + data


def parse(text):
    p = Page()
    p.feed(text)
    return p


def check_html_is_self_contained(text, what):
    lower = text.lower()
    for bad in ("http://", "https://", "<script", "<link", "@import", "url("):
        if bad in lower:
            at = lower.index(bad)
            fail(f"{what}: the report contains '{bad}': ...{text[max(0, at - 80):at + 80]}...")


def check_rows(rows, what, expect):
    for name, test in expect.items():
        if name not in rows:
            fail(f"{what}: the headline table has no row '{name}'; rows: {rows}")
        if not test(rows[name]):
            fail(f"{what}: headline row '{name}' is '{rows[name]}'")


def points_of(a):
    return [p for p in a.get("points", "").split() if "," in p]


def check_charts(page, what):
    for cid in CHART_IDS:
        if cid not in page.svgs:
            fail(f"{what}: no <svg id='{cid}'>; svgs: {list(page.svgs)}")
    for cid in ("chart-loss", "chart-throughput"):
        lines = [points_of(a) for a in page.svgs[cid]["polyline"]]
        if not lines or max(len(p) for p in lines) < 10:
            fail(f"{what}: {cid} draws no line of at least 10 points: {lines}")
    layers = [a for a in page.svgs["chart-phases"]["path"] if a.get("class") == "layer"]
    if not layers or not all(len(a.get("d", "")) > 100 for a in layers):
        fail(f"{what}: chart-phases has no stacked area drawn: {layers}")
    timeline = page.svgs["chart-timeline"]
    spans = [a for a in timeline["rect"] if a.get("class") == "span"]
    marks = [a for a in timeline["path"] + timeline["circle"] if a.get("class") == "mark"]
    # two generations and one recovery; a fault, a lost rank and 3 committed checkpoints
    if len(spans) < 3 or len(marks) < 5:
        fail(f"{what}: the timeline has {len(spans)} bars and {len(marks)} marks, expected at "
             f"least 3 and 5")


# Each chart's axes name their unit: (x, y); the timeline's lanes have none.
UNITS = {"chart-loss": ("(steps)", "(nats/token)"), "chart-throughput": ("(steps)", "(tokens/s)"),
         "chart-phases": ("(steps)", "(s)"), "chart-timeline": ("(s)", None)}


def check_units(page, what):
    for cid, (x_unit, y_unit) in UNITS.items():
        labels = page.labels.get(cid, {})
        if x_unit not in labels.get("x-label", ""):
            fail(f"{what}: {cid}'s x axis '{labels.get('x-label')}' does not name {x_unit}")
        if y_unit and y_unit not in labels.get("y-label", ""):
            fail(f"{what}: {cid}'s y axis '{labels.get('y-label')}' does not name {y_unit}")


def find_key(doc, key):
    """The first value under `key` anywhere in a nested config (None if there is none)."""
    if isinstance(doc, dict):
        if key in doc and not isinstance(doc[key], (dict, list)):
            return doc[key]
        for value in doc.values():
            found = find_key(value, key)
            if found is not None:
                return found
    return None


def utc(unix_ms):
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_ms // 1000))


def check_run_table(page, events, what):
    """The report names what produced the run: its config, the version, start, end, outcome."""
    start = next(e for e in events if e.get("event") == "job_start")
    done = [e for e in events if e.get("event") in ("job_done", "job_failed")][-1]
    cfg = start["config"]
    version = subprocess.run([TROUPE, "--version"], capture_output=True, text=True,
                             timeout=30).stdout.split()[1]
    lr = find_key(cfg, "lr")
    check_rows(page.run, what, {
        "model": lambda v: v.startswith(f"{find_key(cfg, 'n_layer')} layers, "
                                        f"{find_key(cfg, 'n_head')} heads, d_model "
                                        f"{find_key(cfg, 'd_model')}, context "
                                        f"{find_key(cfg, 'context')} tokens"),
        "layout": lambda v: v.startswith(f"dp {start['world']} ") and "tp 1" in v,
        "learning rate": lambda v: abs(float(v.split()[0]) - lr) <= 1e-9 * lr and "warmup" in v,
        "batch": lambda v: v.startswith(f"{cfg['batch']} sequences per step, micro-batch "
                                        f"{cfg['micro_batch']}"),
        "data": lambda v: v == find_key(cfg, "data"),
        "steps configured": lambda v: v.startswith(f"{cfg['steps']} "),
        "troupe": lambda v: v.startswith(version),
        "started": lambda v: v == utc(start["unix_ms"]),
        "ended": lambda v: v == utc(done["unix_ms"]),
        "outcome": lambda v: v.startswith(f"done, exit code {done['exit_code']}")
        if done["exit_code"] == 0 else "exit code" in v,
    })


def y_values(a):
    return [float(p.split(",")[1]) for p in points_of(a)]


def check_smoothed(page, what):
    """Each step's value is drawn, and beside it a centred mean over the same steps that moves
    less from one step to the next."""
    for cid in ("chart-loss", "chart-throughput"):
        lines = page.svgs[cid]["polyline"]
        raw = [a for a in lines if "(each step)" in a.get("title", "")]
        mean = [a for a in lines if ", mean of " in a.get("title", "")]
        if not raw or not mean:
            fail(f"{what}: {cid} lacks the raw line or its smoothed curve: "
                 f"{[a.get('title') for a in lines]}")
        r, m = y_values(raw[0]), y_values(mean[0])
        if len(r) != len(m) or len(r) < 10:
            fail(f"{what}: {cid}: {len(r)} raw points and {len(m)} smoothed")

        def wiggle(ys):
            return sum(abs(b - a) for a, b in zip(ys, ys[1:]))
        if not wiggle(m) < wiggle(r):
            fail(f"{what}: {cid}'s mean curve is not smoother than the raw values")


def phase_fills(page):
    return {a.get("title"): a.get("fill") for a in page.svgs["chart-phases"]["path"]
            if a.get("class") == "layer"}


def check_same_colours(pages):
    """A phase has one colour in every report, and no two phases share one."""
    seen = {}
    for what, page in pages:
        fills = phase_fills(page)
        if len(set(fills.values())) != len(fills):
            fail(f"{what}: two phases share a colour: {fills}")
        for name, fill in fills.items():
            if seen.setdefault(name, (what, fill))[1] != fill:
                fail(f"phase '{name}' is {seen[name][1]} in {seen[name][0]} but {fill} in {what}")
    print(f"phase colours agree across {len(pages)} reports: "
          f"{ {n: f for n, (_, f) in seen.items()} }", flush=True)


def decode_png(data):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("the screenshot is not a PNG")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    if depth != 8 or colour not in (2, 6) or interlace:
        fail(f"unexpected PNG format: depth {depth}, colour type {colour}, interlace {interlace}")
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prev = [], bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - bpp] if i >= bpp else 0
            up = prev[i]
            upleft = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + left) & 255
            elif f == 2:
                line[i] = (line[i] + up) & 255
            elif f == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif f == 4:
                p = left + up - upleft
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - upleft)
                pred = left if pa <= pb and pa <= pc else (up if pb <= pc else upleft)
                line[i] = (line[i] + pred) & 255
        rows.append([tuple(line[x * bpp:x * bpp + 3]) for x in range(width)])
        prev = line
    return width, height, rows


class Browser:
    """One headless chromium run with a fresh profile, in a process group of its own that is
    killed whatever happens."""

    @staticmethod
    def run(extra, url, tmp, timeout=90):
        profile = tempfile.mkdtemp(prefix="profile-", dir=tmp)
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", f"--user-data-dir={profile}"] + extra + [url]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            fail(f"chromium did not finish within {timeout}s: {' '.join(cmd)}")
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        if proc.returncode != 0:
            fail(f"chromium exited {proc.returncode}: {err.decode(errors='replace')[-2000:]}")
        return out.decode(errors="replace")


def check_in_browser(report_path, tmp):
    if not os.access(CHROMIUM, os.X_OK):
        harness.skip(f"{CHROMIUM} is not installed (apt-get install chromium; scripts/setup.sh "
                     f"does): the report is not rendered in a browser")
        return
    url = pathlib.Path(report_path).resolve().as_uri()
    dom = Browser.run(["--dump-dom"], url, tmp)
    page = parse(dom)
    check_charts(page, "chromium's DOM")
    if len(page.rows) < 15:
        fail(f"chromium's DOM has {len(page.rows)} headline rows: {page.rows}")
    shot = os.path.join(tmp, "report.png")
    Browser.run([f"--screenshot={shot}", "--window-size=1400,2400"], url, tmp)
    if not os.path.exists(shot):
        fail("chromium wrote no screenshot")
    with open(shot, "rb") as f:
        width, height, rows = decode_png(f.read())
    pixels = [p for row in rows[::2] for p in row[::2]]
    colours = set(pixels)
    white = sum(1 for p in pixels if p == (255, 255, 255))
    if len(colours) < 50 or white > 0.98 * len(pixels):
        fail(f"the screenshot ({width}x{height}) looks blank: {len(colours)} colours, "
             f"{white} of {len(pixels)} sampled pixels white")

    def near(c, ref):
        return all(abs(a - b) <= 12 for a, b in zip(c, ref))

    # The train loss line (#1f77b4) and the throughput line (#2ca02c) are on the page.
    for name, ref in (("blue (#1f77b4)", (0x1F, 0x77, 0xB4)), ("green (#2ca02c)", (0x2C, 0xA0, 0x2C))):
        if sum(1 for p in pixels if near(p, ref)) < 20:
            fail(f"the screenshot shows no {name} chart line: {len(colours)} colours")
    print(f"chromium rendered the report: {len(page.rows)} headline rows, {len(colours)} colours "
          f"in the screenshot", flush=True)


HEALTHY = ["--layers", "2", "--heads", "2", "--d-model", "96", "--context", "64", "--batch", "8",
           "--micro-batch", "2", "--no-progress", "--metrics-port", "0", "--world", "2",
           "--steps", "200", "--checkpoint-every", "50", "--eval-every", "50"]


def check_phase_pixels(report_text, events, tmp):
    """The phase chart of a healthy run, alone on a page in chromium: each phase's share of the
    chart's coloured pixels is its share of the steps' rank-seconds (within 5 points), so
    compute, the largest, has the most pixels."""
    if not os.access(CHROMIUM, os.X_OK):
        harness.skip(f"{CHROMIUM} is not installed: the phase chart's pixels are not counted")
        return
    start = report_text.index('<svg id="chart-phases"')
    chart = report_text[start:report_text.index("</svg>", start) + len("</svg>")]
    page = os.path.join(tmp, "phases.html")
    with open(page, "w", encoding="utf-8") as f:
        f.write('<!DOCTYPE html><html><body style="margin:0;background:#fff">' + chart +
                "</body></html>")
    shot = os.path.join(tmp, "phases.png")
    Browser.run([f"--screenshot={shot}", "--window-size=1000,400"],
                pathlib.Path(page).resolve().as_uri(), tmp)
    with open(shot, "rb") as f:
        _, _, rows = decode_png(f.read())
    fills = phase_fills(parse(report_text))
    rgb = {name: tuple(int(c[i:i + 2], 16) for i in (1, 3, 5)) for name, c in fills.items()}
    counts = {name: 0 for name in rgb}
    by_colour = {c: name for name, c in rgb.items()}
    for row in rows:
        for p in row:
            if p in by_colour:
                counts[by_colour[p]] += 1
    seconds = {name: 0.0 for name in rgb}
    for e in events:
        if e.get("event") == "step":
            for name, v in (e.get("phases") or {}).items():
                if name in seconds:
                    seconds[name] += v
    pixels, total = sum(counts.values()), sum(seconds.values())
    if pixels < 10000:
        fail(f"the phase chart shows only {pixels} pixels of phase colours: {counts}")
    shares = {n: (counts[n] / pixels, seconds[n] / total) for n in rgb}
    print("phase chart, pixels vs rank-seconds: " +
          ", ".join(f"{n} {p:.1%}/{s:.1%}" for n, (p, s) in shares.items()), flush=True)
    for name, (p, s) in shares.items():
        if abs(p - s) > 0.05:
            fail(f"phase '{name}' has {p:.1%} of the phase chart's pixels but {s:.1%} of the "
                 f"steps' rank-seconds: the chart does not draw what was measured")
    if max(counts, key=counts.get) != "compute":
        fail(f"the phase chart of a healthy run is not mostly compute: {counts}")


def test():
    if not TROUPE:
        fail("TROUPE_BIN is not set")
    with tempfile.TemporaryDirectory(prefix="troupe-report-") as tmp:
        # Exit 2, naming what is wrong, for a run directory that is not there or has no events.
        code, out = report([os.path.join(tmp, "nowhere")])
        if code != 2 or "does not exist" not in out:
            fail(f"a missing run directory: expected exit 2 naming it, got {code}: {out}")
        empty = os.path.join(tmp, "empty")
        os.mkdir(empty)
        code, out = report([empty])
        if code != 2 or "events.jsonl" not in out or os.listdir(empty):
            fail(f"a directory without events.jsonl: expected exit 2 naming events.jsonl and "
                 f"nothing written, got {code}: {out}; {os.listdir(empty)}")

        run_dir = os.path.join(tmp, "run")
        events = harness.run_ok("the faulted job", JOB, run_dir, timeout=300)
        kinds = [e.get("event") for e in events]
        if "rank_lost" not in kinds or kinds.count("generation") < 2:
            fail(f"the job lost no rank or did not recover: {kinds}")
        committed = kinds.count("checkpoint")
        code, out = report([run_dir])
        path = os.path.join(run_dir, "report.html")
        if code != 0 or not os.path.exists(path):
            fail(f"troupe report exited {code} or wrote no {path}: {out}")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        check_html_is_self_contained(text, "the faulted job")
        page = parse(text)
        if page.scripts:
            fail("the report has a <script> element")
        check_charts(page, "the faulted job's report")
        failed = kinds.count("checkpoint_failed") + kinds.count("checkpoint_abandoned")
        expect = {
            "steps": lambda v: v.startswith("30 of 30"),
            "status": lambda v: v.startswith("finished, exit code 0"),
            "generations": lambda v: v.startswith(f"{kinds.count('generation')} "),
            "recoveries": lambda v: v.startswith("1, median"),
            "ranks lost": lambda v: v == "1",
            "checkpoints": lambda v: v == f"{committed} committed, {failed} failed or abandoned",
            "malformed lines skipped": lambda v: v == "0",
            "final validation loss": lambda v: v.endswith("(step 30)"),
            "step time, median": lambda v: v.endswith(" ms") or v.endswith(" s"),
        }
        if "goodput" in kinds:  # the goodput accounting (issue 28) is in this build
            expect.update({"goodput": lambda v: v.endswith(" %"), "MFU": lambda v: v.endswith(" %")})
        else:
            expect["goodput, MFU"] = lambda v: v.startswith("not recorded")
        check_rows(page.rows, "the faulted job", expect)
        check_run_table(page, events, "the faulted job")
        check_units(page, "the faulted job")
        check_smoothed(page, "the faulted job")
        faulted = page
        check_in_browser(path, tmp)

        # A healthy run: its phase chart is mostly compute, in compute's colour of every report.
        healthy_dir = os.path.join(tmp, "healthy")
        healthy_events = harness.run_ok("the healthy job", HEALTHY, healthy_dir, timeout=300)
        code, out = report([healthy_dir])
        if code != 0:
            fail(f"troupe report of the healthy job exited {code}: {out}")
        with open(os.path.join(healthy_dir, "report.html"), encoding="utf-8") as f:
            healthy_text = f.read()
        healthy = parse(healthy_text)
        check_run_table(healthy, healthy_events, "the healthy job")
        check_units(healthy, "the healthy job")
        check_smoothed(healthy, "the healthy job")
        check_phase_pixels(healthy_text, healthy_events, tmp)

        # Garbage among the lines, hostile text, and the goodput accounting's fields.
        hostile = os.path.join(tmp, "hostile")
        os.mkdir(hostile)
        with open(os.path.join(run_dir, "events.jsonl"), "rb") as f:
            lines = f.read().splitlines()

        # The fakes are the run's own last event of their kind, changed: every field the report
        # reads them through is there, as the job writes it.
        def changed(kind, **fields):
            last = next(e for e in reversed(events) if e.get("event") == kind)
            return dict(last, **fields)

        end_ms = json.loads(lines[-1])["unix_ms"]
        fake_step = changed("step", step=31, loss=3.0, tokens_per_s=1000.0, world=1, step_s=0.01,
                            unix_ms=end_ms + 1,
                            phases={"compute": 0.006, "exposed_comm": 0.002, "bubble": 0.001,
                                    "redone": 0.001})
        fake_goodput = changed("goodput", goodput=0.875, mfu=0.0123, wall_s=1.0,
                               unix_ms=end_ms + 2)
        fake_fault = changed("fault", spec="<script>alert(1)</script>", step=31,
                             unix_ms=end_ms + 3)
        # A kind this build does not know: read, and nothing drawn of it.
        newer = {"event": "from_a_newer_troupe", "step": 99, "unix_ms": end_ms + 4}
        # Steps of a known kind that do not read: each is skipped whole (a step 32 would show).
        mistyped = dict(fake_step, step=32, loss="low")
        renamed = {k: v for k, v in dict(fake_step, step=32).items() if k != "tokens_per_s"}
        renamed["tokens_per_sec"] = 1000.0
        garbage = [b"this is not json", b"[1, 2, 3]", b"{\"event\": 5}", b"{\"truncated\": ",
                   b"[" * 100000, b"\xc3\x28\xff\xfe", b"{\"no_event\": true}",
                   json.dumps(mistyped).encode(), json.dumps(renamed).encode()]
        with open(os.path.join(hostile, "events.jsonl"), "wb") as f:
            body = lines[:5] + garbage[:3] + lines[5:] + garbage[3:]
            body += [json.dumps(x).encode() for x in (fake_step, fake_goodput, fake_fault, newer)]
            f.write(b"\n".join(body) + b"\n")
        out_path = os.path.join(tmp, "hostile-report.html")
        code, out = report([hostile, "-o", out_path])
        if code != 0 or not os.path.exists(out_path):
            fail(f"a report of events with garbage lines: exit {code}: {out}")
        with open(out_path, encoding="utf-8") as f:
            text = f.read()
        check_html_is_self_contained(text, "the hostile events")
        if "<script>alert" in text or "&lt;script&gt;alert(1)&lt;/script&gt;" not in text:
            fail("text from events.jsonl is not escaped into the report")
        hostile_page = parse(text)
        check_rows(hostile_page.rows, "the hostile events", {
            "malformed lines skipped": lambda v: v == str(len(garbage)),
            "events read": lambda v: v == str(len(lines) + 4),
            "goodput": lambda v: v == "87.5 %",
            "MFU": lambda v: v == "1.23 %",
            "steps": lambda v: v.startswith("31 of 30"),
        })
        check_same_colours([("the faulted job's report", faulted),
                            ("the healthy job's report", healthy),
                            ("the hostile events' report", hostile_page)])
        legend = text[text.index('id="chart-phases"'):text.index('id="chart-timeline"')]
        for phase in ("exposed_comm", "bubble", "redone"):
            if f">{phase}<" not in legend:
                fail(f"the phase chart has no legend entry for '{phase}'")

        # Damaged files (the events reader's fuzz mutations: cut lines, flipped bytes, deep
        # nesting, bytes that are not UTF-8): a report every time, never a crash.
        rng = random.Random(28)
        data = b"\n".join(lines) + b"\n"
        damaged = os.path.join(tmp, "damaged")
        os.mkdir(damaged)
        for i in range(MUTATIONS):
            with open(os.path.join(damaged, "events.jsonl"), "wb") as f:
                f.write(events_reader_fuzz_test.mutate(data, rng))
            out_path = os.path.join(tmp, "damaged.html")
            code, out = report([damaged, "-o", out_path])
            with open(out_path, encoding="utf-8") as f:
                text = f.read()
            if code != 0 or not all(f'id="{cid}"' in text for cid in CHART_IDS):
                fail(f"mutation {i} of the events file: exit {code} or charts missing: {out}")
            os.remove(out_path)

        # A job still running: the report says what it wrote so far.
        with Job(SMALL_MODEL + ["--metrics-port", "0", "--world", "2", "--steps", "100000",
                                "--checkpoint-every", "0"]) as job:
            wait_until(lambda: sum(1 for e in job.events() if e.get("event") == "step") >= 20,
                       120, "the running job's first 20 steps")
            code, out = report([job.run_dir, "-o", os.path.join(tmp, "running.html")])
            if job.proc.poll() is not None:
                fail(f"the long job ended early ({job.proc.returncode}): {job.output()}")
            if code != 0:
                fail(f"a report of a running job: exit {code}: {out}")
            with open(os.path.join(tmp, "running.html"), encoding="utf-8") as f:
                page = parse(f.read())
            check_rows(page.rows, "the running job", {
                "status": lambda v: v.startswith("no job_done event"),
                "steps": lambda v: int(v.split()[0]) >= 20 and " of 100000" in v,
            })
            job.kill_all()
            job.assert_no_process_left()


if __name__ == "__main__":
    main(test)
