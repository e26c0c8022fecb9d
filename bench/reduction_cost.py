#!/usr/bin/python3
"""What --reduction exact costs a job's step against --reduction fast: real `troupe run` jobs,
the two modes alternated round after round on this machine so that drift hits both, each
run's median step (steps 6 on) from events.jsonl, then the median over rounds of each mode
and of the per-round ratios exact / fast.

usage: bench/reduction_cost.py [--troupe build/cli/troupe] [--world 2] [--steps 60]
                               [--rounds 5] [-- extra troupe run options, e.g. --nodes 2]"""

import argparse
import statistics

from step_split import one_run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--troupe", default="build/cli/troupe")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("extra", nargs="*", help="more `troupe run` options (after --)")
    a = p.parse_args()
    rows = []
    for i in range(a.rounds):
        # Which mode goes first alternates too: a round's second run finds warmer caches.
        order = ["fast", "exact"] if i % 2 == 0 else ["exact", "fast"]
        got = {mode: one_run(a.troupe, a.world, a.steps, a.extra + ["--reduction", mode])
               for mode in order}
        rows.append(got)
        f, e = got["fast"], got["exact"]
        print(f"round {i}: fast step {f['step_s'] * 1e3:.1f} ms (comm {f['comm_s'] * 1e3:.1f}), "
              f"exact {e['step_s'] * 1e3:.1f} ms (comm {e['comm_s'] * 1e3:.1f}, compute "
              f"{e['compute_s'] * 1e3:.1f} vs {f['compute_s'] * 1e3:.1f}); "
              f"ratio {e['step_s'] / f['step_s']:.3f}", flush=True)

    def med(mode, key):
        return statistics.median(r[mode][key] for r in rows)

    ratio = statistics.median(r["exact"]["step_s"] / r["fast"]["step_s"] for r in rows)
    print(f"median of {a.rounds} rounds, world {a.world} {' '.join(a.extra)}: "
          f"fast {med('fast', 'step_s') * 1e3:.1f} ms/step ({med('fast', 'tokens_per_s'):.0f} tok/s), "
          f"exact {med('exact', 'step_s') * 1e3:.1f} ms/step ({med('exact', 'tokens_per_s'):.0f} tok/s); "
          f"exact / fast per round: median {ratio:.3f} ({(ratio - 1) * 100:+.1f}%)")


if __name__ == "__main__":
    main()
