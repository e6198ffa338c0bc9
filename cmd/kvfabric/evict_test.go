package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
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
	m := regexp.MustCompile(`warning: 300 blocks into a block set that keeps (\d+) before recycling: storing the later blocks recycles (\d+) or more earlier ones out of the set, .*start of the sequence, so a look-up from its first block finds fewer than 128, possibly none`).FindStringSubmatch(errs)
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
	if n, _ := strconv.Atoi(h[1]); n >= retains {
		t.Fatalf("put says a look-up finds %s leading blocks, want fewer than the %d kept", h[1], retains)
	}
	// put counts what its set holds when it has registered the blocks;
	// the index applies the last of them, and of the blocks recycled,
	// from the pool's events after that.
	wait.For(t, 20*time.Second, "lookup to find what put said", func() error {
		code, out, errs := runCmd(t, "", append([]string{"lookup", "--json", "--hashes", strings.Join(put.Hashes, ",")}, sock...)...)
		var resp struct{ Overlaps []struct{ Blocks uint32 } }
		if err := json.Unmarshal([]byte(out), &resp); code != 1 || err != nil || len(resp.Overlaps) != 1 {
			return fmt.Errorf("lookup: exit %d: %q %s (%v)", code, out, errs, err)
		}
		if got := strconv.Itoa(int(resp.Overlaps[0].Blocks)); got != h[1] {
			return fmt.Errorf("lookup finds %s leading blocks, put said %s", got, h[1])
		}
		return nil
	})
}

// The agent's status only words put's warning past its set: where the
// Status call fails, put gives the warning without tiers, as a node
// without them would, and stores its blocks.
func TestPutPastTheSlotsWithoutTheAgentsStatus(t *testing.T) {
	a := startTestAgentWith(t, "ev7", func(c *fabric.Config) {
		c.Tiers = []string{"disk=" + filepath.Join(c.DataDir, "tier") + ":64MiB"}
	})
	var out, errb bytes.Buffer
	e := &env{stdin: strings.NewReader(""), stdout: &out, stderr: &errb,
		status: func(context.Context, *client.Client) (*fabricpb.StatusResponse, error) {
			return nil, errors.New("status refused")
		}}
	code := run(e, []string{"put", "--generate", "300", "--slots", "128", "--json", "--tp", "1", "--layers", "2", "--head-dim", "16", "--socket", a.EngineSocket()})
	errs := errb.String()
	if code != 0 || !regexp.MustCompile(`warning: 300 blocks into a block set that keeps (\d+) before recycling: .*start of the sequence, `+
		`so a look-up from its first block finds fewer than (\d+), possibly none`).MatchString(errs) {
		t.Fatalf("put past its set where Status fails: exit %d, %q; want 0 and the warning without tiers", code, errs)
	}
	var put struct{ Hashes []string }
	if err := json.Unmarshal(out.Bytes(), &put); err != nil || len(put.Hashes) != 300 {
		t.Fatalf("put --json: %d hashes (%v)", len(put.Hashes), err)
	}
}

