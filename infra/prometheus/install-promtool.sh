#!/usr/bin/env bash
# Put Prometheus's promtool (rule syntax checks and rule unit tests) under .warmplane/tools/, from the
# distribution's own package: Debian 12 ships it in `prometheus` (2.42). Nothing is installed system-wide:
# the package is downloaded and unpacked, and only promtool is kept.
#
# Contract:
# - Destination: <project>/.warmplane/tools/promtool (where tests/unit/deploy/test_alert_rules.py looks).
# - Idempotent: an existing promtool that runs is kept, nothing is downloaded.
# - Needs apt (Debian or Ubuntu). Package lists are refreshed only when the download fails without them
#   (a fresh CI image has none); that step needs root, as CI runs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/.warmplane/tools/promtool"

if [[ -x "$DEST" ]] && "$DEST" --version >/dev/null 2>&1; then
    echo "promtool present: $DEST"
    exit 0
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
if ! apt-get download prometheus >/dev/null 2>&1; then
    apt-get update -qq
    apt-get download prometheus >/dev/null
fi
dpkg -x prometheus_*.deb unpacked
mkdir -p "$(dirname "$DEST")"
# Copy then rename: a run interrupted half-way leaves no promtool that looks installed.
cp unpacked/usr/bin/promtool "$DEST.partial"
mv "$DEST.partial" "$DEST"
"$DEST" --version | head -1
