#!/usr/bin/env bash
# Refreshes the chart library the scheduler's status page serves from its
# binary (statusweb/assets, embedded with go:embed): uPlot, MIT, from the npm
# registry at a pinned version, so that a page view never asks a CDN.
# Usage: scripts/vendor-uplot.sh [version]; needs npm and tar.
set -euo pipefail
case "${1:-}" in
  -h|--help)
    cat <<'USAGE'
usage: scripts/vendor-uplot.sh [VERSION]

Fetches uPlot VERSION (default 1.6.32, the one vendored) from the npm
registry with npm pack and copies its built script, style sheet and license
into statusweb/assets, which the scheduler's status page embeds. Needs npm
and tar; run it, review the diff, rebuild.

Environment read: none.
USAGE
    exit 0 ;;
esac
cd "$(dirname "$0")/.."
version=${1:-1.6.32}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "uplot@$version" >/dev/null && tar xzf uplot-"$version".tgz)
dst=statusweb/assets
cp "$tmp/package/dist/uPlot.iife.min.js" "$tmp/package/dist/uPlot.min.css" "$dst/"
cp "$tmp/package/LICENSE" "$dst/uPlot.LICENSE"
echo "$version" >"$dst/uPlot.VERSION"
echo "vendor-uplot: uPlot $version in $dst" >&2
