"""`troupe top` on a terminal of a given size (issue 35), and the event lines of `troupe status`.

A job of 4 ranks trains (many steps; killed at the end) while `troupe top` runs in a tmux pane
of 80x24. The pane must show the first line of the summary, the job's state line, the rank
table's heading and a row for each rank, no line wider than the pane, and event lines that
start with the time, the kind and (for events that have one) the step. The pane is then resized
to 100x30 while top waits 5 s between frames: the summary is redrawn at once (SIGWINCH) to the
new width, with more events. At 80x9 the table does not fit: the state line stays, the ranks
that fit are shown and "... N more ranks" says how many are not. `troupe status` on a pipe
lists events the same way. Without tmux the terminal part is Skipped (exit 77)."""

import os
import re
import shutil
import subprocess

import harness
from harness import SMALL_MODEL, TROUPE, Job, fail, free_port, main, wait_until

WORLD = 4
EVENT = re.compile(r"^  (\d\d:\d\d:\d\d)  (\S+) +(step=(\d+))?")


class Pane:
    """One tmux server of our own (its own socket) with one pane running a command."""

    def __init__(self, command, columns, rows):
        self.socket = f"troupe-top-test-{os.getpid()}"
        self.tmux(["new-session", "-d", "-s", "top", "-x", str(columns), "-y", str(rows),
                   command])

    def tmux(self, args):
        return subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null"] + args,
                              capture_output=True, text=True, timeout=20)

    def lines(self):
        p = self.tmux(["capture-pane", "-p", "-t", "top"])
        if p.returncode != 0:
            fail(f"tmux capture-pane failed: {p.stderr}")
        return p.stdout.rstrip("\n").split("\n")

    def resize(self, columns, rows):
        p = self.tmux(["resize-window", "-t", "top", "-x", str(columns), "-y", str(rows)])
        if p.returncode != 0:
            fail(f"tmux resize-window failed: {p.stderr}")

    def close(self):
        # Ends the server, the pane and what runs in it (troupe top).
        self.tmux(["kill-server"])


def event_lines(lines):
    """The lines after "last events:", each as (time, kind, step or None)."""
    if "last events:" not in lines:
        return []
    out = []
    for line in lines[lines.index("last events:") + 1:]:
        if not line.strip():
            break
        m = EVENT.match(line)
        if not m:
            fail(f"an event line does not start with the time and the kind: '{line}'")
        out.append((m.group(1), m.group(2), m.group(4)))
    return out


def check_events(lines, what):
    """Every listed step event names its step right after its kind."""
    events = event_lines(lines)
    for _, kind, step in events:
        if kind in ("step", "validation", "checkpoint") and step is None:
            fail(f"{what}: a {kind} event line does not start with its step:\n" +
                 "\n".join(lines))
    return events


def frame_fits(pane, columns, rows, what):
    """The pane's text once it shows a whole summary of the training job (None until then)."""
    lines = pane.lines()
    text = "\n".join(lines)
    if len(lines) > rows or any(len(line) > columns for line in lines):
        fail(f"{what}: the pane holds more than {columns}x{rows}:\n{text}")
    if not lines or not lines[0].startswith("troupe status:"):
        return None
    if not any(line.startswith("job         training") for line in lines):
        return None
    return lines


def rank_rows(lines):
    head = [i for i, line in enumerate(lines) if line.startswith("rank member node host")]
    if not head:
        return None, []
    rows = []
    for line in lines[head[0] + 1:]:
        parts = line.split()
        if len(parts) < 3 or not parts[0].isdigit():
            break
        rows.append(line)
    return head[0], rows


def check_terminal(job):
    if shutil.which("tmux") is None:
        harness.skip("tmux is not installed (apt-get install tmux; scripts/setup.sh does): "
                     "troupe top is not checked on a terminal")
        return
    command = f"{TROUPE} top {job.run_dir} --interval-ms 5000; sleep 600"
    pane = Pane(command, 80, 24)
    try:
        def whole_table():
            lines = frame_fits(pane, 80, 24, "80x24")
            if not lines:
                return None
            _, rows = rank_rows(lines)
            return lines if len(rows) == WORLD and "last events:" in lines else None

        lines = wait_until(whole_table, 60, "troupe top at 80x24 to show the job training, "
                           f"its {WORLD} ranks and the last events")
        if not check_events(lines, "80x24"):
            fail("80x24: no event line is shown:\n" + "\n".join(lines))
        small_events = len(event_lines(lines))
        print(f"80x24: the summary fits, {WORLD} ranks and {small_events} events shown",
              flush=True)

        # Frames are 5 s apart: a redraw within 3 s of the resize is the resize's own.
        pane.resize(100, 30)

        def wider():
            lines = frame_fits(pane, 100, 30, "100x30")
            if not lines:
                return None
            head, rows = rank_rows(lines)
            # The host column grows with the width: the heading is 86 characters at 100.
            if head is None or len(lines[head].rstrip()) < 86 or len(rows) != WORLD:
                return None
            return lines if len(event_lines(lines)) > small_events else None

        lines = wait_until(wider, 3, "troupe top to redraw at 100x30 after the resize, with "
                           "the wider table and more events")
        check_events(lines, "100x30")
        print(f"100x30: redrawn at once, {len(event_lines(lines))} events shown", flush=True)

        pane.resize(80, 9)

        def crowded():
            lines = frame_fits(pane, 80, 9, "80x9")
            if not lines:
                return None
            more = [line for line in lines if re.match(r"^\.\.\. \d+ more ranks?\b", line)]
            head, rows = rank_rows(lines)
            if not more or head is None or not rows:
                return None
            hidden = int(more[0].split()[1])
            if hidden + len(rows) != WORLD:
                fail(f"80x9: {len(rows)} rank rows and '{more[0]}' do not make {WORLD} ranks")
            return lines

        wait_until(crowded, 3, "troupe top at 80x9 to keep the state line and the table "
                   "heading, with '... N more ranks'")
        print("80x9: the state line and the table stay, the ranks that do not fit are counted",
              flush=True)
    finally:
        pane.close()


def check_status_events(job):
    p = subprocess.run([TROUPE, "status", job.run_dir], capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        fail(f"troupe status exited {p.returncode}: {p.stdout}{p.stderr}")
    lines = p.stdout.split("\n")
    events = check_events(lines, "troupe status")
    steps = [e for e in events if e[1] == "step"]
    if not steps:
        fail("troupe status lists no step event:\n" + p.stdout)
    print(f"troupe status: {len(events)} event lines, step events name their step first",
          flush=True)


def test():
    if not TROUPE:
        fail("TROUPE_BIN is not set")
    with Job(SMALL_MODEL + ["--world", str(WORLD), "--steps", "1000000",
                            "--metrics-port", str(free_port()), "--checkpoint-every", "100",
                            "--eval-every", "50"]) as job:
        wait_until(lambda: sum(1 for e in job.events() if e.get("event") == "step") >= 20, 120,
                   "the job's first 20 steps")
        check_status_events(job)
        check_terminal(job)
        if job.proc.poll() is not None:
            fail(f"the job ended early ({job.proc.returncode}): {job.output()}")
        job.kill_all()
        job.assert_no_process_left()


if __name__ == "__main__":
    main(test)
