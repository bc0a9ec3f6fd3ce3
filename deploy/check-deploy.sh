#!/usr/bin/env bash
# check-deploy.sh: static checks of everything in deploy/, run by ctest as test_deploy and usable
# by hand after editing a unit or manifest:
#   deploy/check-deploy.sh [BIN_DIR]
# - systemd units: `systemd-analyze verify` in a scratch root (its own copy of the system's unit
#   directory, and the daemons from BIN_DIR at /usr/local/bin, or stand-ins when not built), with
#   any warning counted as a failure (verify exits 0 on keys it ignores), and `systemd-analyze
#   security --offline` exposure at most 2.0 for each unit;
# - sysusers file: `systemd-sysusers --dry-run` in the scratch root;
# - YAML of the Kubernetes (kubernetes/*.yaml, kubernetes/tiers/*.yaml) and compose examples
#   parses (python3 + PyYAML) and keeps its hardening (yaml_check below says what is checked;
#   podman-compose 1.0 has no side-effect-free `config`: even --dry-run creates the network and
#   the bind-mount sources, so it is not used here); the tiered layout's files agree with each
#   other; with BIN_DIR, every --flag in the manifests is in its daemon's --help (the service's
#   tier flags are only noted while the binary has no --upstream);
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

# yaml_check MODE ARGS: the Kubernetes and compose checks, in Python (PyYAML).
#   file F             F parses; every workload keeps its hardening (read-only root, no
#                      privilege, all capabilities dropped, RuntimeDefault seccomp, no
#                      service-account token, a memory limit, /healthz and /readyz probes);
#                      every path in its args and every socket it creates lies in a volume it
#                      mounts; every $(VAR) is in its env; Services select a workload of F.
#   tiers DIR          the tiered layout's files agree: regionals dial a Service that exists,
#                      agents dial a regional pod that exists (per-pod DNS of its headless
#                      Service), the root's --relay-allow names those pods.
#                      An agent's --key is in a hostPath volume (its node's own), never in
#                      a Secret, projected or ConfigMap volume, which every pod shares.
#   flags BIN_DIR F..  every --flag in the manifests' args is in the program's --help.
#   netpol F..         every workload serving --metrics-listen has a NetworkPolicy that lets
#                      only named sources reach port 9464.
read -r -d '' yaml_check <<'PY' || true
import os, re, subprocess, sys, yaml

def docs_of(path):
    return [d for d in yaml.safe_load_all(open(path)) if d]

def workloads(docs):
    return [d for d in docs if d.get("kind") in ("DaemonSet", "Deployment", "StatefulSet")]

def pods_of(st):
    """The pod names of a StatefulSet."""
    return {"%s-%d" % (st["metadata"]["name"], i) for i in range(st["spec"].get("replicas", 1))}

def containers_of(w):
    return w["spec"]["template"]["spec"]["containers"]

def program_of(c):
    """The daemon a container runs: its command, else its image's name."""
    if c.get("command"):
        return os.path.basename(c["command"][0])
    m = re.search(r"(tracerelay-(?:agent|service))", c.get("image", ""))
    return m.group(1) if m else "?"

def flag_values(args):
    """(flag, value or None) for each --flag of an argv list."""
    out = []
    for i, a in enumerate(args):
        if a.startswith("--"):
            v = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else None
            out.append((a, v))
    return out

