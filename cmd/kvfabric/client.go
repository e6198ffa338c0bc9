package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/kvfabric/kvfabric/fabric"
	"github.com/kvfabric/kvfabric/fabric/client"
	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/internal/kvtest"
	"github.com/kvfabric/kvfabric/layout"
)

// defaultSocket is the agent's socket unless --socket or KVFABRIC_SOCKET
// say otherwise.
func defaultSocket() string {
	if s := os.Getenv("KVFABRIC_SOCKET"); s != "" {
		return s
	}
	return "/var/lib/kvfabric/engine.sock"
}

// clientFlags are the flags of every command that talks to the agent.
type clientFlags struct {
	socket  *string
	json    *bool
	timeout *positiveDuration
}

func addClientFlags(fs *flag.FlagSet) clientFlags {
	timeout := positiveDuration(time.Minute)
	fs.Var(&timeout, "timeout", "bound on the whole command, a `duration` more than 0")
	return clientFlags{
		socket:  fs.String("socket", defaultSocket(), "the agent's engine socket (env KVFABRIC_SOCKET)"),
		json:    fs.Bool("json", false, "print JSON for scripts instead of a table"),
		timeout: &timeout,
	}
}

// positiveDuration is a duration flag refused, as the flags are parsed,
// unless it is more than zero: a bound already past would fail every call
// naming no flag, and found only once the command had read its input (put
// reads standard input first).
type positiveDuration time.Duration

func (d *positiveDuration) String() string { return time.Duration(*d).String() }

func (d *positiveDuration) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return errors.New("not a duration such as 30s")
	}
	if v <= 0 {
		return errors.New("must be positive")
	}
	*d = positiveDuration(v)
	return nil
}

// dial connects to the agent with a session of the command's own, which
// ends with it: for commands that hold slots or blocks (put, get, import).
func (f clientFlags) dial(opts ...client.DialOption) (*client.Client, context.Context, context.CancelFunc, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*f.timeout))
	c, err := client.Dial(ctx, *f.socket, opts...)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return c, ctx, cancel, nil
}

// dialReadOnly connects to the agent with no session (client.
// WithoutSession), for commands that only look (status, members,
// lookup): they hold nothing, and still answer where the agent's bounds
// on sessions are all taken, which is when an operator looks for the
// process that took them.
func (f clientFlags) dialReadOnly() (*client.Client, context.Context, context.CancelFunc, error) {
	return f.dial(client.WithoutSession())
}

// agentCallErr is err, a read-only command's call, saying that the agent
// may not run where it could not be reached (no session was opened to
// find that out first).
func agentCallErr(err error) error {
	if status.Code(err) == codes.Unavailable {
		return fmt.Errorf("%w (is the agent running?)", err)
	}
	return err
}

// status asks the agent for its status.
func (f clientFlags) status() (*fabricpb.StatusResponse, error) {
	c, ctx, cancel, err := f.dialReadOnly()
	if err != nil {
		return nil, err
	}
	defer cancel()
	defer c.Close()
	s, err := c.Status(ctx)
	return s, agentCallErr(err)
}

func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  ", EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func table(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

func runMembers(e *env, args []string) error {
	fs := newFlags(e, "members", "[--socket PATH] [--json]", "Lists the cluster's members as the local agent sees them, with the blocks each holds, and the members that left or failed in the last minutes.")
	cf := addClientFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	s, err := cf.status()
	if err != nil {
		return err
	}
	if *cf.json {
		// A list of members, each in protobuf JSON form.
		out := make([]json.RawMessage, len(s.Members))
		for i, m := range s.Members {
			if out[i], err = protojson.Marshal(m); err != nil {
				return err
			}
		}
		return json.NewEncoder(e.stdout).Encode(out)
	}
	return printMembers(e.stdout, s.Members, time.Now())
}

func printMembers(w io.Writer, members []*fabricpb.Member, now time.Time) error {
	tw := table(w)
	fmt.Fprintln(tw, "NODE\tGOSSIP\tPEER\tSTATE\tSINCE\tBLOCKS\tRDMA\tGPUS\tPEER LINK")
	for _, m := range members {
		since, blocks := "", fmt.Sprint(m.Blocks)
		if m.SinceUnixMs != 0 {
			since = now.Sub(time.UnixMilli(m.SinceUnixMs)).Round(time.Second).String() + " ago"
			blocks = "-"
		}
		rdma, gpus := "no", "-"
		if m.Rdma {
			rdma = "yes"
		}
		if m.Gpus > 0 {
			gpus = fmt.Sprintf("%d x %s, %s pools, %d NICs", m.Gpus, m.GpuModel, bytesString(m.GpuPoolBytes), m.GpuNics)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Node, m.GossipAddr, m.PeerAddr, m.State, since, blocks, rdma, gpus, peerLink(m))
	}
	return tw.Flush()
}

