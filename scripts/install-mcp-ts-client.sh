#!/bin/sh
# The TypeScript MCP SDK (npm) for the suite's second real MCP client (tests/integration/
# test_mcp_ts_client.py), pinned, installed into the gitignored .tools/ beside helm. Idempotent:
# a stamp naming the version skips the install once done. Needs node >= 18 and npm.
set -eu
VERSION="${MCP_TS_SDK_VERSION:-1.32.2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DIR="$ROOT/.tools/mcp-ts-client"
STAMP="$DIR/.installed-$VERSION"
[ -f "$STAMP" ] && exit 0
mkdir -p "$DIR"
cat > "$DIR/package.json" <<JSON
{"name": "egress-gateway-mcp-ts-client", "private": true, "type": "module",
 "dependencies": {"@modelcontextprotocol/sdk": "$VERSION"}}
JSON
# --ignore-scripts: nothing from the registry runs at install time.
(cd "$DIR" && npm install --silent --no-audit --no-fund --ignore-scripts --save-exact >/dev/null)
rm -f "$DIR"/.installed-*
touch "$STAMP"
