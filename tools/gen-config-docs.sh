#!/usr/bin/env bash
# gen-config-docs.sh: keeps docs/configuration.md's flag lists equal to the daemons' --help.
# Each list sits between `<!-- BEGIN PROGRAM --help -->` and `<!-- END PROGRAM --help -->`.
#   tools/gen-config-docs.sh BIN_DIR           rewrite the lists from BIN_DIR's programs
#   tools/gen-config-docs.sh BIN_DIR --check   exit 1 if a list differs (ctest test_docs_help)
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/.." && pwd)
BIN=$1
MODE=${2:-write}
DOC="$TR_SRC/docs/configuration.md"
new=$(mktemp)
trap 'rm -f "$new"' EXIT
python3 - "$DOC" "$BIN" >"$new" <<'PY'
import re, subprocess, sys
doc, bin_dir = sys.argv[1], sys.argv[2]
text = open(doc).read()
def block(m):
    prog = m.group(1)
    out = subprocess.run([f"{bin_dir}/{prog}", "--help"], check=True, capture_output=True,
                         text=True).stdout
    return f"<!-- BEGIN {prog} --help -->\n```\n{out.rstrip()}\n```\n<!-- END {prog} --help -->"
text = re.sub(r"<!-- BEGIN (\S+) --help -->.*?<!-- END \1 --help -->", block, text, flags=re.S)
sys.stdout.write(text)
PY
if [ "$MODE" = --check ]; then
  diff -u "$DOC" "$new" || {
    echo "docs/configuration.md differs from the daemons' --help: run tools/gen-config-docs.sh $BIN"
    exit 1
  }
  echo "docs/configuration.md matches --help"
else
  cp "$new" "$DOC"
fi