// peerLink says how the local agent's peer connection to m fares:
// authenticated, refused (it answered, but the handshake failed: another
// CA, say), unreachable, or "-" before any dial (and for the node itself).
func peerLink(m *fabricpb.Member) string {
	switch {
	case m.PeerAuthenticated:
		return "authenticated"
	case m.PeerError != "" && m.PeerReachable:
		return "NOT AUTHENTICATED: " + m.PeerError
	case m.PeerError != "":
		return "unreachable: " + m.PeerError
	}
	return "-"
}

func runStatus(e *env, args []string) error {
	fs := newFlags(e, "status", "[--socket PATH] [--json]", "Shows the local agent: whether it has joined, its members (and those gone lately), its pools and block sets, and its transfers.")
	cf := addClientFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	s, err := cf.status()
	if err != nil {
		return err
	}
	if *cf.json {
		return printJSON(e.stdout, s)
	}
	alive := 0
	for _, m := range s.Members {
		if m.State == "alive" {
			alive++
		}
	}
	joined := "joined"
	if !s.Joined {
		joined = "NOT JOINED (see /healthz and the log)"
	}
	fmt.Fprintf(e.stdout, "node %s (%s), %s: %d members alive, %d index entries; %d imports (%d in flight), %s imported; %d leases held by peers\n\n",
		s.Node, s.Version, joined, alive, s.IndexEntries, s.Imports, s.ImportsInFlight, bytesString(s.ImportBytes), s.Leases)
	printLane(e.stdout, s)
	printIndex(e.stdout, s)
	printMembers(e.stdout, s.Members, time.Now())
	fmt.Fprintln(e.stdout)
	tw := table(e.stdout)
	fmt.Fprintln(tw, "POOL\tGPU\tSIZE\tCARVED\tBLOCK SETS\tRDMA")
	for _, p := range s.Pools {
		gpu, reg := "-", p.RdmaRegistration
		if p.Kind == "device" {
			gpu = strconv.Itoa(int(p.Device))
		}
		switch {
		case p.RdmaDevice == "":
			reg = "-"
		case reg == "":
			reg = p.RdmaDevice
		default:
			reg = p.RdmaDevice + " (" + reg + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", p.Kind, gpu, bytesString(p.SizeBytes), bytesString(p.CarvedBytes), p.BlockSets, reg)
	}
	tw.Flush()
	printTiers(e.stdout, s.Tiers)
	fmt.Fprintln(e.stdout)
	tw = table(e.stdout)
	fmt.Fprintln(tw, "BLOCK SET\tENGINE\tLAYOUT\tTP\tPAGE\tSLOTS\tFREE\tREGISTERED\tLEASED\tSESSIONS")
	now := time.Now()
	var orphans, orphanBlocks uint32
	for _, b := range s.BlockSets {
		users := strconv.FormatUint(uint64(b.Sessions), 10)
		if b.Sessions == 0 && b.IdleSinceUnixMs != 0 {
			users = "0 (idle " + now.Sub(time.UnixMilli(b.IdleSinceUnixMs)).Round(time.Second).String() + ")"
			if b.Orphaned {
				users = "0 (cached, engine gone " + now.Sub(time.UnixMilli(b.IdleSinceUnixMs)).Round(time.Second).String() + ")"
			}
		}
		if b.Adoptions > 0 {
			users += fmt.Sprintf(", taken up %dx", b.Adoptions)
		}
		if b.Orphaned {
			orphans++
			orphanBlocks += b.Registered
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", b.Id, b.Engine, b.LayoutDigest, b.TpSize, b.PageSize, b.Slots, b.Free, b.Registered, b.Leased, users)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if orphans > 0 {
		fmt.Fprintf(e.stdout, "%d block sets (%d blocks) cached after their engines: served to peers, taken up by the next engine of their layout, freed first when memory is needed\n", orphans, orphanBlocks)
	}
	fmt.Fprintln(e.stdout)
	return printSessions(e.stdout, s.Sessions, now)
}

// printSessions lists engine sessions; session 0 is the calls that named
// none.
func printSessions(w io.Writer, sessions []*fabricpb.Session, now time.Time) error {
	tw := table(w)
	fmt.Fprintln(tw, "SESSION\tENGINE\tPID\tUID\tOPEN FOR\tBLOCK SETS\tREFS\tSLOTS")
	for _, ss := range sessions {
		sets := make([]string, len(ss.BlockSets))
		for i, b := range ss.BlockSets {
			sets[i] = strconv.FormatUint(b, 10)
		}
		id, pid, uid, open := strconv.FormatUint(ss.Id, 10), "-", "-", now.Sub(time.UnixMilli(ss.OpenedUnixMs)).Round(time.Second).String()
		if ss.Id == 0 {
			id = "0 (no session)"
		}
		if ss.Pid != 0 {
			pid, uid = strconv.Itoa(int(ss.Pid)), strconv.FormatUint(uint64(ss.Uid), 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", id, ss.Engine, pid, uid, open, strings.Join(sets, ","), ss.Refs, ss.Slots)
	}
	return tw.Flush()
}

// hashFlags name blocks by sequence hash or by tokens to hash.
type hashFlags struct {
	hashes    *string
	blockSize *int
	salt      *string
	lora      *string
}

// addHashFlags adds the flags naming blocks. Commands that register as an
// engine hash token ids with the engine's page size; the others get
// --block-size.
func addHashFlags(fs *flag.FlagSet, engine bool) hashFlags {
	h := hashFlags{
		hashes: fs.String("hashes", "", "comma-separated sequence hashes (decimal), instead of token ids"),
		salt:   fs.String("salt", "", "hash namespace, as for kvfabric hash"),
		lora:   fs.String("lora", "", "LoRA adapter name, as for kvfabric hash"),
	}
	if !engine {
		h.blockSize = fs.Int("block-size", 16, "tokens per block, to hash token ids")
	}
	return h
}

// resolve returns the sequence hashes named by --hashes, or by the token
// ids in args (or on stdin when there are none).
func (h hashFlags) resolve(e *env, args []string, pageSize int) ([]uint64, error) {
	n, err := h.names(e, args, pageSize)
	return n.hashes, err
}

// blockNames are the blocks a command asks for: their sequence hashes,
// and the token ids they were hashed from when given as tokens.
type blockNames struct {
	hashes     []uint64
	tokens     []uint32 // nil when named by --hashes
	salt, lora string
}

// names is resolve that also keeps the token ids, so that an import can
// pass them through to the agent: it then also finds holders at another
// page size (one that divides the engine's), which hashes cannot name.
func (h hashFlags) names(e *env, args []string, pageSize int) (blockNames, error) {
	flag := "--page-size"
	if h.blockSize != nil {
		pageSize, flag = *h.blockSize, "--block-size"
	}
	if *h.hashes != "" {
		if len(args) > 0 {
			return blockNames{}, usagef("give --hashes or token ids, not both")
		}
		out, err := parseHashes(*h.hashes)
		return blockNames{hashes: out}, err
	}
	hasher, err := layout.NewHasher(pageSize, layout.HashOptions{Salt: *h.salt, LoRA: *h.lora})
	if err != nil {
		return blockNames{}, usagef("%s %d: must be 1..%d", flag, pageSize, layout.MaxBlockSize)
	}
	var tokens []uint32
	if len(args) > 0 {
		tokens, err = parseTokens(args)
	} else {
		tokens, err = readTokens(e.stdin)
	}
	if err != nil {
		return blockNames{}, err
	}
	var out []uint64
	for _, b := range hasher.Sequence(tokens) {
		out = append(out, b.Sequence)
	}
	if len(out) == 0 {
		return blockNames{}, usagef("no full block of %d tokens given", pageSize)
	}
	// Only the full pages: the agent ignores a trailing partial one too.
	return blockNames{hashes: out, tokens: tokens[:len(out)*pageSize], salt: *h.salt, lora: *h.lora}, nil
}

// parseHashes parses --hashes: decimal u64s, comma-separated (spaces
// around and between them too). An empty entry is refused, not dropped:
// "1,,2" named two blocks where three were meant.
func parseHashes(s string) ([]uint64, error) {
	var out []uint64
	for i, entry := range strings.Split(s, ",") {
		fields := strings.FieldsFunc(entry, splitToken)
		if len(fields) == 0 {
			return nil, usagef("--hashes: entry %d of %q is empty", i, s)
		}
		for _, f := range fields {
			v, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, usagef("--hashes: hash %d: %q is not a u64", len(out), f)
			}
			out = append(out, v)
		}
	}
	return out, nil
}

func runLookup(e *env, args []string) error {
	fs := newFlags(e, "lookup", "[--hashes H,H,...] [--block-size N] [TOKEN ...]",
		"Shows, per node, how many leading blocks of a sequence it holds, and its routing score (overlap minus load).")
	cf := addClientFlags(fs)
	hf := addHashFlags(fs, false)
	if err := parse(fs, args); err != nil {
		return err
	}
	hashes, err := hf.resolve(e, fs.Args(), 0)
	if err != nil {
		return err
	}
	c, ctx, cancel, err := cf.dialReadOnly()
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	resp, err := c.API().Lookup(ctx, &fabricpb.LookupRequest{Hashes: hashes})
	if err != nil {
		return agentCallErr(err)
	}
	if *cf.json {
		err = printJSON(e.stdout, resp)
	} else {
		fmt.Fprintf(e.stdout, "%d blocks asked\n", len(hashes))
		tw := table(e.stdout)
		fmt.Fprintln(tw, "NODE\tBLOCKS\tSCORE")
		for _, o := range resp.Overlaps {
			fmt.Fprintf(tw, "%s\t%d\t%.3f\n", o.Node, o.Blocks, o.Score)
		}
		err = tw.Flush()
	}
	if err != nil {
		return err
	}
	best := uint32(0)
	for _, o := range resp.Overlaps {
		best = max(best, o.Blocks)
	}
	if int(best) < len(hashes) {
		// Exit status 1: not every block is available from one node.
		return fmt.Errorf("no node holds all %d blocks (at most %d)", len(hashes), best)
	}
	return nil
}

// engineFlags describe the engine a command registers as.
type engineFlags struct {
	name                             *string
	layers, heads, headDim, tp, page *int
	dtype, order                     *string
	slots                            *int
}

func addEngineFlags(fs *flag.FlagSet, name string) engineFlags {
	return engineFlags{
		name:    fs.String("engine", name, "engine name the agent shows in status"),
		layers:  fs.Int("layers", 4, fmt.Sprintf("model layers, 1..%d", layout.MaxLayers)),
		heads:   fs.Int("kv-heads", 8, fmt.Sprintf("KV heads, 1..%d", layout.MaxKVHeads)),
		headDim: fs.Int("head-dim", 128, fmt.Sprintf("head dimension, 1..%d", layout.MaxHeadDim)),
		dtype:   fs.String("dtype", "bf16", "element type: f32, f16, bf16, fp8_e4m3, fp8_e5m2, u8"),
		tp:      fs.Int("tp", 1, fmt.Sprintf("tensor-parallel size, 1..%d", layout.MaxTPSize)),
		page:    fs.Int("page-size", 16, fmt.Sprintf("tokens per block, 1..%d", layout.MaxPageSize)),
		order:   fs.String("order", "HND", "KV order inside a chunk: HND or NHD"),
		slots:   fs.Int("slots", 0, fmt.Sprintf("slots of the block set, 0..%d (0: the agent's default)", layout.MaxSlots)),
	}
}

// checkRanges refuses an engine flag past the bounds of a layout
// (layout.MaxLayers and the rest), before anything is sent: the request's
// fields are unsigned 32-bit, and a value past them went wrapped (2^32+2
// slots as 2).
func (f engineFlags) checkRanges() error {
	for _, r := range []struct {
		flag     string
		v, least int
		most     int
	}{
		{"--layers", *f.layers, 1, layout.MaxLayers}, {"--kv-heads", *f.heads, 1, layout.MaxKVHeads},
		{"--head-dim", *f.headDim, 1, layout.MaxHeadDim}, {"--tp", *f.tp, 1, layout.MaxTPSize},
		{"--page-size", *f.page, 1, layout.MaxPageSize}, {"--slots", *f.slots, 0, layout.MaxSlots},
	} {
		if r.v < r.least || r.v > r.most {
			return usagef("%s %d: must be %d..%d", r.flag, r.v, r.least, r.most)
		}
	}
	return nil
}

func (f engineFlags) engine() (client.Engine, error) {
	if err := f.checkRanges(); err != nil {
		return client.Engine{}, err
	}
	dt, err := layout.ParseDType(*f.dtype)
	if err != nil {
		return client.Engine{}, usagef("--dtype: %v", err)
	}
	var order layout.KVOrder
	switch strings.ToUpper(*f.order) {
	case "HND":
		order = layout.HND
	case "NHD":
		order = layout.NHD
	default:
		return client.Engine{}, usagef("--order %q: want HND or NHD", *f.order)
	}
	return client.Engine{Name: *f.name, Model: layout.ModelConfig{Layers: *f.layers, KVHeads: *f.heads, HeadDim: *f.headDim, DType: dt},
		TPSize: *f.tp, PageSize: *f.page, Order: order, Slots: *f.slots}, nil
}

func runPut(e *env, args []string) error {
	fs := newFlags(e, "put", "[engine flags] (--generate N [--seed S] | [TOKEN ...])", `
Stores test blocks on the local agent: registers as an engine, writes each
block with a pattern that encodes (block, layer, K/V, token, head, dim), so
that an importer anywhere can check every byte (kvfabric get --verify), and
registers the blocks. Token ids come from the arguments or standard input,
or --generate makes N blocks of random tokens. Prints the sequence hashes.
The blocks stay cached after it exits for as long as an engine session
uses the block set, and after that until the agent needs the memory for
another block set (with --no-orphan-cache, for its --block-set-grace).`)
	cf := addClientFlags(fs)
	ef := addEngineFlags(fs, "kvfabric-put")
	generate := fs.Int("generate", 0, "generate N blocks of random tokens instead of reading token ids, 1..1048576, and at most 16777216 tokens (N x --page-size)")
	seed := fs.Uint64("seed", 1, "seed of the generated tokens")
	if err := parse(fs, args); err != nil {
		return err
	}
	eng, err := ef.engine()
	if err != nil {
		return err
	}
	// Given as 0, --generate is refused, not taken as left out: put read
	// token ids from standard input instead.
	generating := false
	fs.Visit(func(f *flag.Flag) { generating = generating || f.Name == "generate" })
	// The page size was checked with the engine flags (checkRanges),
	// before --generate makes that many tokens a block.
	hasher, err := layout.NewHasher(eng.PageSize, layout.HashOptions{})
	if err != nil {
		return err
	}
	var tokens []uint32
	switch {
	case *generate < 0 || *generate > maxGenerate || generating && *generate == 0:
		return usagef("--generate %d: want 1..%d", *generate, maxGenerate)
	case *generate > maxGenerateTokens/eng.PageSize:
		return usagef("--generate %d: at most %d blocks of --page-size %d tokens (%d tokens in all)",
			*generate, maxGenerateTokens/eng.PageSize, eng.PageSize, maxGenerateTokens)
	case *generate > 0:
		if fs.NArg() > 0 {
			return usagef("give --generate or token ids, not both")
		}
		rng := rand.New(rand.NewPCG(*seed, 0))
		tokens = make([]uint32, *generate*eng.PageSize)
		for i := range tokens {
			tokens[i] = rng.Uint32N(128000)
		}
	case fs.NArg() > 0:
		tokens, err = parseTokens(fs.Args())
	default:
		tokens, err = readTokens(e.stdin)
	}
	if err != nil {
		return err
	}
	blocks := hasher.Sequence(tokens)
	if len(blocks) == 0 {
		return usagef("no full block of %d tokens given", eng.PageSize)
	}
	c, ctx, cancel, err := cf.dial()
	if err != nil {
		return err
	}
	defer cancel()
	defer c.Close()
	set, err := c.Register(ctx, eng)
	if err != nil {
		return err
	}
	overflow := len(blocks) > set.Retains
	if overflow {
		// The pool recycles leaves first, least recently used first: as
		// each batch is allocated, the end of what is stored so far goes,
		// and once a batch's parent is gone, older runs go from their end
		// back to the first block of the sequence. Where the node has
		// tiers, they take copies of the blocks recycled first, as far as
		// they take blocks of the set's size, the copies keep up and the
		// tiers have room (a tier full or smaller than the overflow drops
		// its oldest copies, the start of the sequence), and a look-up
		// restores those up to the first one dropped. The agent's status
		// only words the warning: without it, the warning is the one
		// without tiers, and the blocks are stored.
		st, err := e.statusOf(ctx, c)
		tiers := err == nil && len(st.GetTiers()) > 0
		fmt.Fprintf(e.stderr, "kvfabric put: warning: %d blocks into a block set that keeps %d before recycling: "+
			"storing the later blocks recycles %d or more earlier ones out of the set, the blocks stored just before each batch of %d and then the "+
			"start of the sequence, ", len(blocks), set.Retains, len(blocks)-set.Retains, putBatch)
		if !tiers {
			fmt.Fprintf(e.stderr, "so a look-up from its first block finds fewer than %d, possibly none", set.Retains)
		} else {
			fmt.Fprintf(e.stderr, "each copied down to this node's tiers first where the tiers take blocks of its size, keep up and have room, "+
				"so a look-up from its first block finds them there up to the first one dropped, possibly none")
		}
		fmt.Fprintf(e.stderr, " (give --slots %d or more to keep them all in the set)\n", minSlotsToRetain(len(blocks), set))
	}
	var hashes []uint64
	const batch = putBatch
	for i := 0; i < len(blocks); i += batch {
		n := min(batch, len(blocks)-i)
		slots, err := c.Allocate(ctx, set.ID, n)
		if err != nil {
			return fmt.Errorf("blocks %d..%d: %w", i, i+n-1, err)
		}
		hs := make([]uint64, n)
		for j := range n {
			hs[j] = blocks[i+j].Sequence
			kvtest.Fill(set.Layout, set.Ranks, int(slots[j]), hs[j])
		}
		req := &fabricpb.RegisterBlocksRequest{BlockSet: set.ID, Slots: slots, Hashes: hs}
		if i > 0 {
			req.Parent, req.ParentSet = blocks[i-1].Sequence, true
		}
		resp, err := c.API().RegisterBlocks(ctx, req)
		if err != nil {
			return fmt.Errorf("blocks %d..%d: %w", i, i+n-1, err)
		}
		// The blocks stay registered after this command exits: drop our
		// references so that the pool may recycle them when it must.
		rel := make([]uint32, len(resp.Blocks))
		for j, b := range resp.Blocks {
			rel[j] = b.Slot
		}
		if err := c.Release(ctx, set.ID, rel); err != nil {
			return err
		}
		hashes = append(hashes, hs...)
		if len(blocks) > batch {
			fmt.Fprintf(e.stderr, "\rstored %d/%d blocks", len(hashes), len(blocks))
		}
	}
	if len(blocks) > batch {
		fmt.Fprintln(e.stderr)
	}
	if overflow {
		// Say what the recycling left: the run a look-up finds.
		held, err := heldInSet(ctx, c, set.ID, hashes)
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stderr, "kvfabric put: a look-up from the first block finds %d of the %d blocks here; the rest were recycled or follow a recycled one\n",
			held, len(hashes))
	}
	strs := make([]string, len(hashes))
	for i, h := range hashes {
		strs[i] = strconv.FormatUint(h, 10)
	}
	if *cf.json {
		// 64-bit integers as strings, as protobuf JSON writes them.
		return json.NewEncoder(e.stdout).Encode(map[string]any{"block_set": strconv.FormatUint(set.ID, 10), "hashes": strs})
	}
	fmt.Fprintln(e.stdout, strings.Join(strs, ","))
	return nil
}

// maxGenerate bounds put --generate.
const maxGenerate = 1 << 20

// maxGenerateTokens bounds the tokens put --generate makes, 64 MiB of
// them: maxGenerate blocks of the default page size, 16 tokens. A larger
// page size makes fewer blocks (256 of 65,536 tokens), not 256 GiB of
// tokens.
const maxGenerateTokens = 1 << 24

// putBatch is how many blocks put allocates and registers at a time.
const putBatch = 64

// heldInSet returns how many of hashes, from the first, block set set
// holds on this node, in its pool or a tier below it: the leading run a
// look-up finds here. It asks the agent with look-ups that name the set,
// whose answer for each hash (LocalTiers) is read from the set and the
// tiers, and so counts every block registered before it that the set or a
// tier holds. The index's answer for this node (Overlaps) may not: the
// agent applies its own registrations to the index from the pool's
// events, after the registering call has returned, and an owned index
// answers from a cache of its owners' answers. The look-ups ask for no
// restore (no_restore): blocks found in a tier are counted where they
// are, none is brought up into the set or read ahead, so the count leaves
// the set and the tiers as the put left them, and a block recycled by the
// put whose copy down to a tier is still under way is waited for and
// counted where the copy puts it (else a count read right after a put
// past its set would miss the blocks just recycled, its first ones). ctx
// bounds the wait (put's --timeout, the whole command's): the agent ends
// it a tenth of the time left before ctx's deadline and answers, a block
// still in flight then not counted.
func heldInSet(ctx context.Context, c *client.Client, set uint64, hashes []uint64) (int, error) {
	held := 0
	for held < len(hashes) {
		chunk := hashes[held:min(held+fabric.MaxRequestBlocks, len(hashes))]
		resp, err := c.API().Lookup(ctx, &fabricpb.LookupRequest{Hashes: chunk, BlockSet: set, NoRestore: true})
		if err != nil {
			return 0, err
		}
		tiers := resp.GetLocalTiers()
		if len(tiers) != len(chunk) {
			return 0, fmt.Errorf("look-up of %d blocks: the agent says where %d are held", len(chunk), len(tiers))
		}
		for _, where := range tiers {
			if where == "" {
				return held, nil
			}
			held++
		}
	}
	return held, nil
}

// imported is an import made by a command, with what it needs to use the
// blocks and to release them.
type imported struct {
	c      *client.Client
	ctx    context.Context
	set    *client.BlockSet
	resp   *fabricpb.ImportResponse
	cancel context.CancelFunc
}

func (im *imported) close() {
	im.c.Close()
	im.cancel()
}

// releaseAll drops the references the import took.
func (im *imported) releaseAll() error {
	slots := make([]uint32, len(im.resp.Blocks))
	for i, b := range im.resp.Blocks {
		slots[i] = b.Slot
	}
	if len(slots) == 0 {
		return nil
	}
	return im.c.Release(im.ctx, im.set.ID, slots)
}

// importBlocks registers as engine eng and imports the blocks named, by
// their token ids when it has them (so that holders at another page size
// serve them too) and by hashes otherwise, with a progress line on stderr
// when e asks for one.
func importBlocks(e *env, cf clientFlags, eng client.Engine, names blockNames) (*imported, error) {
	hashes := names.hashes
	c, ctx, cancel, err := cf.dial()
	if err != nil {
		return nil, err
	}
	im := &imported{c: c, ctx: ctx, cancel: cancel}
	if im.set, err = c.Register(ctx, eng); err == nil {
		stop := startProgress(e, c, ctx, im.set, len(hashes))
		if names.tokens != nil {
			im.resp, err = c.ImportTokens(ctx, im.set.ID, names.tokens, names.salt, names.lora)
		} else {
			im.resp, err = c.Import(ctx, im.set.ID, hashes)
		}
		stop(len(im.resp.GetBlocks()))
	}
	if err != nil {
		im.close()
		return nil, err
	}
	return im, nil
}

// startProgress shows, once an import has run for e.progressAfter and
// while it runs, a line on stderr with the bytes the agent has imported
// since it began (of those the blocks need) and the time; stop ends it
// with the blocks brought. Nothing shows unless e.progress.
func startProgress(e *env, c *client.Client, ctx context.Context, set *client.BlockSet, blocks int) (stop func(brought int)) {
	if !e.progress {
		return func(int) {}
	}
	start := time.Now()
	st := set.Layout.Strides()
	want := uint64(blocks) * st.Shard * uint64(set.Layout.TPSize)
	base := uint64(0)
	if s, err := c.Status(ctx); err == nil {
		base = s.ImportBytes
	}
	done := make(chan struct{})
	exited := make(chan struct{})
	shown := false
	go func() {
		defer close(exited)
		t := time.NewTimer(e.progressAfter)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if s, err := c.Status(ctx); err == nil {
				fmt.Fprintf(e.stderr, "\rimporting %d blocks: %s of %s, %v ", blocks, bytesString(s.ImportBytes-base), bytesString(want),
					time.Since(start).Round(time.Second))
				shown = true
			}
			t.Reset(500 * time.Millisecond)
		}
	}()
	return func(brought int) {
		close(done)
		<-exited
		if shown || time.Since(start) >= e.progressAfter {
			fmt.Fprintf(e.stderr, "\rimported %d of %d blocks in %v\033[K\n", brought, blocks, time.Since(start).Round(time.Millisecond))
		}
	}
}

func printFetches(w io.Writer, resp *fabricpb.ImportResponse, asked int) {
	fmt.Fprintf(w, "%d of %d blocks here\n", len(resp.Blocks), asked)
	if resp.Error != "" {
		fmt.Fprintf(w, "missing: %s\n", resp.Error)
	}
	if len(resp.Fetches) == 0 {
		return
	}
	tw := table(w)
	fmt.Fprintln(tw, "FROM\tTRANSPORT\tBLOCKS\tBYTES\tTIME\tGB/s")
	fs := append([]*fabricpb.Fetch(nil), resp.Fetches...)
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].Node < fs[j].Node })
	for _, f := range fs {
		d := time.Duration(f.Micros) * time.Microsecond
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%v\t%.2f\n", f.Node, f.Transport, f.Blocks, bytesString(f.Bytes), d.Round(time.Microsecond),
			float64(f.Bytes)/max(float64(d.Nanoseconds()), 1))
	}
	tw.Flush()
}

