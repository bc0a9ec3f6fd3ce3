#!/usr/bin/env bash
# install-deps.sh: installs everything tracerelay needs to build, test and run its demo on
# Debian 12, from Debian's own packages. Safe to run again. Needs root (or sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends \
  gcc libc6-dev make cmake ninja-build pkg-config git ca-certificates \
  libuv1-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler \
  libmbedtls-dev libcmocka-dev libzstd-dev zstd libmicrohttpd-dev prometheus curl \
  openssl iproute2 nftables procps psmisc openssh-server openssh-client python3 \
  podman runc systemd python3-yaml \
  help2man dpkg-dev debootstrap \
  "$@"
