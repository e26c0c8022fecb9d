"""The summary `troupe run` prints at the end says the world the job finished on: a job of 4
that loses rank 3 (kill -9) and shrinks finishes on 3 ranks and says "world 3, configured 4"
(it used to say "world 4"); a calm job says only its world. The summary's figures agree with
events.jsonl (the last generation's world, the steps committed)."""

import re

from harness import SMALL_MODEL, fail, last_job, main, run_to_end

STEPS = 12
BASE = SMALL_MODEL + ["--metrics-port", "0", "--step-timeout-ms", "20000"]
STEPS_LINE = re.compile(r"^\s*steps\s+(\d+) of (\d+) \((.*)\)\s*$", re.MULTILINE)


def summary_world(name, output):
    """The steps line of the summary: (steps done, steps, what the parentheses say)."""
    lines = STEPS_LINE.findall(output)
    if len(lines) != 1:
        fail(f"{name}: expected one 'steps N of M (world ...)' line in the summary:\n{output}")
    done, total, world = lines[0]
    return int(done), int(total), world


def test():
    # Shrink: rank 3 of 4 is killed as step 5 begins; the survivors finish on 3 ranks.
    code, events, output = run_to_end(BASE + ["--world", "4", "--steps", str(STEPS), "--fault",
                                             "kill:rank=3:step=5"], timeout=300)
    if code != 0:
        fail(f"the job that lost a rank exited {code}:\n{output}")
    events = last_job(events)
    generations = [e for e in events if e.get("event") == "generation"]
    if not any(e.get("event") == "rank_lost" for e in events) or not generations:
        fail(f"no rank was lost, or no generation was opened:\n{output}")
    if generations[-1]["world"] != 3:
        fail(f"expected the job to end on 3 ranks, its generations had "
             f"{[g['world'] for g in generations]}")
    done, total, world = summary_world("shrunk", output)
    if (done, total) != (STEPS, STEPS) or world != "world 3, configured 4":
        fail(f"the summary says 'steps {done} of {total} ({world})', expected "
             f"'steps {STEPS} of {STEPS} (world 3, configured 4)':\n{output}")
    print(f"shrunk: the summary says 'steps {done} of {total} ({world})'", flush=True)

    # Calm: the world it was configured with, and nothing else.
    code, events, output = run_to_end(BASE + ["--world", "2", "--steps", "3"], timeout=300)
    if code != 0:
        fail(f"the calm job exited {code}:\n{output}")
    done, total, world = summary_world("calm", output)
    if (done, total, world) != (3, 3, "world 2"):
        fail(f"the calm job's summary says 'steps {done} of {total} ({world})', expected "
             f"'steps 3 of 3 (world 2)':\n{output}")
    print(f"calm: the summary says 'steps {done} of {total} ({world})'", flush=True)


if __name__ == "__main__":
    main(test)
