#!/bin/sh
# module-names.sh: docs/contributing.md's naming rule for service/ and agent/: a public function is named
# tr_<file>_... after the file that defines it (an inline one in a header: after the header),
# the longest file name that fits deciding (tr_session_flush_* are session_flush.c's, the other
# tr_session_* session.c's).
#
# Usage: tools/module-names.sh [DIR]   (default service/)
# Prints each function defined in another file than its name says; exits 1 if there is one.
set -eu
dir=${1:-$(dirname "$0")/../service}
# Longest first, so that the first stem that fits a name is its owner.
stems=$(for f in "$dir"/*.c "$dir"/*.h; do basename "${f%.?}"; done | sort -u |
  awk '{ print length($0), $0 }' | sort -rn | cut -d' ' -f2)
defined() {
  case $1 in
  *.h) grep -oE '^static inline [a-z][a-zA-Z0-9_ *]*[ *]tr_[a-z0-9_]+\(' "$1" ;;
  *) grep -oE '^[a-z][a-zA-Z0-9_ *]*[ *]tr_[a-z0-9_]+\(' "$1" | grep -vE '^(static|typedef) ' ;;
  esac | grep -oE 'tr_[a-z0-9_]+\($' | tr -d '('
}
bad=0
for f in "$dir"/*.c "$dir"/*.h; do
  file=$(basename "${f%.?}")
  for name in $(defined "$f"); do
    owner=
    for s in $stems; do
      case ${name#tr_} in
      "$s" | "$s"_*) owner=$s && break ;;
      esac
    done
    if [ "$owner" != "$file" ]; then
      echo "$(basename "$f"): $name: named for ${owner:-no file of service/}, not for $file"
      bad=1
    fi
  done
done
exit $bad