func runImport(e *env, args []string) error {
	fs := newFlags(e, "import", "[engine flags] (--hashes H,H,... | TOKEN ...)",
		`Imports blocks from the cluster into the local agent's pool and shows what came from where, over which transport, how fast.
Token ids go to the agent as they are, so holders that stored them at a page
size dividing --page-size serve them too; --hashes names blocks at --page-size only.`)
	cf := addClientFlags(fs)
	ef := addEngineFlags(fs, "kvfabric-import")
	hf := addHashFlags(fs, true)
	if err := parse(fs, args); err != nil {
		return err
	}
	eng, err := ef.engine()
	if err != nil {
		return err
	}
	names, err := hf.names(e, fs.Args(), eng.PageSize)
	if err != nil {
		return err
	}
	hashes := names.hashes
	im, err := importBlocks(e, cf, eng, names)
	if err != nil {
		return err
	}
	defer im.close()
	if err := im.releaseAll(); err != nil {
		return err
	}
	if *cf.json {
		err = printJSON(e.stdout, im.resp)
	} else {
		printFetches(e.stdout, im.resp, len(hashes))
	}
	if err == nil && len(im.resp.Blocks) < len(hashes) {
		// Exit status 1: some blocks are not available.
		err = fmt.Errorf("%d of %d blocks imported: %s", len(im.resp.Blocks), len(hashes), im.resp.Error)
	}
	return err
}

