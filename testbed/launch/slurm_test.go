package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sbatch = "../../deploy/slurm/kvfabric.sbatch"

func TestSlurmScriptSyntax(t *testing.T) {
	if out, err := exec.Command("bash", "-n", sbatch).CombinedOutput(); err != nil {
		t.Fatalf("bash -n: %v\n%s", err, out)
	}
	b, err := os.ReadFile(sbatch)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#SBATCH --ntasks-per-node=1", "srun --nodes=\"$N\" --ntasks=\"$N\" --ntasks-per-node=1"} {
		if !strings.Contains(string(b), want) {
			t.Fatalf("%s lacks %q", sbatch, want)
		}
	}
}

// stubSrun stands in for srun on one machine: with -w NODE it runs the
// command as that node; otherwise it runs one task per node of
// STUB_NODES, each with its own loopback address, and passes SIGTERM on
// as srun does.
const stubSrun = `#!/bin/bash
w=""
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    -w) w=$2; shift 2 ;;
    *) shift ;;
  esac
done
if [[ -n $w ]]; then SLURMD_NODENAME=$w exec "$@"; fi
i=0; pids=()
for n in $STUB_NODES; do
  i=$((i+1))
  SLURMD_NODENAME=$n KVFABRIC_ADDR=$STUB_NET$i "$@" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
wait
wait
`

// The batch script run as Slurm would, with srun and scontrol stood in
// for on this machine: it makes the credentials, starts one agent per
// "node" on its own address, waits for the cluster, runs its check
// (blocks put on the first node, imported and verified on the others)
// and stops the agents, which leave.
func TestSlurmScriptWithStubs(t *testing.T) {
	dir := t.TempDir()
	stubs := filepath.Join(dir, "stubs")
	os.MkdirAll(stubs, 0o755)
	os.WriteFile(filepath.Join(stubs, "srun"), []byte(stubSrun), 0o755)
	os.WriteFile(filepath.Join(stubs, "scontrol"), []byte("#!/bin/sh\nfor n in $STUB_NODES; do echo $n; done\n"), 0o755)
	state := filepath.Join(dir, "state")
	cmd := exec.Command("bash", sbatch)
	cmd.Env = append(os.Environ(),
		"PATH="+stubs+":"+os.Getenv("PATH"),
		"SLURM_JOB_ID=4242", "SLURM_JOB_NODELIST=gpu[1-3]", "STUB_NODES=gpu1 gpu2 gpu3",
		fmt.Sprintf("STUB_NET=127.%d.%d.", 10+rand.IntN(200), 1+rand.IntN(250)),
		"KVFABRIC_BIN="+bin, "KVFABRIC_STATE="+state, "KVFABRIC_RUN_DIR="+filepath.Join(dir, "run"),
		"KVFABRIC_POOL=host=128MiB", "KVFABRIC_TIMEOUT=60")
	done := make(chan error, 1)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			for _, n := range []string{"gpu1", "gpu2", "gpu3"} {
				b, _ := os.ReadFile(filepath.Join(state, "agent."+n+".log"))
				t.Logf("%s log:\n%s", n, b)
			}
			t.Fatalf("script: %v\n%s", err, out.String())
		}
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("script did not finish:\n%s", out.String())
	}
	t.Logf("script output:\n%s", out.String())
	for _, want := range []string{"gpu3 sees 3 members", "gpu2 imported and verified 64 blocks", "gpu3 imported and verified 64 blocks", "check passed"} {
		if !strings.Contains(out.String(), want) {
			t.Fatalf("output lacks %q", want)
		}
	}
	// Each agent left the cluster on SIGTERM rather than being killed.
	for _, n := range []string{"gpu1", "gpu2", "gpu3"} {
		b, err := os.ReadFile(filepath.Join(state, "agent."+n+".log"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.ToLower(string(b)), "leav") && !strings.Contains(strings.ToLower(string(b)), "left") {
			t.Fatalf("%s's log does not show it leaving:\n%s", n, b)
		}
	}
}
