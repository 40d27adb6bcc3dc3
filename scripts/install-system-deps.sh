#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real: redis-server and curl.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
# Sentinel and Cluster tests: redis-cli creates the cluster; redis-sentinel is the Debian package
# of the sentinel role (the tests start `redis-server --sentinel` themselves).
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
if [ ${#need[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
fi
