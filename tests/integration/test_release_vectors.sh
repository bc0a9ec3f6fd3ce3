#!/usr/bin/env bash
# test_release_vectors.sh: the SDK producer and the perfetto CLI of every Perfetto release in
# tests/vectors/releases/ (each recorded against that release's own traced, issue 40 item 1),
# replayed against a real agent and service by release_replay.py: each release's calls are all
# bound and succeed where traced's did, and the trace the CLI reads back holds every producer
# packet that release's traced wrote. docs/compat.md has the matrix.
# Usage: test_release_vectors.sh BIN_DIR
set -euo pipefail
TR_SRC=$(cd "$(dirname "$0")/../.." && pwd)
source "$TR_SRC/tools/cluster-lib.sh"
export TR_NO_NETNS=1
cluster_init "$1"
cluster_hosts web-1
cluster_start_service
cluster_start_agent web-1
cluster_wait_hosts 30 web-1 || { echo "FAIL: the agent did not connect"; exit 1; }
failed=0
for vec in "$TR_SRC"/tests/vectors/releases/*/; do
  python3 "$TR_SRC/tests/integration/release_replay.py" "$WORK/web-1/producer.sock" \
    "$CONSUMER_SOCK" "$vec" || failed=1
done
[ "$failed" = 0 ] || { echo "FAIL: a release's replay failed"; exit 1; }
echo PASS
