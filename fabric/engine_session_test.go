package fabric_test

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/internal/wait"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/layout/layoutpb"
)

// engineHelperEnv makes the test binary an engine process (see
// runEngineHelper) instead of running the tests.
const engineHelperEnv = "KVFABRIC_TEST_SESSION_ENGINE_SOCKET"

// sessionEngine is the first layout the engine helper registers; the
// second is the same model at TP 2.
var sessionEngine = client.Engine{Name: "doomed", Model: smallModel, TPSize: 1, PageSize: 4, Order: layout.HND, Slots: 64}

// runEngineHelper is an engine that takes everything it can hold: two
// block sets, allocated slots it never registers, registered blocks it
// keeps referenced and references taken again by Acquire. It prints
// "ready SESSION" and waits to be killed.
func runEngineHelper(sock string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		return err
	}
	set, err := c.Register(ctx, sessionEngine)
	if err != nil {
		return err
	}
	if _, err := c.Allocate(ctx, set.ID, 8); err != nil { // written, never registered
		return err
	}
	slots, err := c.Allocate(ctx, set.ID, 4)
	if err != nil {
		return err
	}
	hashes := []uint64{0xd00d1, 0xd00d2, 0xd00d3, 0xd00d4}
	for i, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), hashes[i])
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots, hashes); err != nil {
		return err
	}
	if _, err := c.Acquire(ctx, set.ID, hashes); err != nil {
		return err
	}
	e2 := sessionEngine
	e2.TPSize = 2
	set2, err := c.Register(ctx, e2)
	if err != nil {
		return err
	}
	if _, err := c.Allocate(ctx, set2.ID, 3); err != nil {
		return err
	}
	fmt.Printf("ready %d\n", c.Session())
	select {}
}

// killHeldEngine checks that the engine helper's session id (process cmd)
// holds what the helpers take (8 references, 11 slots, 2 block sets),
// SIGKILLs it, and waits until its session has ended and both its sets are
// idle with every unregistered slot free, within keepalive of the kill.
func killHeldEngine(t *testing.T, ctx context.Context, watcher *client.Client, st *fabricpb.StatusResponse, id uint64, cmd *exec.Cmd, keepalive time.Duration) {
	t.Helper()
	held := sessionByID(st, id)
	// 4 registered blocks referenced twice (RegisterBlocks, Acquire); 8 + 3
	// allocated slots; two sets.
	if held == nil || held.Refs != 8 || held.Slots != 11 || len(held.BlockSets) != 2 || held.Pid != int32(cmd.Process.Pid) {
		t.Fatalf("the engine's session before the kill: %v (pid %d)", held, cmd.Process.Pid)
	}

	killed := time.Now()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took := wait.For(t, 30*time.Second, "the killed engine's session to end and its sets to be idle", func() error {
		st, err := watcher.Status(ctx)
		if err != nil {
			return err
		}
		if s := sessionByID(st, id); s != nil {
			return fmt.Errorf("session still open: %v", s)
		}
		if len(st.BlockSets) != 2 {
			return fmt.Errorf("%d block sets, want the engine's 2", len(st.BlockSets))
		}
		for _, b := range st.BlockSets {
			if b.Sessions != 0 || b.IdleSinceUnixMs == 0 || b.Free != b.Slots-b.Registered {
				return fmt.Errorf("block set still held: %v", b)
			}
		}
		return nil
	})
	if took > keepalive {
		t.Fatalf("everything given back %v after the kill, past the keepalive bound %v", took, keepalive)
	}
	t.Logf("everything given back %v after SIGKILL", time.Since(killed).Round(time.Millisecond))
}

// sessionByID finds a session in a status answer.
func sessionByID(s *fabricpb.StatusResponse, id uint64) *fabricpb.Session {
	for _, ss := range s.Sessions {
		if ss.Id == id {
			return ss
		}
	}
	return nil
}

