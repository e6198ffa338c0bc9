#!/bin/sh
# gpu-check.sh DIR: every real-GPU test and benchmark, on a machine with an
# NVIDIA GPU and its driver, from the binaries `make gpu-check-build` put
# in DIR (default bin/gpu-check): pool/cuda against libcuda.so.1, device
# pools in agents as processes, the staging, plan and device-import
# benchmarks. Go is not needed here. Run from the repository's root; the
# figures, with the card, go to DIR/figures.txt (or $GPU_CHECK_OUT). No GPU
# is a failure, not a skip. Each step is bounded (90 + 120 + 100 + 120 s:
# 7 minutes 10 at most) so that the whole stays under 8.
set -u
dir=$(cd "${1:-bin/gpu-check}" 2>/dev/null && pwd) || { echo "gpu-check: no ${1:-bin/gpu-check} (make gpu-check-build)" >&2; exit 1; }
out=${GPU_CHECK_OUT:-$dir/figures.txt}
root=$(pwd)
for f in kvfabric cuda.test testbed.test; do
	[ -x "$dir/$f" ] || { echo "gpu-check: $dir/$f missing (make gpu-check-build)" >&2; exit 1; }
done
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
	echo "gpu-check: no NVIDIA GPU here (nvidia-smi finds none): this check needs one" >&2
	exit 1
fi

# The tests fail rather than skip without a GPU, and run on the real driver.
export KVF_REQUIRE_GPU=1
export KVFABRIC_CUDA_LIB=${KVFABRIC_CUDA_LIB:-libcuda.so.1}
export KVF_TEST_CUDA_LIB=${KVF_TEST_CUDA_LIB:-libcuda.so.1}
export KVF_TEST_BIN="$dir/kvfabric"

{
	echo "# make gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
	echo "host: $(uname -srm), $(nproc) CPUs"
} >"$out"

failed=0
# step NAME LIMIT_S PKGDIR BINARY ARGS...: runs one test binary in its
# package's folder (as go test does), appending its output to the figures.
step() {
	name=$1 limit=$2 pkg=$3 bin=$4
	shift 4
	echo "== $name" | tee -a "$out"
	t0=$(date +%s)
	(cd "$root/$pkg" && timeout "$limit" "$dir/$bin" "$@") >"$out.step" 2>&1
	cat "$out.step" | tee -a "$out"
	if grep -q -E '^(FAIL|--- FAIL|panic:)' "$out.step" || ! grep -q -E '^(PASS|ok)' "$out.step"; then
		echo "== $name: FAILED ($(($(date +%s) - t0)) s)" | tee -a "$out"
		failed=1
	else
		echo "== $name: ok ($(($(date +%s) - t0)) s)" | tee -a "$out"
	fi
	rm -f "$out.step"
}

step "pool/cuda: real-GPU tests" 90 pool/cuda cuda.test -test.run 'RealGPU' -test.v -test.count=1
step "pool/cuda: staging and plan benchmarks" 120 pool/cuda cuda.test -test.run '^$' -test.bench 'Staging|PlanVsCopy' -test.benchmem -test.benchtime 10x
step "testbed: device pools in agents as processes" 100 testbed testbed.test -test.run '^TestGPUPoolsAcrossProcesses$' -test.v -test.count=1
step "testbed: device-pool import benchmark" 120 testbed testbed.test -test.run '^$' -test.bench 'ImportGPU' -test.benchtime 3x

if [ "$failed" != 0 ]; then
	echo "gpu-check: FAILED; figures and output in $out" >&2
	exit 1
fi
echo "gpu-check: ok; figures in $out"
