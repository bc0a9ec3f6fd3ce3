#!/bin/bash
# make-certs.sh: the certificates tracerelay's mutually-authenticated TLS link needs.
#
# One directory holds one CA (ca.crt, ca.key), the service certificate (service.crt,
# service.key; more under other names with --service-file, e.g. for the regionals of tiers) and
# any number of agent certificates (agent-NAME.crt, agent-NAME.key). All keys
# are EC P-256, written mode 0600. Running it again is safe: an existing CA is reused and
# existing certificates are kept unless --force is given, so agents can be added one at a time
# (a service certificate asked for under names it does not carry is refused, not kept).
# Revocation: --revoke NAME puts agent-NAME.crt on the CA's CRL, OUTDIR/ca.crl (the services'
# --crl), kept in OUTDIR/crl-index.txt (openssl ca's database of what was revoked) and moves the
# certificate and key aside, so the same run or a later one can issue NAME a new certificate.
# The test-only options (--expired, --not-yet-valid, --no-client-auth) exist so the TLS tests
# can produce every certificate the relay must refuse; a second, independent CA is simply
# another OUTDIR.
set -euo pipefail

usage() {
  cat <<'EOF'
Usage: make-certs.sh OUTDIR [OPTION]...

Creates (or reuses) a CA in OUTDIR and issues certificates from it.

Certificates:
  --service-name NAME   issue OUTDIR/service.{crt,key} for the central service; NAME goes into
                        the subjectAltName (repeatable; the first one is also the CN). Agents
                        connect with one of these names (agent --service-name).
  --localhost           also put DNS:localhost and IP:127.0.0.1 into the service certificate
  --service-file BASE   write that service certificate as OUTDIR/BASE.{crt,key} instead of
                        OUTDIR/service.{crt,key}: several services (a root and its regionals)
                        get theirs from the one CA directory
  --agent NAME          issue OUTDIR/agent-NAME.{crt,key}; NAME is the agent's machine name
                        (CN and SAN dNSName), 1-64 characters of [A-Za-z0-9._-] (repeatable)

CA:
  --ca-name NAME        common name of a newly created CA (default "tracerelay CA")
  --ca-days N           validity of a newly created CA in days (default 3650)

Validity of the certificates issued in this run:
  --days N              valid from now for N days (default 825)
  --not-before DATE     explicit start, DATE as YYYYMMDDHHMMSSZ (UTC)
  --not-after DATE      explicit end, DATE as YYYYMMDDHHMMSSZ (UTC)
  --expired             valid from 30 days ago until yesterday (for tests)
  --not-yet-valid       valid from tomorrow for 30 days (for tests)

Revocation:
  --revoke NAME         put agent-NAME.crt on the CRL OUTDIR/ca.crl (repeatable) and move it
                        and its key aside (agent-NAME.revoked-SERIAL.{crt,key}); --agent NAME
                        in the same run issues NAME a new one. Copy ca.crl to the services
                        (--crl) and send them SIGHUP: a connected NAME is cut.
  --update-crl          write OUTDIR/ca.crl afresh (empty if nothing was revoked): a CRL is
                        valid for --crl-days, and a service refuses one past that
  --crl-days N          validity of the CRL written in this run (default 365)

Other:
  --no-client-auth      agent certificates get the serverAuth usage instead of clientAuth,
                        so the service must refuse them (for tests)
  --force               reissue certificates that already exist (the CA is never replaced);
                        without it an existing service certificate is kept if it carries
                        every name asked for, and refused with an error if it does not
  -h, --help            this text

Examples:
  make-certs.sh /etc/tracerelay/pki --service-name relay.example.net --agent web-1 --agent web-2
  make-certs.sh /etc/tracerelay/pki --agent web-3          # add an agent later, same CA
  make-certs.sh /etc/tracerelay/pki --revoke web-3         # web-3's key was lost: ca.crl
  make-certs.sh /etc/tracerelay/pki --service-name relay.site-a.example.net \
      --service-file service-site-a --agent site-a       # a regional: its service certificate
                                                         # and its agent certificate for the root
Copy ca.crt to every host; service.* to the service host; agent-NAME.* to host NAME only.
EOF
}

die() {
  echo "make-certs.sh: $*" >&2
  exit 1
}