// An engine process SIGKILLed while it holds references, allocated slots
// and two block sets: within the keepalive bound the agent has given
// everything back, and a new engine can carve a block set as large as the
// whole pool and allocate every slot of it.
func TestSessionOfKilledEngineFreesAll(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.SessionKeepalive = 5 * time.Second
	cfg.BlockSetGrace = time.Hour // only the new engine's Register frees the sets
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), engineHelperEnv+"="+a.EngineSocket())
	id := startHeldEngine(t, cmd)

	watcher := newClient(t, a)
	st, err := watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	killHeldEngine(t, ctx, watcher, st, id, cmd, cfg.SessionKeepalive)

	// The whole pool in one set: both idle sets must go, and their holes
	// merge. Strides round to 4 KiB here: one slot per page of the pool.
	st, err = watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	whole := int(st.Pools[0].SizeBytes / 4096)
	big := sessionEngine
	// The same engine restarted: its idle sets are its own to free (another
	// engine's cached sets within their share would not be).
	big.Order, big.Slots = layout.NHD, whole
	set, err := watcher.Register(ctx, big)
	if err != nil {
		t.Fatalf("a block set of the whole pool (%d slots): %v", whole, err)
	}
	if set.Layout.Strides().Block != 4096 {
		t.Fatalf("block stride %d, the test assumes 4096", set.Layout.Strides().Block)
	}
	slots, err := watcher.Allocate(ctx, set.ID, whole)
	if err != nil || len(slots) != whole {
		t.Fatalf("allocate all %d slots: %d, %v", whole, len(slots), err)
	}
	st, err = watcher.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.BlockSets) != 1 || st.Pools[0].CarvedBytes != st.Pools[0].SizeBytes {
		t.Fatalf("after the whole-pool set: %v, pool %v", st.BlockSets, st.Pools[0])
	}
}

// rawSession opens a session on the engine API without the Go client, so
// that the test decides when keepalives go.
func rawSession(t *testing.T, ctx context.Context, sock string) (fabricpb.EngineClient, fabricpb.Engine_OpenSessionClient, *fabricpb.SessionEvent) {
	t.Helper()
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	api := fabricpb.NewEngineClient(conn)
	stream, err := api.OpenSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&fabricpb.SessionRequest{Engine: "raw"}); err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return api, stream, ev
}

func inSession(ctx context.Context, id uint64) context.Context {
	return metadata.AppendToOutgoingContext(ctx, fabricpb.SessionMetadata, strconv.FormatUint(id, 10))
}

// A session that keeps sending within the bound stays open for many
// bounds; one that falls silent is ended no sooner than the bound and not
// much later, and what it held is given back.
func TestSessionKeepalive(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.SessionKeepalive = time.Second
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	api, alive, ev := rawSession(t, ctx, a.EngineSocket())
	if ev.KeepaliveMs != 1000 || ev.Session == 0 {
		t.Fatalf("first event %v", ev)
	}
	reg, err := api.Register(inSession(ctx, ev.Session), &fabricpb.RegisterRequest{Engine: "raw", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16})
	if err != nil {
		t.Fatal(err)
	}
	// Keepalives at a quarter of the bound for three bounds.
	stop := time.Now().Add(3 * cfg.SessionKeepalive)
	for time.Now().Before(stop) {
		if err := alive.Send(&fabricpb.SessionRequest{}); err != nil {
			t.Fatalf("keepalive refused: %v", err)
		}
		time.Sleep(cfg.SessionKeepalive / 4) // the pace of the keepalives under test
	}
	if _, err := api.Allocate(inSession(ctx, ev.Session), &fabricpb.AllocateRequest{BlockSet: reg.BlockSet, Count: 2}); err != nil {
		t.Fatalf("a session kept alive for three bounds: %v", err)
	}

	// The live session goes on keeping alive while the silent one lapses.
	keepDone := make(chan struct{})
	t.Cleanup(func() { close(keepDone) })
	go func() {
		tick := time.NewTicker(cfg.SessionKeepalive / 4)
		defer tick.Stop()
		for {
			select {
			case <-keepDone:
				return
			case <-tick.C:
				if alive.Send(&fabricpb.SessionRequest{}) != nil {
					return
				}
			}
		}
	}()

	// Silent from now: allocate under it, then wait for the agent to end it.
	_, silent, ev2 := rawSession(t, ctx, a.EngineSocket())
	if _, err := api.Allocate(inSession(ctx, ev2.Session), &fabricpb.AllocateRequest{BlockSet: reg.BlockSet, Count: 5}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = silent.Recv()
	took := time.Since(start)
	if code(err) != codes.DeadlineExceeded {
		t.Fatalf("silent session ended with %v, want DeadlineExceeded", err)
	}
	if took < cfg.SessionKeepalive-50*time.Millisecond || took > cfg.SessionKeepalive+5*time.Second {
		t.Fatalf("silent session ended after %v, bound %v", took, cfg.SessionKeepalive)
	}
	_, err = api.Allocate(inSession(ctx, ev2.Session), &fabricpb.AllocateRequest{BlockSet: reg.BlockSet, Count: 1})
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("a call in the ended session: %v, want FailedPrecondition", err)
	}
	wait.For(t, 10*time.Second, "the silent session's slots to be free", func() error {
		st, err := api.Status(ctx, &fabricpb.StatusRequest{})
		if err != nil {
			return err
		}
		// 2 slots are the live session's.
		if f := st.BlockSets[0].Free; f != 14 {
			return fmt.Errorf("%d free, want 14", f)
		}
		return nil
	})
}

