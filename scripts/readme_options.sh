#!/usr/bin/env bash
# Writes `troupe help options` (the settings table, runtime/settings.cpp) into README.md
# between its <!-- options: begin --> and <!-- options: end --> markers.
# tests/integration/first_hour_test.py fails while the two differ.
set -euo pipefail
cd "$(dirname "$0")/.."
troupe=${TROUPE_BIN:-build/cli/troupe}
listed=$("$troupe" help options)
python3 - "$listed" <<'PY'
import re, sys
listed = sys.argv[1] + "\n"
with open("README.md") as f:
    text = f.read()
block = "<!-- options: begin -->\n```text\n" + listed + "```\n<!-- options: end -->"
new, n = re.subn(r"<!-- options: begin -->.*?<!-- options: end -->", lambda m: block, text,
                 flags=re.S)
if n != 1:
    sys.exit("README.md needs one <!-- options: begin --> ... <!-- options: end --> pair")
with open("README.md", "w") as f:
    f.write(new)
PY
