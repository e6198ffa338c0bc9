#!/usr/bin/env bash
# kvfabric's TCP lane against NIXL (UCX over TCP) and Mooncake's transfer
# engine (its TCP transport), each moving the same bytes between two
# processes on loopback, in rounds in the same run:
#
#   lane       BenchmarkImport's import over the lane (TLS 1.3, 4
#              connections), with its bare TLS and raw TCP baselines
#   lane-plain the same with a plain TCP lane (-kvfabric.bench.import.lane-plain)
#   lane-plain-1:1
#              the plain lane on the peers' work: TP 1 to TP 1
#              (-kvfabric.bench.import.tp 1>1), each 2 MiB block one
#              contiguous piece on both sides, where the two rows above
#              re-shard TP 4 to TP 2 (8 KiB pieces, strided)
#   nixl       testbed/peers/peers_bench.py --peer nixl (UCX_TLS=tcp on lo)
#   mooncake   testbed/peers/peers_bench.py --peer mooncake (protocol tcp)
#
# NIXL and Mooncake go into a virtual environment outside the repository
# ($PEERS_VENV, about 6 GiB: Mooncake's wheel pulls in torch), not into CI.
# Mooncake's engine.so links libcuda.so.1, the driver's library, which no
# wheel ships: where none is installed, the script builds a stand-in whose
# every entry point answers CUDA_ERROR_NO_DEVICE (its TCP transport on host
# memory needs no GPU). libcudart.so.12 comes from the nvidia-cuda-runtime-cu12
# wheel. A peer that fails is reported with its error; the others go on.
#
#   bash testbed/peers-bench.sh                      # 1 GiB, 3 rounds
#   SIZE=67108864 ROUNDS=1 bash testbed/peers-bench.sh
set -euo pipefail

SIZE=${SIZE:-1073741824}     # bytes moved per iteration, by each
BLOCK=${BLOCK:-2097152}      # bytes per block (BenchmarkImport's Llama 3 8B block)
ITERS=${ITERS:-2}            # timed iterations of each per round
ROUNDS=${ROUNDS:-3}
PYTHON=${PYTHON:-/usr/bin/python3}
PEERS_VENV=${PEERS_VENV:-$HOME/.cache/kvfabric/peers-venv}
GO=${GO:-go}
NIXL_VERSION=1.5.1
MOONCAKE_VERSION=0.3.13.post1
CUDART_VERSION=12.9.79

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The virtual environment, installed once and checked each time.
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-venv; }
command -v gcc >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc; }
py=$PEERS_VENV/bin/python
if ! "$py" -c "import importlib.metadata as m, sys; sys.exit(m.version('nixl') != '$NIXL_VERSION' or m.version('mooncake-transfer-engine') != '$MOONCAKE_VERSION' or m.version('nvidia-cuda-runtime-cu12') != '$CUDART_VERSION')" 2>/dev/null; then
	echo "installing NIXL $NIXL_VERSION and Mooncake $MOONCAKE_VERSION into $PEERS_VENV (several GiB, minutes)" >&2
	"$PYTHON" -m venv "$PEERS_VENV"
	"$PEERS_VENV/bin/pip" install -q "nixl==$NIXL_VERSION" "mooncake-transfer-engine==$MOONCAKE_VERSION" \
		"nvidia-cuda-runtime-cu12==$CUDART_VERSION" numpy
fi
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
libs=$site/nvidia/cuda_runtime/lib
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
	stub=$PEERS_VENV/stub-libcuda
	if [ ! -e "$stub/libcuda.so.1" ]; then
		mkdir -p "$stub"
		{
			echo '/* A stand-in for the CUDA driver: no device. */'
			nm -D --undefined-only "$site/mooncake/engine.so" | awk '{print $2}' | sed 's/@.*//' | grep -E '^cu[A-Z]' | sort -u |
				while read -r s; do
					case $s in
					cuGetErrorName | cuGetErrorString) echo "int $s(int e, const char **s) { if (s) *s = \"no CUDA device\"; return 0; }" ;;
					*) echo "int $s(void) { return 100; /* CUDA_ERROR_NO_DEVICE */ }" ;;
					esac
				done
		} >"$stub/stub.c"
		gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stub/libcuda.so.1" "$stub/stub.c"
	fi
	libs=$libs:$stub
	echo "no libcuda.so.1 installed: Mooncake loads the stand-in in $stub (no GPU)" >&2
fi

(cd "$root" && "$GO" test -c -o "$tmp/fabric.test" ./fabric)