// A Go client keeps its session at a tight keepalive bound: its
// keepalives go at a third of the bound. By default the bound is 1 s, so
// that two loaded cores cannot starve the keepalive goroutine past it;
// -kvfabric.long runs it at the smallest bound allowed.
func TestSessionKeepaliveAtTheLimit(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.SessionKeepalive = time.Second
	if f := flag.Lookup("kvfabric.long"); f != nil && f.Value.String() == "true" {
		cfg.SessionKeepalive = fabric.MinSessionKeepalive
	}
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, a)
	set := register(t, c, sessionEngine)
	deadline := time.Now().Add(5 * cfg.SessionKeepalive)
	for time.Now().Before(deadline) {
		if _, err := c.Allocate(ctx, set.ID, 1); err != nil {
			t.Fatalf("session at a %v bound: %v (%v)", cfg.SessionKeepalive, err, c.SessionErr())
		}
		time.Sleep(cfg.SessionKeepalive / 4) // spread the calls over many bounds
	}
	if err := c.SessionErr(); err != nil {
		t.Fatal(err)
	}
}

// Two engines with one layout share a block set, each with its own slots
// and references; DropBlockSet gives back only the caller's; the set no
// session uses is freed after the grace period, its blocks evicted.
func TestSessionsShareAndDropBlockSet(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = 300 * time.Millisecond
	cfg.NoOrphanCache = true // freed at the grace period, blocks and all
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e1 := newClient(t, a)
	e2 := newClient(t, a)
	s1 := register(t, e1, sessionEngine)
	s2 := register(t, e2, sessionEngine)
	if s1.ID != s2.ID {
		t.Fatalf("one layout, two sets: %d and %d", s1.ID, s2.ID)
	}
	mine, err := e1.Allocate(ctx, s1.ID, 3)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := e2.Allocate(ctx, s1.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	kvtest.Fill(s2.Layout, s2.Ranks, int(theirs[0]), 7)
	if _, err := e2.RegisterBlocks(ctx, s1.ID, theirs[:1], []uint64{7}); err != nil {
		t.Fatal(err)
	}
	// e2 cannot free e1's slot: it holds nothing there.
	if err := e2.Free(ctx, s1.ID, mine[:1]); code(err) != codes.FailedPrecondition {
		t.Fatalf("free another session's slot: %v, want FailedPrecondition", err)
	}
	resp, err := e1.DropBlockSet(ctx, s1.ID)
	if err != nil || resp.Freed != 3 || resp.Released != 0 {
		t.Fatalf("drop: %v %v, want 3 freed", resp, err)
	}
	if _, err := e1.DropBlockSet(ctx, s1.ID); code(err) != codes.FailedPrecondition {
		t.Fatalf("second drop: %v, want FailedPrecondition", err)
	}
	st, err := e2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b := st.BlockSets[0]; b.Sessions != 1 || b.Free != b.Slots-2 || b.Registered != 1 {
		t.Fatalf("after e1 dropped: %v", b)
	}
	// e2 drops too: the set is idle, and freed after the grace period.
	if resp, err := e2.DropBlockSet(ctx, s1.ID); err != nil || resp.Freed != 1 || resp.Released != 1 {
		t.Fatalf("e2's drop: %v %v, want 1 freed and 1 released", resp, err)
	}
	wait.For(t, 10*time.Second, "the idle set to be freed", func() error {
		st, err := e2.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 0 || st.Pools[0].CarvedBytes != 0 || st.IndexEntries != 0 {
			return fmt.Errorf("block sets %v, carved %d, index entries %d", st.BlockSets, st.Pools[0].CarvedBytes, st.IndexEntries)
		}
		return nil
	})
	if _, err := e2.Allocate(ctx, s1.ID, 1); code(err) != codes.NotFound {
		t.Fatalf("allocate in a freed set: %v, want NotFound", err)
	}
	// Registering the layout again makes a new set.
	s3, err := e2.Register(ctx, sessionEngine)
	if err != nil || s3.ID == s1.ID {
		t.Fatalf("register after the free: %v, set %d", err, s3.ID)
	}
}

// The Go client's DropBlockSet gives up the set's memory: the BlockSets of
// it the client returned (two Registers of one layout) lose their views,
// and its mapping is gone from the process, while another set of the same
// client keeps its own, its bytes as written; Close clears what is left.
func TestClientDropBlockSetUnmaps(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, a)
	dropped := register(t, c, sessionEngine)
	again := register(t, c, sessionEngine)
	kept := register(t, c, tierEngine)
	if again.ID != dropped.ID || kept.ID == dropped.ID {
		t.Fatalf("sets %d, %d and %d: want the first two one set, the third another", dropped.ID, again.ID, kept.ID)
	}
	at := func(s *client.BlockSet) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(s.Ranks[0]))) }
	droppedAt, keptAt := at(dropped), at(kept)
	for _, p := range []uintptr{droppedAt, keptAt} {
		if !mappedAt(t, p) {
			t.Fatalf("a registered set's memory at %#x is not mapped", p)
		}
	}
	kvtest.Fill(kept.Layout, kept.Ranks, 0, 5)
	if _, err := c.DropBlockSet(ctx, dropped.ID); err != nil {
		t.Fatal(err)
	}
	if dropped.Ranks != nil || again.Ranks != nil {
		t.Fatal("the dropped set's BlockSets keep their views")
	}
	if mappedAt(t, droppedAt) {
		t.Fatalf("the dropped set's memory at %#x is still mapped", droppedAt)
	}
	if kept.Ranks == nil || !mappedAt(t, keptAt) {
		t.Fatal("the set not dropped lost its memory")
	}
	if err := kvtest.Check(kept.Layout, kept.Ranks, 0, 5); err != nil {
		t.Fatalf("the set not dropped: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if kept.Ranks != nil || mappedAt(t, keptAt) {
		t.Fatal("Close left the other set's memory mapped or its views")
	}
}