func runGet(e *env, args []string) error {
	fs := newFlags(e, "get", "[engine flags] --out FILE (--hashes H,H,... | TOKEN ...)", `
Imports blocks into the local agent and writes their bytes to FILE: for each
block in order, each TP rank's shard in rank order, in the layout the engine
flags describe. --verify checks every element against the pattern kvfabric
put writes (blocks put at the same page size). Token ids go to the agent as
they are, so holders at a page size dividing --page-size serve them too.`)
	cf := addClientFlags(fs)
	ef := addEngineFlags(fs, "kvfabric-get")
	hf := addHashFlags(fs, true)
	out := fs.String("out", "", "file to write the blocks' bytes to (- for standard output)")
	verify := fs.Bool("verify", false, "check every element against kvfabric put's pattern")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return usagef("--out is required")
	}
	eng, err := ef.engine()
	if err != nil {
		return err
	}
	names, err := hf.names(e, fs.Args(), eng.PageSize)
	if err != nil {
		return err
	}
	hashes := names.hashes
	im, err := importBlocks(e, cf, eng, names)
	if err != nil {
		return err
	}
	defer im.close()
	defer im.releaseAll()
	if len(im.resp.Blocks) < len(hashes) {
		return fmt.Errorf("%d of %d blocks imported: %s", len(im.resp.Blocks), len(hashes), im.resp.Error)
	}
	if *out == "-" {
		return writeBlocks(e.stdout, im, hashes, *verify)
	}
	f, err := os.OpenFile(*out, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	err = writeBlocks(f, im, hashes, *verify)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	printFetches(e.stderr, im.resp, len(hashes))
	if *verify {
		fmt.Fprintf(e.stderr, "verified %d blocks element by element\n", len(im.resp.Blocks))
	}
	return nil
}

