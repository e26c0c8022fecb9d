#!/usr/bin/env bash
# Renders the default training corpus: the King James Bible (1611, public domain),
# as plain English text from Debian's bible-kjv package. Usage: make_corpus.sh OUT
set -euo pipefail
out=${1:?usage: make_corpus.sh OUTPUT_FILE}
command -v bible >/dev/null || { echo "make_corpus: 'bible' not found; run scripts/setup.sh (package bible-kjv)" >&2; exit 1; }
mkdir -p "$(dirname "$out")"
# Drop the verse numbers so the model learns prose, not counters.
bible -l100000 "Genesis 1:1-Revelation 22:21" | sed -E 's/^ +[0-9]+ //' > "$out.tmp"
size=$(stat -c %s "$out.tmp")
[ "$size" -gt 1000000 ] || { echo "make_corpus: corpus is only $size bytes" >&2; exit 1; }
mv "$out.tmp" "$out"
