"""Classic BPF programs for cls_bpf. Split and one-way drop, and loss on a link with neither a
forwarder nor netem, match frames with these and mirred them to a downed ifb (faults.py; there
is no gact here to drop with).

A program is a list of (code, jt, jf, k) instructions; `_bytecode` renders it as tc's
`bytecode` argument. tests/chaos/netns_schedule_test.py runs them in an interpreter, without
root.
"""

_LD_W_ABS, _LD_H_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x28, 0x15, 0x35, 0x06
_SKF_AD_OFF = -0x1000
_SKF_AD_PROTOCOL, _SKF_AD_RANDOM = 0, 56
_MATCH, _NO_MATCH = 0xFFFFFFFF, 0   # cls_bpf: -1 = the filter matches (its action runs)


def _ancillary(off):
    return (_SKF_AD_OFF + off) & 0xFFFFFFFF


def _bytecode(prog):
    """tc's `bytecode` argument: "N,code jt jf k,..." ."""
    return ",".join([str(len(prog))] + [f"{c} {jt} {jf} {k & 0xFFFFFFFF}" for c, jt, jf, k in prog])


def bpf_all_but_arp():
    """Matches every frame but ARP (one-way drop)."""
    return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
            (_JEQ_K, 0, 1, 0x0806),
            (_RET_K, 0, 0, _NO_MATCH),
            (_RET_K, 0, 0, _MATCH)]


def bpf_random_ipv4(probability):
    """Matches an IPv4 frame with `probability` (the kernel's prandom: not seeded)."""
    threshold = int(round(probability * 2 ** 32))
    if threshold >= 2 ** 32:
        return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
                (_JEQ_K, 0, 1, 0x0800),
                (_RET_K, 0, 0, _MATCH),
                (_RET_K, 0, 0, _NO_MATCH)]
    return [(_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_PROTOCOL)),
            (_JEQ_K, 0, 3, 0x0800),                          # not IPv4 -> no match
            (_LD_W_ABS, 0, 0, _ancillary(_SKF_AD_RANDOM)),
            (_JGE_K, 1, 0, threshold),                       # rand >= p * 2^32 -> no match
            (_RET_K, 0, 0, _MATCH),
            (_RET_K, 0, 0, _NO_MATCH)]


def bpf_source_mac_in(macs):
    """Matches a frame whose Ethernet source is one of `macs` (cls_bpf sees the frame from its
    MAC header on egress and, pushed back by cls_bpf, on ingress)."""
    prog = []
    n = len(macs)
    for i, mac in enumerate(macs):
        b = bytes(int(x, 16) for x in mac.split(":"))
        hi, lo = int.from_bytes(b[:4], "big"), int.from_bytes(b[4:], "big")
        left = n - i - 1                       # MAC blocks after this one (4 instructions each)
        to_match = 4 * left + 1                # from this block's last jump to the match return
        prog += [(_LD_W_ABS, 0, 0, 6),
                 (_JEQ_K, 0, 2, hi),           # no: skip to the next block
                 (_LD_H_ABS, 0, 0, 10),
                 (_JEQ_K, to_match, 0, lo)]
    prog += [(_RET_K, 0, 0, _NO_MATCH), (_RET_K, 0, 0, _MATCH)]
    return prog

