#!/usr/bin/env bash
# install-deps.sh: installs what tracerelay needs on Debian 12, from Debian's own packages, and
# nothing else: only the packages that are missing are installed (without recommends), and no
# package already installed is upgraded (apt-get --no-upgrade), unless a missing one needs a
# newer version of it. When nothing is missing, apt is not run at all. Safe to run again.
# Needs root (or sudo) when something is missing.
#   tools/install-deps.sh --demo [PACKAGE...]   building and running the demo (tools/demo.sh)
#   tools/install-deps.sh [PACKAGE...]          that, plus what the tests need (tools/run-tests.sh)
set -euo pipefail

# Building everything (CMake requires each library, and cmocka, at configure time) and running
# the demo cluster (certificates with openssl, network namespaces with ip, python3 for status).
DEMO_PACKAGES=(
  gcc libc6-dev cmake ninja-build pkg-config
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler libmbedtls-dev libcmocka-dev libzstd-dev
  zlib1g-dev libmicrohttpd-dev
  openssl iproute2 python3
)
# What the tests use beyond that, by test (README.md, "Quick start", says the same):
TEST_PACKAGES=(
  protobuf-compiler                # protoc --decode: traces checked field by field
  prometheus curl                  # test_metrics: a real Prometheus scrapes /metrics
  nftables procps                  # fault tests: packet loss inside namespaces; pgrep
  openssh-server openssh-client    # test_ssh_tunnel: the consumer socket over ssh -L
  podman runc                      # test_container: the agent in a container
  systemd python3-yaml             # test_package (systemd-analyze), test_deploy (YAML)
  help2man dpkg-dev debootstrap    # test_package: the .deb built and installed in a fresh root
  ca-certificates                  #   (debootstrap from the https mirror apt uses)
  zstd                             # fuzz/make_seeds.py (tools/fuzz.sh installs clang too)
)

wanted=("${DEMO_PACKAGES[@]}")
if [ "${1:-}" = --demo ]; then
  shift
else
  wanted+=("${TEST_PACKAGES[@]}")
fi
wanted+=("$@")

missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' ||
    missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps.sh: all ${#wanted[@]} packages are installed; nothing to do"
  exit 0
fi
echo "install-deps.sh: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends --no-upgrade "${missing[@]}"
