#!/usr/bin/env bash
# build-agent-image.sh: builds the tracerelay-agent container image (and, with --with-service,
# a tracerelay-service image) without pulling anything from a registry.
#
# 1. Builds tracerelay-agent with -DTR_STATIC=ON in its own CMake build directory: libuv,
#    mbedTLS, protobuf-c and zstd come from the .a files of Debian's -dev packages, so the binary
#    needs only glibc (kept shared so getaddrinfo can resolve the service's name through NSS).
# 2. Stages a root filesystem: the stripped binary, the glibc files `ldd` names, a passwd/group
#    and an nsswitch.conf, and the empty mount points /run/perfetto and /etc/tracerelay/pki.
# 3. `podman build --pull=never` with deploy/container/Containerfile, FROM scratch.
# With --rootfs DIR it stops after step 2 (the integration test uses that rootfs under unshare
# where podman cannot run). With --binary PATH it skips step 1 and copies whatever shared
# libraries that binary needs (a "near-static" image from an ordinary build).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$here/../.." && pwd)
engine=${CONTAINER_ENGINE:-podman}
tag=localhost/tracerelay-agent:latest
service_tag=""
build_dir=$src/build-static
build_type=RelWithDebInfo
binary=""
service_binary=""
rootfs_only=""
with_service=0

usage() {
  cat <<USAGE
Usage: deploy/container/build-agent-image.sh [OPTION]...

Builds a static tracerelay-agent and a FROM-scratch image of it with $engine.

  --tag NAME           image name (default $tag)
  --with-service       also build the tracerelay-service image (tag: the agent's with
                       "agent" replaced by "service", or --service-tag)
  --service-tag NAME   name of the service image
  --build-dir DIR      CMake build directory for the static build (default $src/build-static;
                       kept, so a second run only rebuilds what changed)
  --build-type TYPE    CMAKE_BUILD_TYPE of that build (default $build_type)
  --binary PATH        use this tracerelay-agent instead of building one; the shared
                       libraries it needs are copied into the image
  --service-binary PATH  the same for tracerelay-service
  --rootfs DIR         only stage the agent's root filesystem in DIR (empty or absent); no
                       container engine needed
  -h, --help           this text

Environment: CONTAINER_ENGINE=docker uses docker instead of podman.
USAGE
}

die() { echo "build-agent-image.sh: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    --with-service) with_service=1; shift ;;
    --service-tag) service_tag=${2:?--service-tag needs a name}; with_service=1; shift 2 ;;
    --build-dir) build_dir=${2:?--build-dir needs a directory}; shift 2 ;;
    --build-type) build_type=${2:?--build-type needs a value}; shift 2 ;;
    --binary) binary=${2:?--binary needs a path}; shift 2 ;;
    --service-binary) service_binary=${2:?--service-binary needs a path}; with_service=1; shift 2 ;;
    --rootfs) rootfs_only=${2:?--rootfs needs a directory}; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[ -n "$service_tag" ] || service_tag=${tag/tracerelay-agent/tracerelay-service}
[ "$service_tag" != "$tag" ] || service_tag=${tag%%:*}-service:${tag##*:}

# static_build TARGET...: the programs from the TR_STATIC build directory.
static_build() {
  if [ ! -f "$build_dir/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$build_dir" -G Ninja -DTR_STATIC=ON -DCMAKE_BUILD_TYPE="$build_type" \
      >/dev/null || die "cmake failed for $build_dir"
  fi
  grep -q '^TR_STATIC:BOOL=ON' "$build_dir/CMakeCache.txt" ||
    die "$build_dir is not a -DTR_STATIC=ON build; give another --build-dir"
  ninja -C "$build_dir" "$@" >&2 || die "building $* in $build_dir failed"
}

# The only shared objects a TR_STATIC binary may need: glibc's.
glibc_only() {
  case "$(basename "$1")" in
    ld-linux*.so.*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*) return 0 ;;
  esac
  return 1
}

# stage PROGRAM BINARY STRICT DIR: the root filesystem of PROGRAM's image in DIR.
stage() {
  local program=$1 bin=$2 strict=$3 root=$4 lib
  [ -x "$bin" ] || die "$bin is not an executable"
  mkdir -p "$root/usr/local/bin" "$root/etc/tracerelay/pki" "$root/run/perfetto" \
    "$root/run/tracerelay" "$root/proc" "$root/dev" "$root/sys" "$root/tmp"
  chmod 1777 "$root/tmp"
  install -m 0755 "$bin" "$root/usr/local/bin/$program"
  command -v strip >/dev/null && strip --strip-unneeded "$root/usr/local/bin/$program"
  # ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
  while read -r lib; do
    [ -n "$lib" ] || continue
    if [ "$strict" = 1 ] && ! glibc_only "$lib"; then
      die "$bin needs $lib: the -DTR_STATIC=ON build should have linked it statically"
    fi
    cp -L --parents "$lib" "$root/"
  done < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
  cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/:/nonexistent
tracerelay:x:999:999:tracerelay:/:/nonexistent
nobody:x:65534:65534:nobody:/nonexistent:/nonexistent
PASSWD
  cat >"$root/etc/group" <<'GROUP'
root:x:0:
tracerelay:x:999:
nogroup:x:65534:
GROUP
  echo 'hosts: files dns' >"$root/etc/nsswitch.conf"
}

# image CONTAINERFILE ROOTFS TAG: builds TAG from a context (in $stage_dir) holding the
# Containerfile and rootfs/.
image() {
  local ctx=$2.ctx
  mkdir "$ctx"
  cp "$1" "$ctx/Containerfile"
  mv "$2" "$ctx/rootfs"
  "$engine" build --pull=never --network=none -f "$ctx/Containerfile" -t "$3" "$ctx" >&2 ||
    die "$engine build of $3 failed"
  echo "built image $3"
}

strict=1
if [ -z "$binary" ]; then
  static_build tracerelay-agent
  binary=$build_dir/bin/tracerelay-agent
else
  strict=0
fi

if [ -n "$rootfs_only" ]; then
  [ ! -e "$rootfs_only" ] || [ -z "$(ls -A "$rootfs_only")" ] || die "$rootfs_only is not empty"
  stage tracerelay-agent "$binary" "$strict" "$rootfs_only"
  echo "staged the agent's root filesystem in $rootfs_only"
  exit 0
fi

command -v "$engine" >/dev/null || die "$engine not found (apt-get install podman)"
stage_dir=$(mktemp -d "${TMPDIR:-/tmp}/tracerelay-rootfs.XXXXXX")
trap 'rm -rf "$stage_dir"' EXIT
stage tracerelay-agent "$binary" "$strict" "$stage_dir/agent"
image "$here/Containerfile" "$stage_dir/agent" "$tag"

if [ "$with_service" = 1 ]; then
  sstrict=1
  if [ -z "$service_binary" ]; then
    static_build tracerelay-service
    service_binary=$build_dir/bin/tracerelay-service
  else
    sstrict=0
  fi
  stage tracerelay-service "$service_binary" "$sstrict" "$stage_dir/service"
  image "$here/Containerfile.service" "$stage_dir/service" "$service_tag"
fi
