package main

import (
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// put --generate 1100 --slots 1024 fills the block set, so 76 blocks are
// recycled on the way. Eviction used to take the head of the sequence,
// and a look-up from its first block found nothing although most of it
// was held; leaves first, the sequence loses only its tail.
func TestPutPastTheSlotsKeepsThePrefix(t *testing.T) {
	a := startTestAgent(t, "ev1")
	sock := []string{"--socket", a.EngineSocket()}
	model := []string{"--tp", "1", "--layers", "2", "--head-dim", "16", "--slots", "1024"}
	code, out, errs := runCmd(t, "", append(append([]string{"put", "--generate", "1100", "--json"}, sock...), model...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	var put struct {
		BlockSet string   `json:"block_set"`
		Hashes   []string // strings, as in every --json
	}
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 1100 {
		t.Fatalf("put --json: %d hashes (%v)", len(put.Hashes), err)
	}
	list := put.Hashes
	waitIndexed(t, a, put.BlockSet, list)
	// Not every block is held: lookup prints what is and exits 1.
	code, out, errs = runCmd(t, "", append([]string{"lookup", "--json", "--hashes", strings.Join(list, ",")}, sock...)...)
	if code != 1 || !strings.Contains(errs, "no node holds all 1100 blocks") {
		t.Fatalf("lookup: exit %d: %s", code, errs)
	}
	var resp struct {
		Overlaps []struct {
			Node   string
			Blocks uint32
		}
	}
	if err := json.Unmarshal([]byte(out), &resp); err != nil || len(resp.Overlaps) != 1 {
		t.Fatalf("lookup --json: %q (%v)", out, err)
	}
	// The batch of 64 past the 1024 slots recycles the tail stored so
	// far, and with its parent gone it starts a run of its own; the last
	// 12 blocks take the end of the first run. So the held prefix is at
	// least 1024 - 76 - 64 blocks, and short of the 1024 held.
	if got := resp.Overlaps[0].Blocks; got < 1024-76-64 || got >= 1024 {
		t.Fatalf("a look-up from the first block finds %d blocks, want at least %d and fewer than 1024", got, 1024-76-64)
	}
}

// A put of as many blocks as its block set keeps says nothing; one block
// more is told that the set will not keep them all, and what --slots
// would.
func TestPutWarnsPastWhatTheSetKeeps(t *testing.T) {
	a := startTestAgent(t, "ev2")
	// A set recycles only when an allocation needs a slot: 1024 slots
	// keep 1024.
	const retains = 1024
	args := func(n int, seed string) []string {
		return []string{"put", "--socket", a.EngineSocket(), "--tp", "1", "--layers", "2", "--head-dim", "16",
			"--slots", "1024", "--seed", seed, "--generate", strconv.Itoa(n)}
	}
	code, _, errs := runCmd(t, "", args(retains, "1")...)
	if code != 0 || strings.Contains(errs, "warning") {
		t.Fatalf("put of %d blocks into a set that keeps %d: exit %d, stderr %q; want no warning", retains, retains, code, errs)
	}
	code, _, errs = runCmd(t, "", args(retains+1, "2")...)
	if code != 0 || !strings.Contains(errs, "warning: 1025 blocks into a block set that keeps 1024") || !strings.Contains(errs, "--slots 1025 or more") {
		t.Fatalf("put of %d blocks into a set that keeps %d: exit %d, stderr %q; want a warning naming both and --slots 1025", retains+1, retains, code, errs)
	}
}

// A put far past what its block set keeps: the warning says the start of
// the sequence goes, and the line after the put says how much a look-up
// from the first block finds, which is what lookup finds, and fewer than
// the set keeps (all its 128 slots).
func TestPutPastTheSlotsSaysWhatIsRecycled(t *testing.T) {
	a := startTestAgent(t, "ev3")
	sock := []string{"--socket", a.EngineSocket()}
	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "300", "--slots", "128", "--json", "--tp", "1", "--layers", "2", "--head-dim", "16"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	m := regexp.MustCompile(`warning: 300 blocks into a block set that keeps (\d+) before recycling: storing the later blocks recycles (\d+) or more earlier ones, .*start of the sequence`).FindStringSubmatch(errs)
	if m == nil {
		t.Fatalf("put of 300 blocks into 128 slots: no warning naming the start of the sequence: %q", errs)
	}
	retains, _ := strconv.Atoi(m[1])
	if n, _ := strconv.Atoi(m[2]); n != 300-retains || retains != 128 {
		t.Fatalf("warning: keeps %s, recycles %s; want 128 kept and 300 minus that recycled", m[1], m[2])
	}
	h := regexp.MustCompile(`a look-up from the first block finds (\d+) of the 300 blocks here`).FindStringSubmatch(errs)
	if h == nil {
		t.Fatalf("put says nothing of what a look-up finds: %q", errs)
	}
	var put struct{ Hashes []string }
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 300 {
		t.Fatalf("put --json: %d hashes (%v)", len(put.Hashes), err)
	}
	code, out, errs = runCmd(t, "", append([]string{"lookup", "--json", "--hashes", strings.Join(put.Hashes, ",")}, sock...)...)
	var resp struct{ Overlaps []struct{ Blocks uint32 } }
	if err := json.Unmarshal([]byte(out), &resp); code != 1 || err != nil || len(resp.Overlaps) != 1 {
		t.Fatalf("lookup: exit %d: %q %s (%v)", code, out, errs, err)
	}
	if got := strconv.Itoa(int(resp.Overlaps[0].Blocks)); got != h[1] || resp.Overlaps[0].Blocks >= uint32(retains) {
		t.Fatalf("lookup finds %s leading blocks, put said %s; want them equal and fewer than the %d kept", got, h[1], retains)
	}
}