// writeBlocks writes each block's shards in rank order (engine flags make
// fully contiguous layouts), checking them first with verify.
func writeBlocks(w io.Writer, im *imported, hashes []uint64, verify bool) error {
	for i, b := range im.resp.Blocks {
		if verify {
			if err := kvtest.Check(im.set.Layout, im.set.Ranks, int(b.Slot), hashes[i]); err != nil {
				return fmt.Errorf("block %d (hash %d): %w", i, hashes[i], err)
			}
		}
		for r := range im.set.Layout.TPSize {
			if _, err := w.Write(im.set.Block(r, int(b.Slot))); err != nil {
				return err
			}
		}
	}
	return nil
}

// minSlotsToRetain is the smallest block set, at set's watermark, that
// keeps n registered blocks before recycling.
func minSlotsToRetain(n int, set *client.BlockSet) int {
	slots := set.Layout.Slots
	if slots == 0 {
		return n
	}
	// The low watermark is a fraction no larger than this (the set's
	// spare slots were rounded up from it), so a size that keeps n under
	// it keeps n under the real one.
	frac := float64(slots-set.Retains) / float64(slots)
	if frac >= 1 {
		return n // a set that keeps nothing: no size helps
	}
	s := n
	for s-int(math.Ceil(frac*float64(s))) < n {
		s++
	}
	return s
}

// printLane says what TCP lane the node serves and why reads that could
// have used lanes went over QUIC.
func printLane(w io.Writer, s *fabricpb.StatusResponse) {
	if s.Lane == "" {
		return
	}
	line := "lane: " + s.Lane
	var reasons []string
	for r, k := range s.LaneFallbacks {
		if k > 0 {
			reasons = append(reasons, fmt.Sprintf("%s %d", r, k))
		}
	}
	if len(reasons) > 0 {
		sort.Strings(reasons)
		line += "; reads over QUIC instead of a lane: " + strings.Join(reasons, ", ")
	}
	fmt.Fprintf(w, "%s\n\n", line)
}