// The line after a put past what its block set keeps counts the blocks
// the set holds once the put has registered them, not what the index
// answers at that moment: an owned index answers from its cache of the
// owners' answers (here the agent alone, with a minute's cache), and a
// look-up of the hashes before the put left there that none is held. The
// figure is the leading run a look-up naming the set finds there, which
// is more than none and fewer than the set keeps.
func TestPutSaysWhatTheSetHoldsNotAStaleIndex(t *testing.T) {
	a := startTestAgentWith(t, "ev4", func(c *fabric.Config) {
		c.IndexMode = fabric.IndexOwned
		c.IndexCacheTTL = fabric.MaxIndexCacheTTL
	})
	sock := []string{"--socket", a.EngineSocket()}
	const blocks, slots, page = 200, 128, 16
	rng := rand.New(rand.NewPCG(7, 0))
	tokens := make([]string, blocks*page)
	ids := make([]uint32, len(tokens))
	for i := range tokens {
		ids[i] = rng.Uint32N(128000)
		tokens[i] = strconv.FormatUint(uint64(ids[i]), 10)
	}
	hasher, err := layout.NewHasher(page, layout.HashOptions{})
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]string, blocks)
	for i, b := range hasher.Sequence(ids) {
		hashes[i] = strconv.FormatUint(b.Sequence, 10)
	}
	// None held yet: the answer is cached for a minute.
	code, _, errs := runCmd(t, "", append([]string{"lookup", "--hashes", strings.Join(hashes, ",")}, sock...)...)
	if code != 1 {
		t.Fatalf("lookup before the put: exit %d: %s", code, errs)
	}
	code, out, errs := runCmd(t, strings.Join(tokens, " "), append([]string{"put", "--json", "--slots", strconv.Itoa(slots),
		"--tp", "1", "--layers", "2", "--head-dim", "16", "--page-size", strconv.Itoa(page)}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	var put struct {
		BlockSet string `json:"block_set"`
		Hashes   []string
	}
	if err := json.Unmarshal([]byte(out), &put); err != nil || !slices.Equal(put.Hashes, hashes) {
		t.Fatalf("put --json: %q (%v), want the %d hashes of its tokens", out, err, blocks)
	}
	h := regexp.MustCompile(`a look-up from the first block finds (\d+) of the 200 blocks here`).FindStringSubmatch(errs)
	if h == nil {
		t.Fatalf("put says nothing of what a look-up finds: %q", errs)
	}
	// What the set holds from the first block, read from the set.
	set, _ := strconv.ParseUint(put.BlockSet, 10, 64)
	req := &fabricpb.LookupRequest{BlockSet: set}
	for _, s := range hashes {
		v, _ := strconv.ParseUint(s, 10, 64)
		req.Hashes = append(req.Hashes, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := c.API().Lookup(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	held := 0
	for held < len(resp.LocalTiers) && resp.LocalTiers[held] != "" {
		held++
	}
	if held == 0 || held >= slots {
		t.Fatalf("the set holds %d leading blocks of %d in %d slots; the test wants some and fewer than the slots", held, blocks, slots)
	}
	if got := h[1]; got != strconv.Itoa(held) {
		t.Fatalf("put says a look-up finds %s leading blocks; the set holds %d", got, held)
	}
}

// put's line on what a look-up from the first block finds is a count, not
// a use: on an agent with a disk tier, where the blocks a put past its set
// recycles are copied down, its look-ups bring none of them back up into
// the set and read nothing ahead (they restored the first run the tier
// held, and started reading after it, on every put past its set). The
// sequence is put twice, the second time once the first put's copies down
// are on disk, so that the second put's line finds blocks there whatever
// copies of its own are still under way.
func TestPutsLineRestoresNothing(t *testing.T) {
	a := startTestAgentWith(t, "ev5", func(c *fabric.Config) {
		c.Tiers = []string{"disk=" + filepath.Join(c.DataDir, "tier") + ":64MiB"}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tier := func() (*fabricpb.Tier, error) {
		st, err := c.Status(ctx)
		if err != nil {
			return nil, err
		}
		if len(st.Tiers) != 1 {
			return nil, fmt.Errorf("status shows %d tiers, want 1", len(st.Tiers))
		}
		return st.Tiers[0], nil
	}
	put := []string{"put", "--socket", a.EngineSocket(), "--generate", "400", "--seed", "1", "--slots", "128",
		"--tp", "1", "--layers", "2", "--head-dim", "16"}
	var line []string
	for i := range 2 {
		code, _, errs := runCmd(t, "", put...)
		if code != 0 {
			t.Fatalf("put %d: exit %d: %s", i+1, code, errs)
		}
		h := regexp.MustCompile(`a look-up from the first block finds (\d+) of the 400 blocks here`).FindStringSubmatch(errs)
		if h == nil {
			t.Fatalf("put %d says nothing of what a look-up finds: %q", i+1, errs)
		}
		line = append(line, h[1])
		if i == 0 {
			wait.For(t, 20*time.Second, "blocks of the first put on disk", func() error {
				ts, err := tier()
				if err != nil || ts.Blocks == 0 {
					return fmt.Errorf("tier %v (%v)", ts, err)
				}
				return nil
			})
		}
	}
	ts, err := tier()
	if err != nil {
		t.Fatal(err)
	}
	if ts.Restores != 0 || ts.ReadAheadBlocks != 0 {
		t.Fatalf("after two puts past the set (their lines: %s held): the tier restored %d blocks and read %d ahead; want none",
			strings.Join(line, " and "), ts.Restores, ts.ReadAheadBlocks)
	}
}

// On a node with a disk tier, the line after a put past its set counts
// the blocks whose copies down were under way as it asked (its look-ups
// wait for them, no_restore): it says what a look-up finds once they
// end, as lookup does later, not 0 because the first blocks were between
// the set and the disk when it asked.
func TestPutsLineCountsBlocksOnTheirWayDown(t *testing.T) {
	a := startTestAgentWith(t, "ev6", func(c *fabric.Config) {
		c.Tiers = []string{"disk=" + filepath.Join(c.DataDir, "tier") + ":64MiB"}
	})
	sock := []string{"--socket", a.EngineSocket()}
	code, out, errs := runCmd(t, "", append([]string{"put", "--generate", "400", "--seed", "1", "--slots", "128", "--json",
		"--tp", "1", "--layers", "2", "--head-dim", "16"}, sock...)...)
	if code != 0 {
		t.Fatalf("put: exit %d: %s", code, errs)
	}
	// The warning says the recycled blocks go to the tier first, and that
	// a look-up finds them up to the first one dropped, possibly none (a
	// tier without room, blocks too large for it).
	if !strings.Contains(errs, "warning: 400 blocks into a block set that keeps ") || !strings.Contains(errs, "copied down to this node's tiers first") ||
		!strings.Contains(errs, "up to the first one dropped, possibly none") {
		t.Fatalf("put past its set on a node with a tier: %q; want a warning that the recycled blocks are copied down", errs)
	}
	h := regexp.MustCompile(`a look-up from the first block finds (\d+) of the 400 blocks here`).FindStringSubmatch(errs)
	if h == nil {
		t.Fatalf("put says nothing of what a look-up finds: %q", errs)
	}
	var put struct{ Hashes []string }
	if err := json.Unmarshal([]byte(out), &put); err != nil || len(put.Hashes) != 400 {
		t.Fatalf("put --json: %d hashes (%v)", len(put.Hashes), err)
	}
	// The index learns of the copies as they are committed, after the
	// put: wait for it to find some on this node, then for what it finds
	// to come to what the line said.
	wait.For(t, 20*time.Second, "lookup to find the blocks put said a look-up finds", func() error {
		code, out, errs := runCmd(t, "", append([]string{"lookup", "--json", "--hashes", strings.Join(put.Hashes, ",")}, sock...)...)
		var resp struct{ Overlaps []struct{ Blocks uint32 } }
		if err := json.Unmarshal([]byte(out), &resp); code > 1 || err != nil || len(resp.Overlaps) != 1 {
			return fmt.Errorf("lookup: exit %d: %q %s (%v)", code, out, errs, err)
		}
		if got := strconv.Itoa(int(resp.Overlaps[0].Blocks)); got == "0" || got != h[1] {
			return fmt.Errorf("lookup finds %s leading blocks, put said %s", got, h[1])
		}
		return nil
	})
}