valid_name() {
  [[ ${#1} -ge 1 && ${#1} -le 64 && $1 =~ ^[A-Za-z0-9._-]+$ ]]
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
case "$1" in
  -h|--help) usage; exit 0 ;;
  -*) die "the first argument must be the output directory (see --help)" ;;
esac
outdir=$1
shift

ca_name="tracerelay CA"
ca_days=3650
days=825
not_before=""
not_after=""
localhost=0
client_eku=clientAuth
force=0
service_names=()
service_file=service
agents=()
revokes=()
update_crl=0
crl_days=365

need_arg() {
  [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --service-name) need_arg "$@"; valid_name "$2" || die "bad service name '$2'"; service_names+=("$2"); shift 2 ;;
    --localhost) localhost=1; shift ;;
    --service-file) need_arg "$@"; valid_name "$2" && [[ $2 != ca && $2 != agent-* ]] ||
        die "bad --service-file '$2': 1-64 of [A-Za-z0-9._-], not ca or agent-*"
      service_file=$2; shift 2 ;;
    --agent) need_arg "$@"; valid_name "$2" || die "bad machine name '$2': use 1-64 of [A-Za-z0-9._-]"
      agents+=("$2"); shift 2 ;;
    --revoke) need_arg "$@"; valid_name "$2" || die "bad machine name '$2' for --revoke"
      revokes+=("$2"); shift 2 ;;
    --update-crl) update_crl=1; shift ;;
    --crl-days) need_arg "$@"; crl_days=$2; shift 2 ;;
    --ca-name) need_arg "$@"; ca_name=$2; shift 2 ;;
    --ca-days) need_arg "$@"; ca_days=$2; shift 2 ;;
    --days) need_arg "$@"; days=$2; shift 2 ;;
    --not-before) need_arg "$@"; not_before=$2; shift 2 ;;
    --not-after) need_arg "$@"; not_after=$2; shift 2 ;;
    --expired)
      not_before=$(date -u -d '-30 days' +%Y%m%d%H%M%SZ)
      not_after=$(date -u -d '-1 day' +%Y%m%d%H%M%SZ)
      shift ;;
    --not-yet-valid)
      not_before=$(date -u -d '+1 day' +%Y%m%d%H%M%SZ)
      not_after=$(date -u -d '+31 days' +%Y%m%d%H%M%SZ)
      shift ;;
    --no-client-auth) client_eku=serverAuth; shift ;;
    --force) force=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[[ $days =~ ^[0-9]+$ && $days -gt 0 ]] || die "--days needs a positive number"
[[ $ca_days =~ ^[0-9]+$ && $ca_days -gt 0 ]] || die "--ca-days needs a positive number"
[[ $crl_days =~ ^[0-9]+$ && $crl_days -gt 0 ]] || die "--crl-days needs a positive number"
for d in "$not_before" "$not_after"; do
  [[ -z $d || $d =~ ^[0-9]{14}Z$ ]] || die "bad date '$d': use YYYYMMDDHHMMSSZ"
done
# openssl ca needs both ends when either is given; fill the other from --days.
if [[ -n $not_before && -z $not_after ]]; then
  nb=$not_before
  not_after=$(date -u -d "${nb:0:4}-${nb:4:2}-${nb:6:2} ${nb:8:2}:${nb:10:2}:${nb:12:2} UTC +$days days" \
    +%Y%m%d%H%M%SZ)
elif [[ -z $not_before && -n $not_after ]]; then
  not_before=$(date -u +%Y%m%d%H%M%SZ)
