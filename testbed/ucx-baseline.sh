#!/usr/bin/env bash
# UCX over TCP on loopback (ucx_perftest, the layer under NIXL), as a
# reference beside kvfabric's import path: tag_bw (two-sided sends) and
# ucp_get (one-sided reads, what an import does), 2 MiB messages.
# Installs Debian's ucx-utils if missing. Bounded: each test stops by itself.
set -euo pipefail
command -v ucx_perftest >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q ucx-utils; }
export UCX_TLS=tcp,self UCX_NET_DEVICES=lo
port=$((20000 + RANDOM % 20000))
for test in tag_bw ucp_get; do
	timeout 60 ucx_perftest -p "$port" >/dev/null 2>&1 &
	server=$!
	sleep 1
	echo "== $test, 2 MiB x 300 (bandwidth columns in MB/s)"
	timeout 60 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s 2097152 -n 300 | tail -2
	wait "$server" || true
done