def check_workload(w, errors):
    name = "%s/%s" % (w["kind"], w["metadata"]["name"])
    def need(cond, what):
        if not cond:
            errors.append("%s: %s" % (name, what))
    spec = w["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"].get("labels", {})
    sel = spec["selector"]["matchLabels"]
    need(all(labels.get(k) == v for k, v in sel.items()), "selector does not match its pod labels")
    need(pod.get("automountServiceAccountToken") is False,
         "automountServiceAccountToken is not false")
    for k in ("hostNetwork", "hostPID", "hostIPC"):
        need(not pod.get(k), "%s is set" % k)
    pod_sc = pod.get("securityContext", {})
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for v in volumes.values():
        if "secret" in v:
            mode = v["secret"].get("defaultMode", 0o644)
            need(mode & 0o037 == 0, "Secret volume %s is readable beyond owner and group (mode %o)"
                 % (v["name"], mode))
    for c in pod["containers"]:
        cname = "container " + c["name"]
        sc = c.get("securityContext", {})
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        need(seccomp == "RuntimeDefault", "%s: seccomp profile is not RuntimeDefault" % cname)
        need(sc.get("readOnlyRootFilesystem") is True, "%s: root filesystem not read-only" % cname)
        need(sc.get("allowPrivilegeEscalation") is False,
             "%s: allowPrivilegeEscalation not false" % cname)
        need(not sc.get("privileged"), "%s: privileged" % cname)
        caps = sc.get("capabilities", {})
        need("ALL" in caps.get("drop", []) and not caps.get("add"),
             "%s: capabilities not all dropped" % cname)
        need("memory" in c.get("resources", {}).get("limits", {}), "%s: no memory limit" % cname)
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            need(c.get(probe, {}).get("httpGet", {}).get("path") == path,
                 "%s: %s does not ask %s" % (cname, probe, path))
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        for m in mounts.values():
            need(m["name"] in volumes, "%s: mounts undefined volume %s" % (cname, m["name"]))
        env = {e["name"] for e in c.get("env", [])}
        argv = c.get("command", []) + c.get("args", [])
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(argv)):
            need(ref in env, "%s: $(%s) is not in its env" % (cname, ref))
        prog = program_of(c)
        if prog == "tracerelay-agent":
            need({"/run/perfetto", "/etc/tracerelay/pki"} <= set(mounts),
                 "%s: mounts %s" % (cname, sorted(mounts)))
            # An agent's key is its node's identity: from a volume every pod of the workload
            # shares (Secret, projected, ConfigMap), every node would hold every node's key.
            for flag, value in flag_values(c.get("args", [])):
                if flag != "--key" or not value:
                    continue
                under = [p for p in mounts if value.startswith(p.rstrip("/") + "/")]
                vol = volumes.get(mounts[under[0]]["name"], {}) if under else {}
                shared = [k for k in ("secret", "projected", "configMap") if k in vol]
                need(not shared and "hostPath" in vol,
                     "%s: --key %s comes from %s volume %s, which every pod of the workload "
                     "mounts alike: each node would hold every node's key; provision each "
                     "node's key on the node and mount it with hostPath"
                     % (cname, value, shared[0] if shared else "a non-hostPath",
                        vol.get("name", "?")))
        # The root filesystem is read-only: every file a flag names must be in a mounted volume,
        # and the directory of every socket the daemon creates in a writable one.
        for flag, value in flag_values(c.get("args", [])):
            if not value or not value.startswith("/"):
                continue
            under = [p for p in mounts if value.startswith(p.rstrip("/") + "/")]
            need(under, "%s: %s %s is in no mounted volume" % (cname, flag, value))
            if flag.endswith("-socket") and under:
                need(not mounts[under[0]].get("readOnly"),
                     "%s: %s %s is in a read-only volume" % (cname, flag, value))

def check_file(path):
    docs = docs_of(path)
    kinds = [d.get("kind", "compose" if "services" in d else "?") for d in docs]
    assert kinds and "?" not in kinds, kinds
    errors = []
    pod_labels = [w["spec"]["template"]["metadata"].get("labels", {}) for w in workloads(docs)]
    for w in workloads(docs):
        check_workload(w, errors)
    for d in docs:
        if d.get("kind") == "Service":
            sel = d["spec"].get("selector", {})
            if not any(all(l.get(k) == v for k, v in sel.items()) for l in pod_labels):
                errors.append("Service/%s selects no workload of this file" % d["metadata"]["name"])
        if "services" in d:
            for name, s in d["services"].items():
                if not s.get("image", "").startswith("localhost/tracerelay-"):
                    errors.append("compose service %s: image %s" % (name, s.get("image")))
    for e in errors:
        print("FAIL: %s: %s" % (path, e), file=sys.stderr)
    return 1 if errors else 0

