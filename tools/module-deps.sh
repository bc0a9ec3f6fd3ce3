#!/bin/sh
# module-deps.sh: the include graph between the modules of service/ (or agent/), as docs/architecture.md
# describes it, and a check that it has no circle.
#
# A module is a header and the .c files that implement it, by name: x.h, x.c and x_*.c are
# module x (the longest such x that has a header decides: session_flush.c is the session's,
# link_server.c the link server's), and so is x_priv.h, the inside of module x for its own
# files. A .c file without such a header is a module of its own (main.c). Every other header
# of the directory that a file includes is an edge from its module to that one.
#
# relay/ is checked by folder instead: each of its folders (relay/base, relay/clock, ...) may
# include only its own headers and those of the folders that relay/CMakeLists.txt adds before it.
#
# Usage: tools/module-deps.sh [DIR]   (default service/; agent/ is checked the same way, relay/
# by folder)
# Prints the modules (or folders), those the others build on first; exits 1 and names the
# modules of a circle (tsort's message) if there is one, each file that includes another
# module's x_priv.h (only x.c and x_*.c may), or each relay/ include of a later folder.
set -eu
dir=${1:-$(dirname "$0")/../service}
if [ "$(basename "$(cd "$dir" && pwd)")" = relay ]; then
  order=$(sed -n 's/^add_subdirectory(\([a-z_]*\))$/\1/p' "$dir/CMakeLists.txt")
  rank() { echo "$order" | grep -n -x "$1" | cut -d: -f1; }
  bad=0
  for f in "$dir"/*/*.c "$dir"/*/*.h; do
    own=$(basename "$(dirname "$f")")
    for used in $(grep -o '^#include "relay/[a-z_]*/' "$f" | sed 's|.*relay/||; s|/$||' | sort -u); do
      if [ -z "$(rank "$used")" ] || [ "$(rank "$used")" -gt "$(rank "$own")" ]; then
        echo "${f#"$dir"/} (relay/$own) includes relay/$used/, which comes after it"
        bad=1
      fi
    done
  done
  [ "$bad" = 0 ] || exit 1
  echo "$order"
  exit 0
fi
pfx=$(basename "$(cd "$dir" && pwd)") # the include path's directory: service or agent
edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
included() {
  grep -o "^#include \"$pfx/[a-z_]*\\.h\"" "$1" | sed "s|.*$pfx/||; s|\\.h\"||; s|_priv\$||"
}
headers=$(for h in "$dir"/*.h; do basename "$h" .h | sed 's|_priv$||'; done | sort -u)
# The module of x.c or x_*.c: the longest header name x that fits, else the file's own name.
module_of() {
  name=$1 best=$1 len=0
  for m in $headers; do
    case $name in
    "$m" | "$m"_*) [ ${#m} -le "$len" ] || { best=$m len=${#m}; } ;;
    esac
  done
  echo "$best"
}
for f in "$dir"/*.c "$dir"/*.h; do
  case $f in
  *.h) mod=$(basename "$f" .h | sed 's|_priv$||') ;;
  *) mod=$(module_of "$(basename "$f" .c)") ;;
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
