"""What the Python frontend's tests compare: a state_dict that a script saved with torch.save,
read back by Debian's torch in a subprocess (the tests themselves run without torch), and the
largest element-wise relative difference of two of them."""

import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
from harness import fail  # noqa: E402

PYTHON = "/usr/bin/python3"  # Debian's torch is for this interpreter (../shared/notes)


def have_torch():
    return subprocess.run([PYTHON, "-c", "import torch"], capture_output=True).returncode == 0


def state_of(path):
    """The state_dict saved at `path`, as {name: [floats]}."""
    out = subprocess.run([PYTHON, "-c", f"""
import json, torch
sd = torch.load({path!r})
print(json.dumps({{k: v.flatten().tolist() for k, v in sd.items()}}))
"""], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        fail(f"cannot read {path}: {out.stderr}")
    return json.loads(out.stdout)


def max_relative(a, b):
    """max |x - y| / max(|x|, |y|, 1e-3) over every element of two state dicts of one shape."""
    if sorted(a) != sorted(b):
        fail(f"the state dicts have different entries: {sorted(a)} and {sorted(b)}")
    worst = 0.0
    for k in a:
        if len(a[k]) != len(b[k]):
            fail(f"the state dicts differ in the size of {k}")
        for x, y in zip(a[k], b[k]):
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-3))
    return worst
