#!/bin/sh
# module-deps.sh: the include graph between the modules of service/ (or agent/), as docs/architecture.md
# describes it, and a check that it has no circle.
#
# A module is a header and the .c files that implement it: x.h is module x, and a .c file
# belongs to the module of the first service/ header it includes (session_flush.c and
# session_stats.c are the session's; service.c and main.c are the daemon's), and x_priv.h, the
# inside of module x for its own files, is module x too. Every other service/ header a file
# includes is an edge from its module to that one.
#
# Usage: tools/module-deps.sh [DIR]   (default service/; agent/ is checked the same way)
# Prints the modules, those the others build on first; exits 1 and names the modules of a
# circle (tsort's message) if there is one, or each file that includes another module's
# x_priv.h (only x.c and x_*.c may).
set -eu
dir=${1:-$(dirname "$0")/../service}
pfx=$(basename "$(cd "$dir" && pwd)") # the include path's directory: service or agent
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
included() {
  grep -o "^#include \"$pfx/[a-z_]*\\.h\"" "$1" | sed "s|.*$pfx/||; s|\\.h\"||; s|_priv\$||"
}
for f in "$dir"/*.c "$dir"/*.h; do
  case $f in
  *.h) mod=$(basename "$f" .h | sed 's|_priv$||') ;;
  *) mod=$(included "$f" | head -n 1) ;;
  esac
  for dep in $(included "$f"); do
    [ "$dep" = "$mod" ] || echo "$mod $dep"
  done
done | sort -u >"$edges"
outsiders=$(for f in "$dir"/*.c "$dir"/*.h; do
  for m in $(grep -o "^#include \"$pfx/[a-z_]*_priv\\.h\"" "$f" | sed "s|.*$pfx/||; s|_priv\\.h\"||"); do
    case $(basename "$f") in
    "$m".c | "$m"_*.c) ;;
    *) echo "$(basename "$f") includes ${m}_priv.h: only $m.c and ${m}_*.c may" ;;
    esac
  done
done)
if [ -n "$outsiders" ]; then
  echo "$outsiders"
  exit 1
fi
# tsort lists a module before those it includes; reversed, the base comes first.
order=$(tsort "$edges") || exit 1
echo "$order" | tac
