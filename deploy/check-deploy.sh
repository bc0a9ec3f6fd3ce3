#!/usr/bin/env bash
# check-deploy.sh: static checks of everything in deploy/, run by ctest as test_deploy and usable
# by hand after editing a unit or manifest:
#   deploy/check-deploy.sh [BIN_DIR]
# - systemd units: `systemd-analyze verify` in a scratch root (its own copy of the system's unit
#   directory, and the daemons from BIN_DIR at /usr/local/bin, or stand-ins when not built), with
#   any warning counted as a failure (verify exits 0 on keys it ignores), and `systemd-analyze
#   security --offline` exposure at most 2.0 for each unit;
# - sysusers file: `systemd-sysusers --dry-run` in the scratch root;
# - YAML of the Kubernetes and compose examples parses (python3 + PyYAML) and keeps its
#   hardening (podman-compose 1.0 has no side-effect-free `config`: even --dry-run creates the
#   network and the bind-mount sources, so it is not used here);
# - the image build script parses (bash -n) and answers --help.
# Exits 77 (ctest's skip) when systemd-analyze is missing.
set -euo pipefail

deploy=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
bin_dir=${1:-}
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed (apt-get install systemd)"; exit 77; }

root=$(mktemp -d "${TMPDIR:-/tmp}/tracerelay-deploy-check.XXXXXX")
trap 'rm -rf "$root"' EXIT

mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/etc/sysusers.d" "$root/bin" \
  "$root/usr/lib/systemd"
# verify resolves every dependency (sysinit.target...) inside the root, so it needs the units.
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
cp /bin/kill "$root/bin/kill"
for prog in tracerelay-service tracerelay-agent; do
  if [ -n "$bin_dir" ] && [ -x "$bin_dir/$prog" ]; then
    cp "$bin_dir/$prog" "$root/usr/local/bin/$prog"
  else
    printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/$prog"
    chmod 0755 "$root/usr/local/bin/$prog"
    echo "note: $prog not built; checking the unit against a stand-in"
  fi
done
cp "$deploy"/systemd/*.service "$root/etc/systemd/system/"

for unit in tracerelay-service.service tracerelay-agent.service; do
  out=$(systemd-analyze verify --man=no --root="$root" "$unit" 2>&1) && rc=0 || rc=$?
  if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    fail "systemd-analyze verify $unit (exit $rc):"; echo "$out" >&2
  else
    ok "systemd-analyze verify $unit"
  fi
  line=$(systemd-analyze security --offline=true --root="$root" --no-pager "$unit" 2>&1 |
    grep 'Overall exposure level' || true)
  score=$(echo "$line" | sed -n 's/.*: \([0-9.]*\) .*/\1/p')
  if [ -z "$score" ]; then
    fail "systemd-analyze security $unit printed no exposure level"
  elif awk -v s="$score" 'BEGIN { exit !(s <= 2.0) }'; then
    ok "$unit exposure $score (at most 2.0)"
  else
    fail "$unit exposure $score is above 2.0: a hardening option was lost"
  fi
  for opt in ProtectSystem=strict ProtectHome=yes PrivateTmp=yes NoNewPrivileges=yes \
    'CapabilityBoundingSet=' 'RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6' User=tracerelay; do
    grep -qx "$opt" "$deploy/systemd/$unit" || fail "$unit lacks '$opt'"
  done
done

if command -v systemd-sysusers >/dev/null; then
  cp "$deploy/systemd/tracerelay.sysusers.conf" "$root/etc/sysusers.d/tracerelay.conf"
  mkdir -p "$root/etc"; : >"$root/etc/passwd"; : >"$root/etc/group"
  if out=$(systemd-sysusers --dry-run --root="$root" 2>&1) && echo "$out" | grep -q tracerelay; then
    ok "sysusers: $(echo "$out" | grep -m1 tracerelay)"
  else
    fail "systemd-sysusers --dry-run:"; echo "$out" >&2
  fi
fi

if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  for f in kubernetes/agent-daemonset.yaml kubernetes/podmonitor.yaml compose/compose.yaml; do
    if python3 - "$deploy/$f" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = [d.get("kind", "compose" if "services" in d else "?") for d in docs]
assert kinds and "?" not in kinds, kinds
for d in docs:
    if d.get("kind") == "DaemonSet":
        c = d["spec"]["template"]["spec"]["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert {"/run/perfetto", "/etc/tracerelay/pki"} <= mounts, mounts
    if "services" in d:
        for name, s in d["services"].items():
            assert s.get("image", "").startswith("localhost/tracerelay-"), name
PY
    then ok "$f parses"; else fail "$f"; fi
  done
else
  echo "note: python3 with PyYAML not available; YAML not checked"
fi
if bash -n "$deploy/container/build-agent-image.sh" &&
  "$deploy/container/build-agent-image.sh" --help >/dev/null; then
  ok "build-agent-image.sh parses and answers --help"
else
  fail "build-agent-image.sh"
fi

if [ "$failures" -gt 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all deploy checks passed"
