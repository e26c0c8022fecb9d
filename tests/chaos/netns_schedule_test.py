"""The netns harness's pure parts, without root: seeded random schedules are the same for the
same seed and survive a save and load unchanged; scenario files in chaos/scenarios/ are
valid; bad scenarios are refused naming what is wrong; and the classic-BPF programs the
faults load into cls_bpf match what they should, run on a small interpreter."""

import glob
import os
import tempfile

from netns_common import SCENARIOS, check, netns, scenario, step

KINDS = ("cut", "split", "drop", "loss", "rate", "flap", "isolate_coordinator", "delay")


def schedules():
    step("the same seed gives the same schedule; another seed another")
    a = scenario.random_schedule(seed=11, nodes=3, duration=120, kinds=KINDS, forwarder=["n1"])
    b = scenario.random_schedule(seed=11, nodes=3, duration=120, kinds=KINDS, forwarder=["n1"])
    c = scenario.random_schedule(seed=12, nodes=3, duration=120, kinds=KINDS, forwarder=["n1"])
    check(a == b and a.to_json() == b.to_json(), "seed 11 gave two different schedules")
    check(a != c, "seeds 11 and 12 gave the same schedule")
    check(len(a.faults) >= 10, f"only {len(a.faults)} faults in 120 s with a mean gap of 5 s")
    check({f.fault for f in a.faults} >= {"cut", "split", "loss"},
          f"kinds drawn: {[f.fault for f in a.faults]}")
    check(all(f.at < 120 and f.duration and f.at + f.duration <= 120.0005 for f in a.faults),
          "a fault outside the schedule's 120 s")
    check(all(f.fault != "delay" or f.target == "n1" for f in a.faults),
          "delay drawn for a link without forwarder")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.json")
        a.save(path)
        back = scenario.Scenario.load(path)
        check(back == a and back.plan() == a.plan(), "a saved schedule loads back different")
    plan = a.plan()
    check(plan == sorted(plan, key=lambda e: e[0]), "the plan is not in time order")
    check(sum(1 for e in plan if e[1] == "apply") == len(a.faults), "the plan misses applies")


def files():
    step("every scenario file in chaos/scenarios/ loads and is valid")
    paths = sorted(glob.glob(os.path.join(SCENARIOS, "*.json")))
    check(len(paths) >= 2, f"scenario files: {paths}")
    for p in paths:
        s = scenario.Scenario.load(p)
        check(s.faults and s.description, f"{p}: no faults or no description")
        print(f"{os.path.basename(p)}: {len(s.faults)} faults, ends at {s.end()} s", flush=True)


def refusals():
    step("bad scenarios are refused, naming what is wrong")
    bad = {
        '{"faults": [{"at": 1, "fault": "nuke", "target": "n1"}]}': "unknown fault 'nuke'",
        '{"faults": [{"at": 1, "fault": "loss", "target": "n1"}]}': "needs params ['probability']",
        '{"faults": [{"at": -1, "fault": "cut", "target": "n1"}]}': "'at' must be >= 0",
        '{"faults": [{"at": 1, "fault": "cut", "target": "n9"}]}': "no node 'n9'",
        '{"faults": [{"at": 1, "fault": "cut"}]}': "cut needs a target",
        '{"faults": [{"at": 1, "fault": "rate", "target": "n1", "params": {"mbit": 5, "x": 1}}]}':
            "does not take params ['x']",
        '{"faults": [{"at": 1, "fault": "cut", "target": "n1", "when": 3}]}':
            "unknown keys ['when']",
        '{"fault": []}': "a 'faults' list",
        'not json': "not JSON",
    }
    for text, want in bad.items():
        try:
            scenario.Scenario.loads(text, "t")
        except scenario.ScenarioError as e:
            check(want in str(e), f"{text}: refused with '{e}', want '{want}'")
        else:
            check(False, f"{text}: accepted")


def run_bpf(prog, frame, protocol, rand=0):
    """A classic-BPF interpreter for the instructions the harness uses; returns the verdict."""
    a = 0
    pc = 0
    ad_protocol = netns._ancillary(netns._SKF_AD_PROTOCOL)
    ad_random = netns._ancillary(netns._SKF_AD_RANDOM)
    while True:
        check(0 <= pc < len(prog), f"pc {pc} outside the program of {len(prog)}")
        code, jt, jf, k = prog[pc]
        if code == netns._LD_W_ABS:
            if k == ad_protocol:
                a = protocol
            elif k == ad_random:
                a = rand
            else:
                a = int.from_bytes(frame[k:k + 4], "big")
        elif code == netns._LD_H_ABS:
            a = int.from_bytes(frame[k:k + 2], "big")
        elif code == netns._JEQ_K:
            pc += jt if a == k else jf
        elif code == netns._JGE_K:
            pc += jt if a >= k else jf
        elif code == netns._RET_K:
            return k
        else:
            check(False, f"unexpected opcode {code:#x}")
        pc += 1


def frame(src_mac, ethertype=0x0800):
    src = bytes(int(x, 16) for x in src_mac.split(":"))
    return bytes(6) + src + ethertype.to_bytes(2, "big") + bytes(40)


def bpf():
    step("classic-BPF programs match what they should")
    macs = ["02:7e:c8:01:00:0b", "02:7e:c8:01:00:0c", "02:7e:c8:01:00:02"]
    prog = netns.bpf_source_mac_in(macs)
    check(netns._bytecode(prog).startswith(f"{len(prog)},"),
          "bytecode does not start with its length")
    for m in macs:
        check(run_bpf(prog, frame(m), 0x0800) == netns._MATCH, f"{m} not matched")
    for m in ["02:7e:c8:01:00:0d", "02:7e:c8:01:01:0b", "12:7e:c8:01:00:0b"]:
        check(run_bpf(prog, frame(m), 0x0800) == netns._NO_MATCH, f"{m} matched")
    drop = netns.bpf_all_but_arp()
    check(run_bpf(drop, frame(macs[0]), 0x0800) == netns._MATCH, "IPv4 not dropped")
    check(run_bpf(drop, frame(macs[0], 0x0806), 0x0806) == netns._NO_MATCH, "ARP dropped")
    loss = netns.bpf_random_ipv4(0.25)
    matched = sum(run_bpf(loss, frame(macs[0]), 0x0800, r) == netns._MATCH
                  for r in range(0, 2 ** 32, 2 ** 24))
    check(matched == 64, f"p=0.25 matched {matched} of 256 evenly spread random values, want 64")
    check(run_bpf(loss, frame(macs[0], 0x0806), 0x0806, 0) == netns._NO_MATCH, "ARP lost")
    check(run_bpf(netns.bpf_random_ipv4(1.0), frame(macs[0]), 0x0800, 2 ** 32 - 1) == netns._MATCH,
          "p=1 let a frame through")
    check(run_bpf(netns.bpf_random_ipv4(0.0), frame(macs[0]), 0x0800, 0) == netns._NO_MATCH,
          "p=0 dropped a frame")


def main():
    schedules()
    files()
    refusals()
    bpf()
    print("PASS", flush=True)


if __name__ == "__main__":
    main()