// mappedAt says whether this process maps the address p (/proc/self/maps).
func mappedAt(t *testing.T, p uintptr) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(b)) {
		lo, hi, ok := strings.Cut(strings.Fields(line)[0], "-")
		if !ok {
			t.Fatalf("/proc/self/maps: %q", line)
		}
		l, err1 := strconv.ParseUint(lo, 16, 64)
		h, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("/proc/self/maps: %q", line)
		}
		if uint64(p) >= l && uint64(p) < h {
			return true
		}
	}
	return false
}

// RegisterBlocks, Acquire and Import with good and bad blocks mixed answer
// each block's outcome; a request with nothing done is an error.
func TestPerBlockResults(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := newClient(t, a)
	set := register(t, c, sessionEngine)
	slots, err := c.Allocate(ctx, set.ID, 4)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RegisterBlocks(ctx, set.ID, slots[:1], []uint64{11}); err != nil {
		t.Fatal(err)
	}
	// slots[1]: fine; 60: never allocated; slots[2]: duplicate of 11;
	// 1000: out of range; slots[3]: fine.
	req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: []uint32{slots[1], 60, slots[2], 1000, slots[3]}, Hashes: []uint64{12, 13, 11, 14, 15}}
	resp, err := c.API().RegisterBlocks(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		outcome fabricpb.Outcome
		code    codes.Code
		slot    uint32
	}{
		{fabricpb.Outcome_OUTCOME_REGISTERED, codes.OK, slots[1]},
		{fabricpb.Outcome_OUTCOME_REFUSED, codes.FailedPrecondition, 0},
		{fabricpb.Outcome_OUTCOME_DUPLICATE, codes.OK, slots[0]},
		{fabricpb.Outcome_OUTCOME_REFUSED, codes.FailedPrecondition, 0},
		{fabricpb.Outcome_OUTCOME_REGISTERED, codes.OK, slots[3]},
	}
	if len(resp.Results) != len(want) || len(resp.Blocks) != 3 {
		t.Fatalf("results %v, blocks %v", resp.Results, resp.Blocks)
	}
	for i, w := range want {
		r := resp.Results[i]
		if r.Outcome != w.outcome || codes.Code(r.Code) != w.code || r.Slot != w.slot || r.RequestSlot != req.Slots[i] || r.Hash != req.Hashes[i] {
			t.Errorf("result %d: %v, want %v code %v slot %d", i, r, w.outcome, w.code, w.slot)
		}
		if w.outcome == fabricpb.Outcome_OUTCOME_REFUSED && !strings.Contains(r.Reason, "slot "+strconv.Itoa(int(req.Slots[i]))) {
			t.Errorf("result %d: reason %q does not name the slot", i, r.Reason)
		}
	}
	// Nothing registered: a call error.
	_, err = c.API().RegisterBlocks(ctx, &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: []uint32{60}, Hashes: []uint64{99}})
	if code(err) != codes.FailedPrecondition {
		t.Fatalf("a RegisterBlocks that did nothing: %v, want FailedPrecondition", err)
	}

	acq, err := c.API().Acquire(ctx, &fabricpb.AcquireRequest{BlockSet: set.ID, Hashes: []uint64{11, 12, 77, 15}})
	if err != nil {
		t.Fatal(err)
	}
	wantAcq := []fabricpb.Outcome{fabricpb.Outcome_OUTCOME_ACQUIRED, fabricpb.Outcome_OUTCOME_ACQUIRED, fabricpb.Outcome_OUTCOME_MISSING, fabricpb.Outcome_OUTCOME_SKIPPED}
	if len(acq.Results) != 4 || len(acq.Blocks) != 2 {
		t.Fatalf("acquire: results %v, blocks %v", acq.Results, acq.Blocks)
	}
	for i, w := range wantAcq {
		if acq.Results[i].Outcome != w {
			t.Errorf("acquire result %d: %v, want %v", i, acq.Results[i], w)
		}
	}
	if acq.Results[0].Slot != slots[0] || acq.Results[1].Slot != slots[1] || codes.Code(acq.Results[2].Code) != codes.NotFound {
		t.Errorf("acquire results: %v", acq.Results)
	}

	imp, err := c.API().Import(ctx, &fabricpb.ImportRequest{BlockSet: set.ID, Hashes: []uint64{11, 12, 88, 89}, TimeoutMs: 2000})
	if err != nil {
		t.Fatal(err)
	}
	wantImp := []fabricpb.Outcome{fabricpb.Outcome_OUTCOME_LOCAL, fabricpb.Outcome_OUTCOME_LOCAL, fabricpb.Outcome_OUTCOME_MISSING, fabricpb.Outcome_OUTCOME_MISSING}
	if len(imp.Results) != 4 || len(imp.Blocks) != 2 || imp.Error == "" {
		t.Fatalf("import: results %v, blocks %v, error %q", imp.Results, imp.Blocks, imp.Error)
	}
	for i, w := range wantImp {
		if imp.Results[i].Outcome != w {
			t.Errorf("import result %d: %v, want %v", i, imp.Results[i], w)
		}
	}
	if r := imp.Results[2]; codes.Code(r.Code) != codes.NotFound || r.Reason == "" {
		t.Errorf("import of a block no node holds: %v, want NotFound with a reason", r)
	}
	// Nothing brought: a call error.
	if _, err := c.API().Import(ctx, &fabricpb.ImportRequest{BlockSet: set.ID, Hashes: []uint64{88}, TimeoutMs: 2000}); code(err) != codes.NotFound {
		t.Fatalf("an import that brought nothing: %v, want NotFound", err)
	}
}