fi
[[ $localhost -eq 0 || ${#service_names[@]} -gt 0 ]] || die "--localhost needs --service-name"
[[ $service_file == service || ${#service_names[@]} -gt 0 ]] || die "--service-file needs --service-name"
command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"

mkdir -p "$outdir"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Our own configs, so the system openssl.cnf adds no extensions of its own.
cat >"$work/req.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
: >"$work/index.txt"
openssl rand -hex 16 >"$work/serial"
cat >"$work/ca.cnf" <<EOF
[ca]
default_ca = tr_ca
[tr_ca]
database = $work/index.txt
new_certs_dir = $work
serial = $work/serial
default_md = sha256
policy = policy_any
unique_subject = no
copy_extensions = none
[policy_any]
commonName = supplied
EOF

new_key() { # new_key PATH: a P-256 key readable by its owner only
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null)
  chmod 600 "$1"
}

if [[ -f $outdir/ca.crt && -f $outdir/ca.key ]]; then
  echo "using existing CA $outdir/ca.crt"
elif [[ -e $outdir/ca.crt || -e $outdir/ca.key ]]; then
  die "$outdir has only one of ca.crt and ca.key; remove it or restore the other"
else
  # Made in $work and moved into place last, so a failed run leaves no half-made CA.
  new_key "$work/ca.key"
  openssl req -config "$work/req.cnf" -new -x509 -key "$work/ca.key" -subj "/CN=$ca_name" \
    -days "$ca_days" -sha256 -extensions v3_ca -out "$work/ca.crt"
  mv "$work/ca.key" "$outdir/ca.key"
  mv "$work/ca.crt" "$outdir/ca.crt"
  echo "created CA $outdir/ca.crt ($ca_name)"
fi

# Revocations first, so that --revoke NAME --agent NAME replaces NAME's certificate.
if [[ ${#revokes[@]} -gt 0 || $update_crl -eq 1 ]]; then
  [[ -f $outdir/crl-index.txt ]] || : >"$outdir/crl-index.txt"
  [[ -f $outdir/crlnumber ]] || echo 1000 >"$outdir/crlnumber"
  cat >"$work/crl.cnf" <<EOF
[ca]
default_ca = tr_crl
[tr_crl]
database = $outdir/crl-index.txt
crlnumber = $outdir/crlnumber
default_md = sha256
default_crl_days = $crl_days
unique_subject = no
EOF
  for a in "${revokes[@]}"; do
    crt=$outdir/agent-$a.crt
    [[ -f $crt ]] || die "--revoke $a: no $crt to revoke"
    serial=$(openssl x509 -in "$crt" -noout -serial | cut -d= -f2)
    openssl ca -config "$work/crl.cnf" -cert "$outdir/ca.crt" -keyfile "$outdir/ca.key" \
      -revoke "$crt" 2>"$work/ca.log" || { cat "$work/ca.log" >&2; exit 1; }
    mv "$crt" "$outdir/agent-$a.revoked-$serial.crt"
    [[ ! -f $outdir/agent-$a.key ]] || mv "$outdir/agent-$a.key" "$outdir/agent-$a.revoked-$serial.key"
    echo "revoked $crt (serial $serial)"
  done
  openssl ca -config "$work/crl.cnf" -cert "$outdir/ca.crt" -keyfile "$outdir/ca.key" -gencrl \
    -out "$work/ca.crl" 2>"$work/ca.log" || { cat "$work/ca.log" >&2; exit 1; }
  chmod 644 "$work/ca.crl"
  mv "$work/ca.crl" "$outdir/ca.crl"
  echo "wrote $outdir/ca.crl ($(grep -c '^R' "$outdir/crl-index.txt" || true) revoked, valid $crl_days days)"
fi

issue() { # issue BASENAME CN EXT_SECTION_TEXT
  local base=$1 cn=$2 ext=$3
  if [[ -f $outdir/$base.crt && -f $outdir/$base.key && $force -eq 0 ]]; then
    echo "keeping existing $outdir/$base.crt (--force to reissue)"
    return
  fi
  printf '[leaf]\n%s\n' "$ext" >"$work/leaf.cnf"
  new_key "$work/$base.key"
  openssl req -config "$work/req.cnf" -new -key "$work/$base.key" -subj "/CN=$cn" \
    -out "$work/$base.csr"
  local validity=(-days "$days")
  [[ -n $not_before ]] && validity=(-startdate "$not_before" -enddate "$not_after")
  openssl ca -batch -config "$work/ca.cnf" -cert "$outdir/ca.crt" -keyfile "$outdir/ca.key" \
    -in "$work/$base.csr" -out "$work/$base.crt" -notext -extfile "$work/leaf.cnf" \
    -extensions leaf "${validity[@]}" 2>"$work/ca.log" || { cat "$work/ca.log" >&2; exit 1; }
  chmod 644 "$work/$base.crt"
  mv "$work/$base.key" "$outdir/$base.key"
  mv "$work/$base.crt" "$outdir/$base.crt"
  echo "issued $outdir/$base.crt (CN=$cn)"
}

leaf_ext() { # leaf_ext EKU SAN
  printf 'basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature, keyAgreement\n'
  printf 'extendedKeyUsage = %s\nsubjectAltName = %s\n' "$1" "$2"
  printf 'subjectKeyIdentifier = hash\nauthorityKeyIdentifier = keyid\n'
}

# An existing service certificate is kept only if it carries every name asked for now: one
# kept for other names would leave the agents failing with a name mismatch.
check_kept_names() { # check_kept_names BASENAME SAN
  local crt=$outdir/$1.crt have e missing=()
  [[ -f $crt && -f $outdir/$1.key && $force -eq 0 ]] || return 0
  have=$(openssl x509 -in "$crt" -noout -ext subjectAltName 2>/dev/null | tail -n +2 |
    tr -d ' ' | sed 's/IPAddress:/IP:/g')
  IFS=, read -ra want <<<"$2"
  for e in "${want[@]}"; do [[ ,$have, == *,"$e",* ]] || missing+=("$e"); done
  [[ ${#missing[@]} -eq 0 ]] || die "$crt exists for ${have:-no names}, not ${missing[*]}: --force" \
    "reissues it (agents then need the new name), --service-file BASE issues another beside it"
}

if [[ ${#service_names[@]} -gt 0 ]]; then
  san=""
  for n in "${service_names[@]}"; do san+="${san:+,}DNS:$n"; done
  [[ $localhost -eq 1 ]] && san+=",DNS:localhost,IP:127.0.0.1"
  check_kept_names "$service_file" "$san"
  issue "$service_file" "${service_names[0]}" "$(leaf_ext serverAuth "$san")"
fi

for a in "${agents[@]}"; do
  issue "agent-$a" "$a" "$(leaf_ext "$client_eku" "DNS:$a")"
done