def check_tiers(directory):
    docs = []
    for f in sorted(os.listdir(directory)):
        if f.endswith(".yaml"):
            docs += docs_of(os.path.join(directory, f))
    errors = []
    key = lambda d: (d["metadata"]["namespace"], d["metadata"]["name"])
    services = {key(d): d for d in docs if d.get("kind") == "Service"}
    sets = [d for d in docs if d.get("kind") == "StatefulSet"]
    regionals = set()   # pod names of the workloads that run with --upstream
    allowed = {}        # --relay-allow REGIONAL -> patterns
    dials = []          # (who, flag, HOST:PORT)
    for w in workloads(docs):
        for c in containers_of(w):
            fv = flag_values(c.get("args", []))
            who = "%s/%s" % (w["kind"], w["metadata"]["name"])
            for flag, value in fv:
                if flag == "--upstream" and w["kind"] == "StatefulSet":
                    regionals |= pods_of(w)
                if flag in ("--upstream", "--service"):
                    dials.append((who, flag, value))
                if flag == "--relay-allow":
                    r, _, pats = value.partition("=")
                    if not r or not pats or "" in pats.split(","):
                        errors.append("%s: --relay-allow %s is not REGIONAL=PATTERN[,PATTERN...]"
                                      % (who, value))
                    allowed[r] = pats.split(",")
    for who, flag, target in dials:
        host, _, port = target.rpartition(":")
        labels = host.split(".")
        # NAME.NS.svc: a Service; POD.NAME.NS.svc: a pod of a StatefulSet behind headless NAME.
        if len(labels) == 3 and labels[2] == "svc":
            svc, pod = services.get((labels[1], labels[0])), None
        elif len(labels) == 4 and labels[3] == "svc":
            svc, pod = services.get((labels[2], labels[1])), labels[0]
        else:
            errors.append("%s: %s %s is not a Service of this layout" % (who, flag, target))
            continue
        if svc is None:
            errors.append("%s: %s %s: no such Service" % (who, flag, target)); continue
        if int(port) not in [p["port"] for p in svc["spec"]["ports"]]:
            errors.append("%s: %s %s: the Service has no port %s" % (who, flag, target, port))
        if pod is not None:
            st = [s for s in sets if s["spec"]["serviceName"] == svc["metadata"]["name"]]
            if svc["spec"].get("clusterIP") != "None" or not st:
                errors.append("%s: %s %s: not a headless Service of a StatefulSet"
                              % (who, flag, target))
            elif not any(pod in pods_of(s) for s in st):
                errors.append("%s: %s %s: no such pod" % (who, flag, target))
    if not regionals or not allowed:
        errors.append("no regional (--upstream) or no --relay-allow in the layout")
    for r in sorted(set(allowed) - regionals):
        errors.append("--relay-allow names %s, which is no regional pod" % r)
    for r in sorted(regionals - set(allowed)):
        errors.append("regional %s has no --relay-allow at the root: all its hosts would be "
                      "refused" % r)
    for e in errors:
        print("FAIL: %s: %s" % (directory, e), file=sys.stderr)
    if not errors:
        rules = "; ".join("%s=%s" % (r, ",".join(p)) for r, p in sorted(allowed.items()))
        print("ok: %s: %d regionals dialled by their agents and allowed at the root (%s)"
              % (directory, len(regionals), rules))
    return 1 if errors else 0

def check_flags(bin_dir, paths):
    used = {}           # program -> {flag: [files]}
    for path in paths:
        for d in docs_of(path):
            containers = [c for w in workloads([d]) for c in containers_of(w)]
            containers += [dict(image=s.get("image", ""), args=s.get("command") or [])
                           for s in d.get("services", {}).values()] if "services" in d else []
            for c in containers:
                for flag, _ in flag_values(c.get("args", [])):
                    files = used.setdefault(program_of(c), {}).setdefault(flag, [])
                    files.append(os.path.basename(path))
    failures = 0
    for prog, flags in sorted(used.items()):
        exe = os.path.join(bin_dir, prog)
        if not os.access(exe, os.X_OK):
            print("note: %s not built; its %d manifest flags not checked against --help"
                  % (prog, len(flags)))
            continue
        r = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=10)
        help_text = r.stdout + r.stderr
        known = lambda f: re.search(r"(^|[^A-Za-z0-9-])%s([^A-Za-z0-9-]|$)" % re.escape(f),
                                    help_text, re.M)
        missing = sorted(f for f in flags if not known(f))
        if not missing:
            print("ok: %s --help knows all %d flags the manifests use" % (prog, len(flags)))
        elif prog == "tracerelay-service" and not known("--upstream"):
            where = ", ".join(sorted({f for m in missing for f in flags[m]}))
            print("note: %s has no --upstream yet (tiers not built in): not checking %s (in %s)"
                  % (prog, " ".join(missing), where))
        else:
            for f in missing:
                print("FAIL: %s --help has no %s (used in %s)"
                      % (prog, f, ", ".join(sorted(set(flags[f])))), file=sys.stderr)
            failures += 1
    return failures