// A call naming a session that is not open, or naming one badly, does
// nothing and says why; a call naming none works as before sessions.
func TestSessionMetadataChecked(t *testing.T) {
	a := startAgent(t, testConfig(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := grpc.NewClient("unix:"+a.EngineSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := fabricpb.NewEngineClient(conn)
	reg := &fabricpb.RegisterRequest{Engine: "plain", Model: smallModel.Proto(), TpSize: 1, PageSize: 4, KvOrder: layoutpb.KVOrder_KV_ORDER_HND, Slots: 16}
	for _, tc := range []struct {
		value string
		code  codes.Code
	}{{"12345", codes.FailedPrecondition}, {"x", codes.InvalidArgument}, {"0", codes.InvalidArgument}} {
		_, err := api.Register(metadata.AppendToOutgoingContext(ctx, fabricpb.SessionMetadata, tc.value), reg)
		if code(err) != tc.code || !strings.Contains(err.Error(), "session") {
			t.Errorf("session %q: %v, want %v naming the session", tc.value, err, tc.code)
		}
	}
	st, err := api.Status(ctx, &fabricpb.StatusRequest{})
	if err != nil || len(st.BlockSets) != 0 {
		t.Fatalf("refused registers made block sets: %v %v", st.GetBlockSets(), err)
	}
	r, err := api.Register(ctx, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Allocate(ctx, &fabricpb.AllocateRequest{BlockSet: r.BlockSet, Count: 2}); err != nil {
		t.Fatal(err)
	}
	st, err = api.Status(ctx, &fabricpb.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if s := sessionByID(st, 0); s == nil || s.Slots != 2 || len(s.BlockSets) != 1 {
		t.Fatalf("the implicit session: %v", st.Sessions)
	}
}

// A set whose sessions ended keeps its registered blocks through the grace
// period: an engine that registers the layout again gets the same set,
// and the blocks.
func TestIdleBlockSetReusedWithItsBlocks(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first, err := client.Dial(ctx, a.EngineSocket())
	if err != nil {
		t.Fatal(err)
	}
	set := register(t, first, sessionEngine)
	slots, err := first.Allocate(ctx, set.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range slots {
		kvtest.Fill(set.Layout, set.Ranks, int(s), uint64(40+i))
	}
	if _, err := first.RegisterBlocks(ctx, set.ID, slots, []uint64{40, 41}); err != nil {
		t.Fatal(err)
	}
	first.Close()

	next := newClient(t, a)
	wait.For(t, 10*time.Second, "the first session's set to be idle", func() error {
		st, err := next.Status(ctx)
		if err != nil {
			return err
		}
		if len(st.BlockSets) != 1 || st.BlockSets[0].IdleSinceUnixMs == 0 {
			return fmt.Errorf("block sets %v", st.BlockSets)
		}
		return nil
	})
	again, err := next.Register(ctx, sessionEngine)
	if err != nil || again.ID != set.ID {
		t.Fatalf("register the idle layout: set %v, %v; want %d", again, err, set.ID)
	}
	refs, err := next.Acquire(ctx, again.ID, []uint64{40, 41})
	if err != nil || len(refs) != 2 {
		t.Fatalf("acquire the cached blocks: %v %v", refs, err)
	}
	for i, r := range refs {
		if err := kvtest.Check(again.Layout, again.Ranks, int(r.Slot), uint64(40+i)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := next.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if b := st.BlockSets[0]; b.Sessions != 1 || b.IdleSinceUnixMs != 0 {
		t.Fatalf("a set in use again: %v", b)
	}
}

// A set kept past its grace period with a slot retired in it has fewer
// usable slots than its engine asks for; when no new set fits beside it
// (here the pool holds one set of the engine's size), the engine
// registering again is given the kept set rather than refused.
func TestKeptSetWithRetiredSlotsReusedWhenNoNewSetFits(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace, cfg.NoOrphanCache = 100*time.Millisecond, true
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const poolBytes = 16 << 20 // testConfig's host pool
	e := client.Engine{Name: "restarts", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND}
	e.Slots = int(poolBytes * 3 / 4 / e.Model.BlockBytes(e.PageSize))
	first := newClient(t, a)
	set := register(t, first, e)
	if b := set.Layout.Regions[0].Size; b <= poolBytes/2 || b > poolBytes {
		t.Fatalf("the engine's set takes %d bytes of the %d-byte pool: want more than half, so that no second set fits", b, poolBytes)
	}
	if err := fabric.RetireSlot(a, set.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := first.DropBlockSet(ctx, set.ID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 30*time.Second, "the dropped set's grace period over", func() error {
		if !fabric.IdleSetKept(a, set.ID) {
			return fmt.Errorf("set %d not idle and kept", set.ID)
		}
		return nil
	})
	next := newClient(t, a)
	again, err := next.Register(ctx, e)
	if err != nil || again.ID != set.ID {
		t.Fatalf("the engine registering again for %d slots with room for no new set: %v, %v; want the kept set %d", e.Slots, again, err, set.ID)
	}
	// Every slot but the retired one is the engine's.
	if s, err := next.Allocate(ctx, again.ID, e.Slots-1); err != nil || len(s) != e.Slots-1 {
		t.Fatalf("the kept set's %d usable slots: %d, %v", e.Slots-1, len(s), err)
	}
	if _, err := next.Allocate(ctx, again.ID, 1); err == nil {
		t.Fatalf("allocated the kept set's retired slot")
	}
}

// startHeldEngine starts an engine helper process that holds a session
// (it prints "ready SESSION"), killed when the test ends, and returns its
// session id.
func startHeldEngine(t *testing.T, cmd *exec.Cmd) uint64 {
	t.Helper()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("engine helper: %v", err)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "ready ")), 10, 64)
	if err != nil {
		t.Fatalf("engine helper said %q", line)
	}
	return id
}

// A Register that asks for no slot count, with no room for a set of the
// default size even after the idle sets are freed, is given the idle set
// of its layout and another size rather than refused: that set is the one
// it falls back to, so it is not among the sets freed for room.
func TestRegisterWithNoSlotCountKeepsTheSetItFallsBackTo(t *testing.T) {
	cfg := testConfig(t, "n1")
	cfg.BlockSetGrace = time.Hour
	a := startAgent(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const poolBytes = 16 << 20 // testConfig's host pool
	// Another layout's set, in use, takes most of the pool.
	big := client.Engine{Name: "big", Model: testModel, TPSize: 1, PageSize: 32, Order: layout.HND}
	big.Slots = int(poolBytes * 78 / 100 / big.Model.BlockBytes(big.PageSize))
	register(t, newClient(t, a), big)
	// The engine's set of a few slots, idle.
	e := client.Engine{Name: "e", Model: testModel, TPSize: 1, PageSize: 16, Order: layout.HND}
	e.Slots = int(poolBytes * 8 / 100 / e.Model.BlockBytes(e.PageSize))
	first := newClient(t, a)
	small := register(t, first, e)
	if _, err := first.DropBlockSet(ctx, small.ID); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 10*time.Second, "the engine's set idle", func() error {
		st, err := first.Status(ctx)
		if err != nil {
			return err
		}
		for _, b := range st.BlockSets {
			if b.Id == small.ID && b.IdleSinceUnixMs != 0 {
				return nil
			}
		}
		return fmt.Errorf("set %d not idle: %v", small.ID, st.BlockSets)
	})
	// The default size (a quarter of the pool) fits neither beside both
	// sets nor with the idle one freed.
	e.Slots = 0
	again, err := newClient(t, a).Register(ctx, e)
	if err != nil || again.ID != small.ID {
		t.Fatalf("register with no slot count and no room for the default size: %v, %v; want the idle set %d", again, err, small.ID)
	}
	if got, want := again.Layout.Slots, int(poolBytes*8/100/testModel.BlockBytes(16)); got != want {
		t.Fatalf("the set given has %d slots, want the idle set's %d", got, want)
	}
}
