#!/usr/bin/env bash
# test_package.sh: the Debian package (cmake/package.cmake). It configures a Release build of
# this source with the /usr prefix, builds the programs and man pages, runs `cpack -G DEB`, and
# installs the package with `dpkg -i` into a fresh Debian 12 root made by debootstrap (minbase,
# plus exactly the packages the .deb Depends on, plus systemd for the units' dependencies).
# There it checks: the tracerelay user and group exist, /etc/tracerelay holds the example
# configs and a pki directory, every program answers --version with the project's version,
# the man pages and units are where the package says, `systemd-analyze verify` passes on the
# installed units (any output is a failure, as in deploy/check-deploy.sh); then `dpkg --purge`
# must leave none of the package's files and no /etc/tracerelay behind.
#   tests/integration/test_package.sh SOURCE_DIR BUILD_DIR
# Needs root, debootstrap, dpkg-dev, help2man and the Debian mirror apt uses; exits 77 (skip)
# without them. BUILD_DIR/package-build (the build) and BUILD_DIR/package-root-*.tar (the
# debootstrap root, per list of packages) are kept between runs; each run unpacks a fresh root.
set -euo pipefail
SRC=$(cd "${1:?usage: test_package.sh SOURCE_DIR BUILD_DIR}" && pwd)
BUILD=$(cd "${2:?usage: test_package.sh SOURCE_DIR BUILD_DIR}" && pwd)
PROGRAMS=(tracerelay-agent tracerelay-service tracerelay tracerelay-loadgen)
UNITS=(tracerelay-agent.service tracerelay-service.service)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root (chroot, dpkg -i)"
for tool in debootstrap dpkg-shlibdeps help2man cpack systemd-analyze; do
  command -v "$tool" >/dev/null || skip "$tool not installed (tools/install-deps.sh installs it)"
done

# The package.
PKG_BUILD=$BUILD/package-build
cmake -S "$SRC" -B "$PKG_BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=/usr \
  -DCMAKE_SKIP_INSTALL_ALL_DEPENDENCY=ON >"$BUILD/package-build.log" 2>&1 ||
  fail "cmake failed: $(tail -5 "$BUILD/package-build.log")"
ninja -C "$PKG_BUILD" "${PROGRAMS[@]}" man >>"$BUILD/package-build.log" 2>&1 ||
  fail "build failed: $(tail -5 "$BUILD/package-build.log")"
rm -f "$PKG_BUILD"/*.deb
(cd "$PKG_BUILD" && cpack -G DEB >>"$BUILD/package-build.log" 2>&1) ||
  fail "cpack failed: $(tail -5 "$BUILD/package-build.log")"
DEB=$(ls "$PKG_BUILD"/tracerelay_*_amd64.deb)
VERSION=$(dpkg-deb -f "$DEB" Version)
echo "package: $(basename "$DEB"), $(stat -c %s "$DEB") bytes"
echo "Depends: $(dpkg-deb -f "$DEB" Depends)"

# A fresh root with what the package depends on (names only; dpkg -i checks the versions).
DEPENDS=$(dpkg-deb -f "$DEB" Depends | tr ',' '\n' | sed 's/[[:space:]]*(.*//; s/[[:space:]]//g' |
  grep -v '^$' | sort -u | paste -sd, -)
INCLUDE="systemd,$DEPENDS"
MIRROR=$(sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
CACHE=$BUILD/package-root-$(echo "$INCLUDE" | md5sum | cut -c1-12).tar
if [ ! -f "$CACHE" ]; then
  tmp=$(mktemp -d /tmp/tracerelay-debootstrap.XXXXXX)
  echo "debootstrap bookworm from $MIRROR (once; cached in $CACHE)"
  debootstrap --variant=minbase --include="$INCLUDE" bookworm "$tmp" "$MIRROR" \
    >"$BUILD/package-debootstrap.log" 2>&1 ||
    { rm -rf "$tmp"; skip "debootstrap failed (no mirror?): $(tail -2 "$BUILD/package-debootstrap.log")"; }
  tar -C "$tmp" -cf "$CACHE.part" . && mv "$CACHE.part" "$CACHE"
  rm -rf "$tmp"
fi
ROOT=$(mktemp -d /tmp/tracerelay-package-root.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
tar -C "$ROOT" -xf "$CACHE"
in_root() { chroot "$ROOT" "$@"; }

# Install.
cp "$DEB" "$ROOT/tmp/tracerelay.deb"
in_root dpkg -i /tmp/tracerelay.deb >"$BUILD/package-install.log" 2>&1 ||
  fail "dpkg -i failed: $(cat "$BUILD/package-install.log")"
in_root getent passwd tracerelay >/dev/null || fail "no tracerelay user after install"
in_root getent group tracerelay >/dev/null || fail "no tracerelay group after install"
for f in /etc/tracerelay/agent.env.example /etc/tracerelay/service.env.example; do
  [ -f "$ROOT$f" ] || fail "$f missing"
done
[ "$(in_root stat -c '%a %U %G' /etc/tracerelay/pki)" = "750 root tracerelay" ] ||
  fail "/etc/tracerelay/pki is $(in_root stat -c '%a %U %G' /etc/tracerelay/pki), not 750 root tracerelay"
for prog in "${PROGRAMS[@]}"; do
  out=$(in_root "/usr/bin/$prog" --version) || fail "$prog --version failed"
  [ "$out" = "$prog $VERSION" ] || fail "$prog --version printed '$out', not '$prog $VERSION'"
  page=$ROOT/usr/share/man/man1/$prog.1.gz
  zcat "$page" 2>/dev/null | grep -q '^\.SH OPTIONS\|^\.SH DESCRIPTION' || fail "man page $page missing or empty"
done
for unit in "${UNITS[@]}"; do
  [ -f "$ROOT/usr/lib/systemd/system/$unit" ] || fail "$unit not installed"
  grep -q "ExecStart=/usr/bin/" "$ROOT/usr/lib/systemd/system/$unit" ||
    fail "$unit does not start /usr/bin/..."
  out=$(systemd-analyze verify --man=no --root="$ROOT" "/usr/lib/systemd/system/$unit" 2>&1) &&
    rc=0 || rc=$?
  [ "$rc" = 0 ] && [ -z "$out" ] || fail "systemd-analyze verify $unit (exit $rc): $out"
  echo "ok: $unit verified"
done
echo "ok: installed; user, configs, --version ($VERSION), man pages"

# Purge.
dpkg-deb -c "$DEB" | awk '{print $6}' | sed 's/^\.//' | grep -v '/$' >"$BUILD/package-files.txt"
in_root dpkg --purge tracerelay >"$BUILD/package-purge.log" 2>&1 ||
  fail "dpkg --purge failed: $(cat "$BUILD/package-purge.log")"
left=$(while read -r f; do [ ! -e "$ROOT$f" ] || echo "$f"; done <"$BUILD/package-files.txt")
[ -z "$left" ] || fail "left after purge: $left"
[ ! -e "$ROOT/etc/tracerelay" ] || fail "/etc/tracerelay left after purge: $(ls -la "$ROOT/etc/tracerelay")"
in_root dpkg -s tracerelay >/dev/null 2>&1 && fail "dpkg still knows tracerelay after purge"
echo "ok: purged, nothing left"
echo "PASS: test_package"
