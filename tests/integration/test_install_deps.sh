#!/usr/bin/env bash
# test_install_deps.sh: tools/install-deps.sh installs only what is missing and upgrades
# nothing already installed (issue 27): with apt-get, dpkg-query and id replaced by stand-ins
# on PATH (nothing is installed for real), `--demo` asks for no test-only package, a package
# already there is never named to apt-get, apt-get install carries --no-upgrade and
# --no-install-recommends, and with nothing missing apt is not run at all (not even update).
# tools/demo.sh asks for the demo's list only.
# Usage: test_install_deps.sh
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
W=$(mktemp -d /tmp/tracerelay-install-deps.XXXXXX)
fail() { echo "FAIL: $*"; echo "files kept in $W"; exit 1; }
mkdir "$W/bin"
# dpkg-query -W -f=... PKG: installed when PKG is listed in $W/installed.
cat >"$W/bin/dpkg-query" <<'SH'
#!/bin/sh
for p; do :; done
grep -qx "$p" "$INSTALLED" && printf 'install ok installed' && exit 0
exit 1
SH
printf '#!/bin/sh\necho "$*" >>"$APT_LOG"\n' >"$W/bin/apt-get"
printf '#!/bin/sh\necho 0\n' >"$W/bin/id"
chmod +x "$W/bin/"*
export APT_LOG=$W/apt.log INSTALLED=$W/installed PATH="$W/bin:$PATH"

# run LIST_OF_INSTALLED ARGS...: install-deps.sh with those packages installed; apt's calls in
# $W/apt.log.
run() {
  printf '%s\n' $1 >"$INSTALLED"; shift
  : >"$APT_LOG"
  bash "$TR_SRC/tools/install-deps.sh" "$@" >"$W/out" 2>&1 || fail "install-deps.sh $*: $(cat "$W/out")"
}

# Nothing installed: --demo asks for the demo's packages only.
run "" --demo
install=$(grep '^install ' "$APT_LOG") || fail "--demo ran no apt-get install: $(cat "$APT_LOG")"
for p in libuv1-dev libmbedtls-dev cmake ninja-build openssl iproute2; do
  [[ " $install " == *" $p "* ]] || fail "--demo does not install $p: $install"
done
for p in prometheus podman openssh-server debootstrap protobuf-compiler; do
  [[ " $install " != *" $p "* ]] || fail "--demo installs $p, which only the tests need: $install"
done
[[ "$install" == *" --no-upgrade "* && "$install" == *" --no-install-recommends "* ]] ||
  fail "apt-get install without --no-upgrade and --no-install-recommends: $install"
demo_list=${install#*--no-upgrade }
echo "ok: --demo: apt-get $install"

# Some installed: only the others are named; the full list adds the tests' packages.
run "cmake openssl systemd openssh-client"
install=$(grep '^install ' "$APT_LOG")
for p in cmake openssl systemd openssh-client; do
  [[ " $install " != *" $p "* ]] || fail "$p is installed already, yet named to apt-get: $install"
done
for p in libuv1-dev prometheus openssh-server debootstrap; do
  [[ " $install " == *" $p "* ]] || fail "the test list does not install $p: $install"
done
echo "ok: installed packages are not named again"

# Everything installed: apt is not run.
run "$demo_list" --demo
[ ! -s "$APT_LOG" ] || fail "apt-get ran with every package installed: $(cat "$APT_LOG")"
grep -q "nothing to do" "$W/out" || fail "no word that nothing was to do: $(cat "$W/out")"
echo "ok: nothing missing, apt not run"

grep -q 'tools/install-deps.sh" --demo' "$TR_SRC/tools/demo.sh" ||
  fail "tools/demo.sh does not ask for the demo's packages only"
rm -rf "$W"
echo "PASS: test_install_deps"