results=$tmp/results.jsonl
# lane NAME [flags]: one BenchmarkImport at SIZE; its figures as a JSON line.
lane() {
	local name=$1
	shift
	local out
	if ! out=$(cd "$root/fabric" && timeout 900 "$tmp/fabric.test" -test.run '^$' -test.bench '^BenchmarkImport$' \
		-test.benchtime "${ITERS}x" -kvfabric.bench.import="$SIZE" "$@" 2>&1); then
		printf '%s\n' "$out" | tail -5 >&2
		echo "{\"peer\": \"$name\", \"error\": \"BenchmarkImport failed\"}" >>"$results"
		return
	fi
	printf '%s\n' "$out" | grep '^BenchmarkImport' | awk -v name="$name" '{
		for (i = 2; i < NF; i++) v[$(i+1)] = $i
		printf "{\"peer\": \"%s\", \"gbps\": [%s], \"tls\": %s, \"tcp\": %s, \"cpu\": %s}\n", name, v["lane-GB/s"], v["tls-GB/s"], v["tcp-GB/s"], v["lane-cpu-s/GB"]
	}' >>"$results"
}
peer() {
	local name=$1
	LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} UCX_TLS=tcp UCX_NET_DEVICES=lo \
		timeout 600 "$py" "$root/testbed/peers/peers_bench.py" --peer "$name" --size "$SIZE" --block "$BLOCK" --iters "$ITERS" \
		2>"$tmp/$name.err" | sed -n 's/^@peers //p' >>"$results" || true
	grep -q "\"peer\": \"$name\"" <(tail -1 "$results") ||
		echo "{\"peer\": \"$name\", \"error\": \"no result: $(tail -1 "$tmp/$name.err" | tr -d '"\\')\"}" >>"$results"
}

for r in $(seq "$ROUNDS"); do
	echo "round $r of $ROUNDS: lane, lane-plain, lane-plain-1:1, nixl, mooncake; $SIZE bytes in blocks of $BLOCK, $ITERS iterations each" >&2
	echo "{\"round\": $r}" >>"$results"
	lane lane
	lane lane-plain -kvfabric.bench.import.lane-plain
	lane lane-plain-1:1 -kvfabric.bench.import.lane-plain -kvfabric.bench.import.tp '1>1'
	peer nixl
	peer mooncake
done

"$py" - "$results" "$SIZE" <<'EOF'
import json, statistics, sys

rounds, cur = [], None
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "round" in d:
        cur = {}
        rounds.append(cur)
    else:
        cur[d["peer"]] = d
names = ["lane", "lane-plain", "lane-plain-1:1", "nixl", "mooncake"]
def gbps(d):
    return statistics.median(d["gbps"]) if d and "gbps" in d and d["gbps"] else None
fmt = lambda x: "–" if x is None else f"{x:.2f}"
print(f"\n{int(sys.argv[2]) >> 20} MiB per iteration, median GB/s of each round's iterations")
print("lane and lane plain re-shard TP 4 to TP 2; lane plain 1:1 moves TP 1 to TP 1, each block one contiguous piece, as the peers do")
print("| round | lane (TLS) | lane plain | lane plain 1:1 | bare TLS | raw TCP | raw TCP (1:1 run) | NIXL (UCX tcp) | Mooncake (tcp) | lane / NIXL | lane / Mooncake | lane plain / faster peer | lane plain 1:1 / faster peer (goal ≥ 1.5) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
errors = {}
for i, r in enumerate(rounds, 1):
    g = {n: gbps(r.get(n)) for n in names}
    for n in names:
        if r.get(n) and "error" in r[n]:
            errors.setdefault(n, r[n]["error"])
    ratio = lambda a, b: None if a is None or b is None else a / b
    peers = [x for x in (g["nixl"], g["mooncake"]) if x is not None]
    fast = max(peers) if peers else None
    lane = r.get("lane") or {}
    same = r.get("lane-plain-1:1") or {}
    print(f"| {i} | {fmt(g['lane'])} | {fmt(g['lane-plain'])} | {fmt(g['lane-plain-1:1'])} | {fmt(lane.get('tls'))} | {fmt(lane.get('tcp'))} | "
          f"{fmt(same.get('tcp'))} | {fmt(g['nixl'])} | {fmt(g['mooncake'])} | {fmt(ratio(g['lane'], g['nixl']))} | "
          f"{fmt(ratio(g['lane'], g['mooncake']))} | {fmt(ratio(g['lane-plain'], fast))} | {fmt(ratio(g['lane-plain-1:1'], fast))} |")
for n, e in errors.items():
    print(f"{n} failed: {e}")
EOF