def check_netpol(paths):
    """Every workload serving --metrics-listen has a NetworkPolicy for its pods that admits port
    9464 from named sources only: the endpoint has no authentication."""
    docs = [d for p in paths for d in docs_of(p)]
    pols = [d for d in docs if d.get("kind") == "NetworkPolicy"]
    errors = []
    for w in workloads(docs):
        if not any(f == "--metrics-listen" for c in containers_of(w)
                   for f, _ in flag_values(c.get("args", []))):
            continue
        labels = w["spec"]["template"]["metadata"].get("labels", {})
        mine = [p for p in pols
                if p["metadata"].get("namespace") == w["metadata"].get("namespace") and
                all(labels.get(k) == v for k, v in
                    p["spec"].get("podSelector", {}).get("matchLabels", {}).items())]
        ok = False
        for p in mine:
            rules = [r for r in p["spec"].get("ingress", [])
                     if any(pt.get("port") in (9464, "metrics") for pt in r.get("ports", []))]
            if "Ingress" in p["spec"].get("policyTypes", []) and \
                    all(r.get("from") for r in rules):
                ok = True
        if not ok:
            errors.append("%s/%s serves --metrics-listen but no NetworkPolicy restricts who "
                          "reaches port 9464 (kubernetes/networkpolicy.yaml)"
                          % (w["kind"], w["metadata"]["name"]))
    for e in errors:
        print("FAIL: %s" % e, file=sys.stderr)
    return 1 if errors else 0

mode = sys.argv[1]
if mode == "netpol":
    sys.exit(check_netpol(sys.argv[2:]))
if mode == "file":
    sys.exit(check_file(sys.argv[2]))
if mode == "tiers":
    sys.exit(check_tiers(sys.argv[2]))
if mode == "flags":
    sys.exit(check_flags(sys.argv[2], sys.argv[3:]))
PY

if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
  yaml_files=()
  for f in "$deploy"/kubernetes/*.yaml "$deploy"/kubernetes/tiers/*.yaml \
    "$deploy"/compose/compose.yaml; do
    [ -e "$f" ] && yaml_files+=("${f#"$deploy"/}")
  done
  for f in "${yaml_files[@]}"; do
    if python3 -c "$yaml_check" file "$deploy/$f"; then
      ok "$f parses and keeps its hardening"
    else
      fail "$f"
    fi
  done
  if [ -d "$deploy/kubernetes/tiers" ]; then
    (cd "$deploy" && python3 -c "$yaml_check" tiers kubernetes/tiers) ||
      fail "kubernetes/tiers/ do not agree"
  fi
  k8s_files=()
  for f in "${yaml_files[@]}"; do [[ $f == kubernetes/* ]] && k8s_files+=("$f"); done
  if (cd "$deploy" && python3 -c "$yaml_check" netpol "${k8s_files[@]}"); then
    ok "every workload serving metrics has a NetworkPolicy on port 9464"
  else
    fail "metrics endpoints open to every pod"
  fi
  if [ -n "$bin_dir" ]; then
    (cd "$deploy" && python3 -c "$yaml_check" flags "$bin_dir" "${yaml_files[@]}") ||
      fail "manifests use flags the daemons do not have"
  else
    echo "note: no BIN_DIR given; manifest flags not checked against the daemons' --help"
  fi
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
