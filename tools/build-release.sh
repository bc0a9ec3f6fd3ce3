#!/usr/bin/env bash
# build-release.sh: builds an earlier tracerelay release from this repository's history, for
# the tests that run it beside this tree (test_upgrade.sh). The release's commit comes from
# RELEASES (tags may not travel with a clone); a clean `git worktree` of it in a temporary
# directory is built (Release) into the daemons and tools a mixed cluster needs, whose programs
# are kept in CACHE_DIR/COMMIT/bin: a second run finds them there and builds nothing.
# Prints that bin directory on its last line of stdout.
#
# Usage: build-release.sh SOURCE_DIR CACHE_DIR [VERSION]
#   VERSION: vX.Y.Z as RELEASES names it; default, the newest release listed whose version is
#   not SOURCE_DIR's own (CMakeLists.txt's project(VERSION)): the previous release.
# Exit 0, 77 when the history does not hold the release's commit (a shallow clone, or a source
# tree without .git: nothing to build from), 1 on any other failure (the build's log printed).
set -euo pipefail
SRC=$(cd "$1" && pwd)
CACHE=$2
WANT=${3:-}
say() { printf 'build-release: %s\n' "$*" >&2; }

OWN=v$(sed -n 's/^project(tracerelay VERSION \([0-9.]*\) .*/\1/p' "$SRC/CMakeLists.txt")
[ "$OWN" != v ] || { say "no project(tracerelay VERSION ...) in $SRC/CMakeLists.txt"; exit 1; }
LINE=$(awk -v want="$WANT" -v own="$OWN" '
  /^v[0-9]+\.[0-9]+\.[0-9]+ [0-9a-f]+$/ && length($2) == 40 {
    if (want != "" ? $1 == want : $1 != own) found = $0
  }
  END { if (found != "") print found }' "$SRC/RELEASES")
[ -n "$LINE" ] || { say "RELEASES names no release ${WANT:-other than $OWN}"; exit 1; }
VERSION=${LINE%% *}
COMMIT=${LINE#* }
OUT="$CACHE/$COMMIT"
TARGETS=(tracerelay-service tracerelay-agent tracerelay-loadgen tracerelay)

have_all() {
  local t
  for t in "${TARGETS[@]}"; do [ -x "$OUT/bin/$t" ] || return 1; done
  [ "$("$OUT/bin/tracerelay-service" --version)" = "tracerelay-service ${VERSION#v}" ]
}

mkdir -p "$CACHE"
# One build per commit at a time: a second caller waits for the first's programs.
exec 9>"$CACHE/$COMMIT.lock"
flock 9
if have_all; then
  say "$VERSION ($COMMIT) already built in $OUT/bin"
  echo "$OUT/bin"
  exit 0
fi

if ! git -C "$SRC" rev-parse --git-dir >/dev/null 2>&1; then
  say "$SRC is not a git checkout: $VERSION cannot be built from its history"; exit 77
fi
if ! git -C "$SRC" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
  say "$VERSION's commit $COMMIT is not in this clone's history (shallow? fetch with" \
    "--unshallow)"; exit 77
fi

TMP=$(mktemp -d /tmp/tracerelay-release.XXXXXX)
# Only our worktree is removed: `git worktree prune` would touch the clone's other worktrees.
cleanup() {
  git -C "$SRC" worktree remove --force "$TMP/src" 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT
say "building $VERSION ($COMMIT) in $TMP"
start=$(date +%s)
git -C "$SRC" worktree add --detach "$TMP/src" "$COMMIT" >"$TMP/worktree.log" 2>&1 ||
  { say "git worktree add failed:"; cat "$TMP/worktree.log" >&2; exit 1; }
if ! { cmake -S "$TMP/src" -B "$TMP/build" -G Ninja -DCMAKE_BUILD_TYPE=Release &&
       ninja -C "$TMP/build" "${TARGETS[@]}"; } >"$TMP/build.log" 2>&1; then
  say "the build of $VERSION failed (last 40 lines):"; tail -n 40 "$TMP/build.log" >&2; exit 1
fi
rm -rf "$OUT"
mkdir -p "$OUT/bin"
for t in "${TARGETS[@]}"; do cp "$TMP/build/bin/$t" "$OUT/bin/"; done
have_all || { say "the programs built do not say they are $VERSION"; exit 1; }
say "$VERSION built in $(($(date +%s) - start)) s into $OUT/bin"
echo "$OUT/bin"
