#!/usr/bin/env python3
"""A C++ workload of a user's own, built the way a user builds it (issue 39): `cmake --install`
puts troupe's package under a prefix; examples/cpp_workload configures against that prefix
alone (find_package(troupe), nothing from the source tree), builds with warnings as errors,
and trains its linear regression at world 1, driven as the runtime drives a workload.
"""

import os
import re
import subprocess
import sys
import tempfile

from harness import TROUPE, fail

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def run(args, timeout=300, cwd=None):
    p = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    if p.returncode != 0:
        fail(f"{' '.join(args)} exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
    return p.stdout


def test():
    build = os.path.dirname(os.path.dirname(TROUPE))  # TROUPE is BUILD/cli/troupe
    with tempfile.TemporaryDirectory(prefix="troupe-cpp-workload-") as tmp:
        prefix = os.path.join(tmp, "prefix")
        run(["cmake", "--install", build, "--prefix", prefix])
        config = os.path.join(prefix, "lib", "cmake", "troupe", "troupe-config.cmake")
        header = os.path.join(prefix, "include", "troupe", "runtime", "workload", "workload.hpp")
        for path in (config, header):
            if not os.path.isfile(path):
                fail(f"cmake --install left no {path}")
        # A copy of the example outside the source tree: its includes can only come from the
        # installed package.
        example = os.path.join(tmp, "example")
        run(["cp", "-r", os.path.join(ROOT, "examples", "cpp_workload"), example])
        out = os.path.join(tmp, "build")
        run(["cmake", "-S", example, "-B", out, f"-DCMAKE_PREFIX_PATH={prefix}"])
        cache = open(os.path.join(out, "CMakeCache.txt")).read()
        found = re.search(r"^troupe_DIR:PATH=(.*)$", cache, re.M)
        if not found or os.path.realpath(found.group(1)) != os.path.realpath(os.path.dirname(config)):
            fail(f"the example found troupe at {found.group(1) if found else 'nowhere'}, not in "
                 f"{prefix}")
        run(["cmake", "--build", out])
        text = run([os.path.join(out, "linear_workload")], timeout=120)
        if "trained linear regression: 4 tensors" not in text:
            fail(f"the example did not train:\n{text}")
        print(f"ok: the example workload built against {prefix} and trained: "
              f"{text.strip().splitlines()[-1]}")


if __name__ == "__main__":
    test()
    print("1 passed")
    sys.exit(0)
