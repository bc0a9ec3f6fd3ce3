#!/usr/bin/env bash
# test_deploy_refusals.sh: deploy/check-deploy.sh (test_deploy) refuses the two Kubernetes
# layouts issue 39 found unsafe, each in a copy of deploy/ changed in one place:
#   - the agent DaemonSet taking its key from one Secret (every node's key on every node:
#     one node compromised speaks for the fleet) instead of a hostPath of the node's own;
#   - no NetworkPolicy for the unauthenticated metrics port (networkpolicy.yaml left out).
# The unchanged copy passes, so each failure is the change's. Exits 77 as check-deploy.sh
# does without systemd-analyze, or without python3 and PyYAML.
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3 with PyYAML needed"; exit 77; }
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed"; exit 77; }
work=$(mktemp -d "${TMPDIR:-/tmp}/test_deploy_refusals.XXXXXX")
fail() { echo "FAIL: $*"; echo "(files kept in $work)"; exit 1; }

copy() { rm -rf "$work/$1"; cp -a "$TR_SRC/deploy" "$work/$1"; }
check() { # check DIR: check-deploy.sh's exit code; its output in DIR.log
  local rc=0
  "$work/$1/check-deploy.sh" >"$work/$1.log" 2>&1 || rc=$?
  echo "$rc"
}

copy same
[ "$(check same)" = 0 ] || fail "the unchanged deploy/ fails: $(grep FAIL "$work/same.log")"

copy secret
python3 - "$work/secret/kubernetes/agent-daemonset.yaml" <<'PY'
import sys, yaml
path = sys.argv[1]
docs = list(yaml.safe_load_all(open(path)))
for d in docs:
    if d and d.get("kind") == "DaemonSet":
        pod = d["spec"]["template"]["spec"]
        pod["volumes"] = [v if v["name"] != "pki" else
                          {"name": "pki", "secret": {"secretName": "tracerelay-agent-pki",
                                                     "defaultMode": 0o400}}
                          for v in pod["volumes"]]
yaml.safe_dump_all(docs, open(path, "w"))
PY
[ "$(check secret)" = 1 ] || fail "an agent key from a shared Secret passed check-deploy.sh"
grep -q "each node would hold every node's key" "$work/secret.log" ||
  fail "no reason naming the shared key: $(grep FAIL "$work/secret.log")"
echo "ok: an agent key from one Secret for every node is refused"

copy nopolicy
rm "$work/nopolicy/kubernetes/networkpolicy.yaml"
[ "$(check nopolicy)" = 1 ] || fail "metrics without a NetworkPolicy passed check-deploy.sh"
grep -q "no NetworkPolicy restricts who reaches port 9464" "$work/nopolicy.log" ||
  fail "no reason naming the metrics port: $(grep FAIL "$work/nopolicy.log")"
echo "ok: a metrics port without a NetworkPolicy is refused"
rm -rf "$work"
echo PASS
