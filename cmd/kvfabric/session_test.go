package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
)

// Ten gets with ten layouts on a pool that holds four of their block sets
// at once: each get's session ends with the command, its set is no
// session's any more, and the next get's Register frees it for room. All
// ten succeed and verify every element, and none leaves a session behind.
func TestTenGetsTenLayoutsOnASmallPool(t *testing.T) {
	a := startTestAgentWith(t, "cli-gets", func(c *fabric.Config) {
		c.Pools = []string{"host=16MiB"}
		c.BlockSetGrace = time.Hour // only pressure frees the gets' sets
	})
	sock := []string{"--socket", a.EngineSocket()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// An engine that keeps its blocks, in a small set, for the whole test.
	prod, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	model := layout.ModelConfig{Layers: 2, KVHeads: 8, HeadDim: 16, DType: layout.DTypeBF16}
	set, err := prod.Register(ctx, client.Engine{Name: "producer", Model: model, TPSize: 1, PageSize: 16, Order: layout.HND, Slots: 8})
	if err != nil {
		t.Fatal(err)
	}
	const n = 4
	slots, err := prod.Allocate(ctx, set.ID, n)
	if err != nil {
		t.Fatal(err)
	}
	hashes := make([]uint64, n)
	list := make([]string, n)
	for i := range hashes {
		hashes[i] = uint64(0xabc0 + i)
		list[i] = strconv.FormatUint(hashes[i], 10)
		kvtest.Fill(set.Layout, set.Ranks, int(slots[i]), hashes[i])
	}
	if _, err := prod.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		t.Fatal(err)
	}

	var layouts [][]string
	for _, tp := range []string{"1", "2", "4", "8"} {
		for _, order := range []string{"HND", "NHD"} {
			layouts = append(layouts, []string{"--tp", tp, "--order", order})
		}
	}
	// Two more shapes: a slot count of their own makes a set of their own.
	layouts = append(layouts, []string{"--tp", "1", "--order", "NHD", "--slots", "300"}, []string{"--tp", "2", "--order", "HND", "--slots", "300"})
	if len(layouts) != 10 {
		t.Fatalf("%d layouts", len(layouts))
	}
	dir := t.TempDir()
	for i, l := range layouts {
		// Each get is an engine of one name: the sets of the one before,
		// idle once its session has ended, are what its quota frees.
		wait.For(t, 10*time.Second, "the previous get's session to end", func() error {
			st, err := prod.Status(ctx)
			if err != nil {
				return err
			}
			if len(st.Sessions) != 1 {
				return fmt.Errorf("%d sessions open, want the producer's", len(st.Sessions))
			}
			return nil
		})
		args := append([]string{"get", "--hashes", strings.Join(list, ","), "--verify", "--layers", "2", "--head-dim", "16",
			"--out", filepath.Join(dir, fmt.Sprintf("get%d.bin", i))}, append(l, sock...)...)
		code, _, errs := runCmd(t, "", args...)
		if code != 0 || !strings.Contains(errs, fmt.Sprintf("verified %d blocks", n)) {
			t.Fatalf("get %d %v: exit %d: %s", i, l, code, errs)
		}
	}
	// What is left: the producer's session (holding n references in its
	// set) and nothing of the gets, whose sessions end as their
	// connections close.
	var st *fabricpb.StatusResponse
	wait.For(t, 10*time.Second, "the gets' sessions to end", func() error {
		st, err = prod.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.Sessions) != 1 || st.Sessions[0].Id != prod.Session() || st.Sessions[0].Refs != n || st.Sessions[0].Slots != 0 {
			return fmt.Errorf("sessions after the gets: %v", st.Sessions)
		}
		return nil
	})
	if len(st.BlockSets) > 5 {
		t.Fatalf("%d block sets after the gets: at most 4 fit beside the producer's", len(st.BlockSets))
	}
	for _, b := range st.BlockSets {
		if b.Id != set.ID && (b.Sessions != 0 || b.Free+b.Registered != b.Slots) {
			t.Fatalf("a get's block set is still used: %v", b)
		}
	}
	// status lists the producer's session (its pid is this process) and
	// its own, and shows the gets' sets idle.
	code, out, errs := runCmd(t, "", append([]string{"status"}, sock...)...)
	producer := regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s+producer\s+%d\s+\d+\s+\S+\s+%d\s+%d\s+0$`, prod.Session(), os.Getpid(), set.ID, n))
	if code != 0 || !strings.Contains(out, "SESSION") || !producer.MatchString(out) || !strings.Contains(out, "0 (idle ") {
		t.Fatalf("status: exit %d:\n%s%s", code, out, errs)
	}
}

// The commands that only look (status, members, lookup) open no session:
// with every session the agent allows taken, they still answer, while a
// command that holds blocks (put) is refused naming the bound.
func TestReadOnlyCommandsAnswerWithTheSessionsFull(t *testing.T) {
	a := startTestAgentWith(t, "cli-sessions-full", func(c *fabric.Config) {
		c.EngineSessions, c.EngineSessionsPerProcess = 1, 1
		c.SessionKeepalive = time.Minute
	})
	sock := []string{"--socket", a.EngineSocket()}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	full, err := client.Dial(ctx, a.EngineSocket()) // the only session allowed
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	for _, args := range [][]string{{"status"}, {"status", "--json"}, {"members"}} {
		if code, _, errs := runCmd(t, "", append(args, sock...)...); code != 0 {
			t.Errorf("%v with the sessions full: exit %d: %s", args, code, errs)
		}
	}
	// The agent's answer: no node holds the blocks.
	if code, _, errs := runCmd(t, "", append([]string{"lookup", "--hashes", "1,2"}, sock...)...); !strings.Contains(errs, "no node holds") {
		t.Errorf("lookup with the sessions full: exit %d: %s; want the agent's answer", code, errs)
	}
	if code, _, errs := runCmd(t, "", append([]string{"put", "--generate", "2"}, sock...)...); code != 1 || !strings.Contains(errs, "engine_sessions") {
		t.Errorf("put with the sessions full: exit %d: %s; want the bound named", code, errs)
	}
}
