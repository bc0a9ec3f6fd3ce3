#!/bin/sh
# module-docs.sh: that docs/architecture.md names every module of relay/, as its module table
# does: a header x.h of folder F as `relay/F/x`, and a .c file with no header of its own (a part
# of another module, or the code behind a header of another name) as `x.c`. x_priv.h is module
# x's own and needs no name.
#
# Usage: tools/module-docs.sh [ROOT]   (default: the source tree this script is in)
# Prints each module or file the page does not name; exits 1 if there is one.
set -eu
root=${1:-$(dirname "$0")/..}
doc=$root/docs/architecture.md
bad=0
for f in "$root"/relay/*/*.h "$root"/relay/*/*.c; do
  stem=${f%.?}
  case $f in
  *_priv.h) continue ;;
  *.h) name=relay/${stem#"$root"/relay/} ;;
  *)
    [ ! -e "$stem.h" ] || continue
    name=$(basename "$f")
    ;;
  esac
  if ! grep -qF "\`$name\`" "$doc"; then
    echo "docs/architecture.md does not name \`$name\`"
    bad=1
  fi
done
exit "$bad"
