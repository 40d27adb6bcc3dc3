#!/usr/bin/env bash
# Installs the Debian packages the test suite drives for real: redis-server and curl; iproute2,
# nftables and iptables for the transparent-interception tests; tcpdump for their packet captures
# (the ground truth of what left the pod); dnsmasq for its benchmark; git, node and npm for the
# client recipe tests.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v curl >/dev/null 2>&1 || need+=(curl)
# Sentinel and Cluster tests: redis-cli creates the cluster; redis-sentinel is the Debian package
# of the sentinel role (the tests start `redis-server --sentinel` themselves).
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v iptables-restore >/dev/null 2>&1 || need+=(iptables)
command -v setpriv >/dev/null 2>&1 || need+=(util-linux)
command -v tcpdump >/dev/null 2>&1 || need+=(tcpdump)
command -v dnsmasq >/dev/null 2>&1 || need+=(dnsmasq-base)
# The client recipe tests drive git, node and npm through the proxy as users would.
command -v git >/dev/null 2>&1 || need+=(git)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
    sudo_cmd=""
    [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${need[@]}"
fi
