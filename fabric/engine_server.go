package fabric

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/internal/buildinfo"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
)

// Limits on engine requests, so that one bad request cannot make the agent
// allocate without bound. MaxRequestBlocks is the most hashes, slots or
// blocks one request may name.
const (
	MaxRequestBlocks = 1 << 16
	maxRequestTokens = 1 << 22
)

// DefaultAlignment is the alignment of a block set whose engine asks for
// none (RegisterRequest.alignment 0): strides rounded to 4 KiB pages.
const DefaultAlignment = 4096

// engineSet is a block set made for engines, with the sessions that use
// it and what each holds there, so that an engine can release only what it
// holds and a session that ends gives back what it held.
type engineSet struct {
	set    *pool.BlockSet
	engine string

	mu    sync.Mutex
	users map[uint64]*setUse // by session id
	// idleSince is when the last session stopped using the set (zero while
	// one does); freeTimer frees it after the grace period.
	idleSince time.Time
	freeTimer *time.Timer
	timerGen  uint64 // which freeTimer is the live one
	freed     bool

	// Isolation (engine_memory.go). mem is each rank's section, nil when
	// sets are not isolated; set once, before the set is shared.
	// receivers are the processes its memory was handed to (pid to pidfd,
	// -1 for none); zeroFresh: one of them exited and another process
	// took the set up, so allocated slots are zeroed.
	mem       []*setMemory
	receivers map[int32]int
	zeroFresh bool
	// renewMem gives mem new tokens and file names as the set passes to
	// a process other than those it was handed to (mayJoin), so that
	// whoever learned the old ones cannot map the new owner's memory;
	// renewOwed says a renewal failed and is owed before the set passes
	// on. nil where sets have no memory of their own. Called with mu
	// held.
	renewMem  func() error
	renewOwed bool

	// sums: blocks registered here get content checksums (checksum.go).
	sums bool
	// joinToken lets another process of the engine join the set
	// (engine_join.go); set when it is made, and anew as it passes to
	// another engine (mayJoin). Guarded by mu.
	joinToken string

	// orphaned: kept after its grace period as a cache of an engine that
	// is gone; adoptions: the times a session took it up since
	// (engine_orphans.go). Guarded by mu.
	orphaned  bool
	adoptions uint32
	// claim is non-nil while a Register frees the set, idle, to make its
	// engine's new set (swapFallback), and closed when it is done: no
	// session takes the set up meanwhile (attach). Guarded by mu.
	claim chan struct{}

	// ahead is the set's read-ahead from the tiers (tier_readahead.go).
	ahead setAhead

	// staging: the tiers' own set, disk-held blocks staged into it for
	// peers (tier_serve.go); set once, before it is shared. No engine is
	// handed it, and it takes up no engine's set.
	staging bool
}

// engineServer implements the engine API over the agent.
type engineServer struct {
	fabricpb.UnimplementedEngineServer
	a *Agent
}

func (e *engineServer) Register(ctx context.Context, req *fabricpb.RegisterRequest) (*fabricpb.RegisterResponse, error) {
	if err := checkRegisterStrings(req); err != nil {
		return nil, err
	}
	m, err := layout.ModelConfigFromProto(req.GetModel())
	if err != nil {
		return nil, toStatus(err)
	}
	align := req.GetAlignment()
	if align == 0 {
		align = DefaultAlignment
	}
	arr := layout.ArrangementFromProto(req.GetArrangement())
	if req.GetArrangement() == 0 {
		arr = layout.FullyContiguous
	}
	tmpl := &layout.Layout{
		Model:       m,
		PageSize:    int(req.GetPageSize()),
		TPSize:      int(req.GetTpSize()),
		Order:       layout.KVOrderFromProto(req.GetKvOrder()),
		Arrangement: arr,
		Alignment:   align,
		Slots:       int(req.GetSlots()),
	}
	sess, err := e.a.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	place, err := e.a.placement(req.GetDevices(), tmpl.TPSize)
	if err != nil {
		return nil, toStatus(err)
	}
	var set *sessionSet
	if req.GetJoinToken() != "" && req.GetJoinBlockSet() == 0 {
		return nil, status.Error(codes.InvalidArgument, "join_token given without join_block_set: a set is joined by its id and its token")
	}
	if id := req.GetJoinBlockSet(); id != 0 {
		set, err = e.a.joinSet(sess, req.GetEngine(), id, req.GetJoinToken(), tmpl, place, callerPID(ctx))
	} else {
		set, err = e.a.blockSetForSession(sess, req.GetEngine(), tmpl, place, callerPID(ctx))
	}
	if err != nil {
		return nil, toStatus(err)
	}
	// The caller's process was recorded as the set's receiver as it was
	// chosen (handOver), before another Register could look at it.
	return e.a.describe(set.engineSet)
}

// setFor returns block set id as the calling session sees it, making it
// one of the sets the session uses. Only a set the calling process may
// join is (joinableSet), asked again once this call has attached it, the
// process then recorded as a receiver of the set where it was none
// (joinByCall): a Register of another process may take the set up
// between the two (mayJoin, which does not see this session), and where
// its record (attachJoining) came before this attach the set is handed to a process
// still running, not to this one. The attach is then undone and the call
// refused; a call whose session had the set already attached nothing,
// and is asked again all the same: the session may be the implicit one,
// which another process's sessionless call attached the set to, that
// process recorded. Once recorded, the process keeps other processes'
// Registers off the set while it runs (their mayJoin), as a Register's
// process does. A Register that chose the set before this call took it up
// is checked again as it records its process (handOver's attachJoining,
// in the hold of the set's lock that attaches it): it chooses again, so that the two
// processes are never both on the set. The callers check the request's
// other fields after this: a call refused for them (INVALID_ARGUMENT) has
// still taken the set up, its process recorded, as it would have been
// had the call gone on (the fields are each call's own, checked in its
// handler once it has the set).
func (e *engineServer) setFor(ctx context.Context, id uint64) (*sessionSet, error) {
	sess, err := e.a.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	es, err := e.a.joinableSet(ctx, id)
	if err != nil {
		return nil, err
	}
	if f := e.a.cfg.hooks.beforeAttach; f != nil {
		f(es)
	}
	ss, err := e.a.attachUnclaimed(ctx, sess, es)
	if err != nil {
		return nil, err
	}
	// Asked even where the session had the set (nothing attached): it
	// may be the implicit session, which any process's sessionless call
	// uses, the set taken up by another process's.
	if pid := callerPID(ctx); !es.joinByCall(pid) {
		if !ss.attached {
			return nil, notHandedError(id, pid)
		}
		sess.mu.Lock()
		delete(sess.sets, es.set.ID())
		sess.mu.Unlock()
		e.a.detach(sess, es)
		return nil, notHandedError(id, pid)
	}
	return ss, nil
}

// joinableSet returns block set id where the process at the other end of
// ctx's call may use it (engineSet.mayCall): its memory was handed to that
// process, or to none still running. A call naming another running
// process's set by its id, a set it was never handed, is refused
// (PERMISSION_DENIED): a session there gets no memory, but its slots and
// registrations would be the set's all the same, blocks registered under
// hashes their bytes are not, and slots and references the set's engine
// counts on taken.
func (a *Agent) joinableSet(ctx context.Context, id uint64) (*engineSet, error) {
	es, err := a.enginesSet(id)
	if err != nil {
		return nil, err
	}
	if pid := callerPID(ctx); !es.mayCall(pid) {
		return nil, notHandedError(id, pid)
	}
	return es, nil
}

// notHandedError refuses a call of process pid naming block set id, handed
// to another process that is still running.
func notHandedError(id uint64, pid int32) error {
	return status.Errorf(codes.PermissionDenied,
		"block set %d: handed to another process that is still running, not to process %d; a process uses the block sets its own Register returned", id, pid)
}

func (e *engineServer) Allocate(ctx context.Context, req *fabricpb.AllocateRequest) (*fabricpb.AllocateResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	n := int(req.GetCount())
	if n == 0 || n > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "count: %d is not in 1..%d", n, MaxRequestBlocks)
	}
	blocks, err := e.a.allocate(ctx, s.engineSet, n)
	if err != nil {
		return nil, toStatus(err)
	}
	s.mu.Lock()
	zero := s.zeroFresh
	s.mu.Unlock()
	if zero {
		zeroSlots(s.set, blocks)
	}
	// All held, or all given back: the session ended (a stall past its
	// keepalive) while the slots were taken, and the engine gets none.
	if !s.holdAll(blocks) {
		return nil, s.gone()
	}
	if err := s.callerGone(ctx, blocks, (*pool.BlockSet).Abort); err != nil {
		return nil, err
	}
	out := &fabricpb.AllocateResponse{Slots: make([]uint32, len(blocks))}
	for i, b := range blocks {
		out.Slots[i] = uint32(b.Slot)
	}
	return out, nil
}

func (e *engineServer) Free(ctx context.Context, req *fabricpb.FreeRequest) (*fabricpb.FreeResponse, error) {
	return &fabricpb.FreeResponse{}, e.giveBack(ctx, req.GetBlockSet(), req.GetSlots(), (*pool.BlockSet).Abort)
}

func (e *engineServer) RegisterBlocks(ctx context.Context, req *fabricpb.RegisterBlocksRequest) (*fabricpb.RegisterBlocksResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	slots := req.GetSlots()
	if len(slots) == 0 || len(slots) > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "slots: %d slots (want 1..%d)", len(slots), MaxRequestBlocks)
	}
	hashes, err := requestHashes(req.GetHashes(), req.GetTokens(), s.set.Layout().PageSize, len(slots))
	if err != nil {
		return nil, err
	}
	parent := uint64(0)
	if req.GetParentSet() {
		parent = req.GetParent()
	}
	out := &fabricpb.RegisterBlocksResponse{Results: make([]*fabricpb.BlockResult, len(slots))}
	var first error
	refuse := func(i int, err error) {
		st := toStatus(fmt.Errorf("slot %d: %w", slots[i], err))
		res := out.Results[i]
		res.Outcome, res.Reason, res.Code = fabricpb.Outcome_OUTCOME_REFUSED, status.Convert(st).Message(), uint32(status.Code(st))
		if first == nil {
			first = st
		}
	}
	// The slots go to the pool in runs of at most pool.MaxRegisterBatch
	// (one hold of the set's lock and one batch of events each), cut
	// where a slot is refused. A block extends the one before it in the
	// request whether or not that one was refused: its hash says so.
	parentOf := func(i int) uint64 {
		if i == 0 {
			return parent
		}
		return hashes[i-1]
	}
	regs := make([]pool.Registration, 0, min(len(slots), pool.MaxRegisterBatch))
	idx := make([]int, 0, cap(regs)) // the request's index of regs[j]
	var dups []taken                 // copies registered before, kept
	flush := func() {
		run, at := regs, idx
		for len(run) > 0 {
			got, err := s.set.RegisterBatch(run, parentOf(at[0]))
			s.holdAll(got)
			for j, reg := range got {
				i := at[j]
				res := out.Results[i]
				res.Slot, res.Outcome = uint32(reg.Slot), fabricpb.Outcome_OUTCOME_REGISTERED
				if reg.Slot != int(slots[i]) {
					res.Outcome = fabricpb.Outcome_OUTCOME_DUPLICATE
					dups = append(dups, taken{hashes[i], reg})
				}
			}
			if err == nil {
				break
			}
			// run[len(got)] was refused, and stays the session's; the
			// pool's error, without the batch's position, names why.
			k := len(got)
			s.hold(run[k].Block)
			if cause := errors.Unwrap(err); cause != nil {
				err = cause
			}
			refuse(at[k], err)
			run, at = run[k+1:], at[k+1:]
		}
		regs, idx = regs[:0], idx[:0]
	}
	for i, slot := range slots {
		out.Results[i] = &fabricpb.BlockResult{Hash: hashes[i], RequestSlot: slot}
		b, err := s.drop(int(slot))
		if err != nil {
			flush()
			refuse(i, err)
			continue
		}
		// Taken once the engine says the block is written: a write after
		// this is caught by the first import of it.
		sum, has := s.takeSum(int(slot))
		if has && replicasDiffer(s.set, int(slot)) {
			// Its ranks' copies of a KV head differ: no one content to
			// serve. The slot stays the engine's, as any refused one.
			flush()
			refuse(i, fmt.Errorf("%w (each rank writes the heads it holds alike)", layout.ErrReplicasDiffer))
			s.hold(b)
			continue
		}
		regs = append(regs, pool.Registration{Block: b, Hash: hashes[i], Sum: sum, HasSum: has})
		idx = append(idx, i)
		if len(regs) == pool.MaxRegisterBatch {
			flush()
		}
	}
	flush()
	// Where the session ended during the call, what it registered was
	// given back (by detach, or by holdAll after it), and so were the
	// slots refused: no result may name them as the engine's.
	if err := s.gone(); err != nil {
		return nil, err
	}
	// A copy kept may be one a read-ahead brought up: the engine holds it
	// now (the session lives: its holds stand), so it is taken, as by
	// Acquire, and no longer ahead of use.
	for _, d := range dups {
		e.a.aheadUsed(s.engineSet, d.hash, d.b)
	}
	for i, res := range out.Results {
		if res.Outcome == fabricpb.Outcome_OUTCOME_REGISTERED || res.Outcome == fabricpb.Outcome_OUTCOME_DUPLICATE {
			out.Blocks = append(out.Blocks, &fabricpb.BlockRef{Hash: hashes[i], Slot: res.Slot, Duplicate: res.Outcome == fabricpb.Outcome_OUTCOME_DUPLICATE})
		}
	}
	if len(out.Blocks) == 0 {
		// Nothing done: a call error, with the first refusal's code.
		return nil, first
	}
	return out, nil
}

func (e *engineServer) Acquire(ctx context.Context, req *fabricpb.AcquireRequest) (*fabricpb.AcquireResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	if n := len(req.GetHashes()); n > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "hashes: %d (at most %d)", n, MaxRequestBlocks)
	}
	out := &fabricpb.AcquireResponse{Results: make([]*fabricpb.BlockResult, len(req.GetHashes()))}
	missing := false
	var restored []pool.Block // from a disk tier, referenced for the session
	var here []taken          // found in the set, held for the session
	var held []pool.Block     // every block held for the session
	// lastRestored: the last block taken came from a tier, restored now;
	// lastHere: it was found in the set (read ahead from a tier, perhaps).
	// Where it came from a tier, what follows it there is read ahead next.
	lastRestored, lastHere := false, false
	for i, h := range req.GetHashes() {
		res := &fabricpb.BlockResult{Hash: h}
		out.Results[i] = res
		if missing {
			res.Outcome, res.Reason = fabricpb.Outcome_OUTCOME_SKIPPED, "an earlier block is missing"
			continue
		}
		var b pool.Block
		ok, found := false, false
		if len(restored) == 0 {
			if b, ok = s.set.Acquire(h); !ok {
				restored = e.a.restoreRun(ctx, s, req.GetHashes(), i)
			}
			found = ok
		}
		if !ok && len(restored) > 0 {
			b, ok, restored = restored[0], true, restored[1:]
		}
		lastRestored, lastHere = ok && !found, found
		if !ok {
			missing = true
			res.Outcome, res.Reason, res.Code = fabricpb.Outcome_OUTCOME_MISSING, "not held in this block set", uint32(codes.NotFound)
			continue
		}
		if !s.hold(b) {
			// The session ended: b is given back, and so are the
			// blocks restored for it and not taken yet.
			s.holdAll(restored)
			return nil, s.gone()
		}
		held = append(held, b)
		if found {
			here = append(here, taken{h, b})
		}
		res.Slot, res.Outcome = uint32(b.Slot), fabricpb.Outcome_OUTCOME_ACQUIRED
		out.Blocks = append(out.Blocks, &fabricpb.BlockRef{Hash: h, Slot: uint32(b.Slot)})
	}
	// Ended after a hold: detach gave back what was held.
	if err := s.gone(); err != nil {
		return nil, err
	}
	if err := s.callerGone(ctx, held, (*pool.BlockSet).Release); err != nil {
		return nil, err
	}
	// The engine holds them now: the blocks found that a read-ahead
	// brought up are taken (counted, no longer ahead of use).
	ahead := lastRestored
	for i, t := range here {
		used := e.a.aheadUsed(s.engineSet, t.hash, t.b)
		if i == len(here)-1 && lastHere {
			ahead = used
		}
	}
	if n := len(out.Blocks); ahead && n > 0 {
		e.a.readAheadAfter(s.engineSet, out.Blocks[n-1].GetHash())
	}
	return out, nil
}

// taken is a block an engine's call took from its set under hash.
type taken struct {
	hash uint64
	b    pool.Block
}

func (e *engineServer) Release(ctx context.Context, req *fabricpb.ReleaseRequest) (*fabricpb.ReleaseResponse, error) {
	return &fabricpb.ReleaseResponse{}, e.giveBack(ctx, req.GetBlockSet(), req.GetSlots(), (*pool.BlockSet).Release)
}

// giveBack returns the engine's references on slots to the pool with op
// (Abort for slots never registered, Release for blocks), slot by slot; a
// slot the pool refuses keeps its reference, and the error names it.
func (e *engineServer) giveBack(ctx context.Context, set uint64, slots []uint32, op func(*pool.BlockSet, pool.Block) error) error {
	s, err := e.setFor(ctx, set)
	if err != nil {
		return err
	}
	if len(slots) > MaxRequestBlocks {
		return status.Errorf(codes.InvalidArgument, "slots: %d (at most %d)", len(slots), MaxRequestBlocks)
	}
	for _, slot := range slots {
		b, err := s.drop(int(slot))
		if err != nil {
			return err
		}
		if err := op(s.set, b); err != nil {
			s.hold(b)
			return toStatus(fmt.Errorf("slot %d: %w", slot, err))
		}
	}
	return nil
}

// requestHashes returns the n sequence hashes a request names, given as
// hashes or as token ids to hash with the block set's page size; token ids
// may make at most MaxRequestBlocks blocks (hashes are the caller's to
// bound).
func requestHashes(hashes []uint64, tokens *fabricpb.Tokens, pageSize, n int) ([]uint64, error) {
	if err := checkTokenStrings(tokens); err != nil {
		return nil, err
	}
	if len(hashes) > 0 && tokens != nil {
		return nil, status.Error(codes.InvalidArgument, "hashes and tokens: give one, not both")
	}
	if tokens == nil {
		if n >= 0 && len(hashes) != n {
			return nil, status.Errorf(codes.InvalidArgument, "hashes: %d hashes for %d slots", len(hashes), n)
		}
		return hashes, nil
	}
	if len(tokens.GetIds()) > maxRequestTokens {
		return nil, status.Errorf(codes.InvalidArgument, "tokens: %d ids (at most %d)", len(tokens.GetIds()), maxRequestTokens)
	}
	h, err := layout.NewHasher(pageSize, layout.HashOptions{Salt: tokens.GetSalt(), LoRA: tokens.GetLora()})
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "block size: %v", err)
	}
	// Counted before they are hashed: at a small block size the ids make
	// many more blocks than a request may name.
	if full := len(tokens.GetIds()) / pageSize; full > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "tokens: %d ids make %d full blocks of %d (at most %d)", len(tokens.GetIds()), full, pageSize, MaxRequestBlocks)
	}
	blocks := h.Sequence(tokens.GetIds())
	if n >= 0 && len(blocks) != n {
		return nil, status.Errorf(codes.InvalidArgument, "tokens: %d ids make %d full blocks of %d for %d slots", len(tokens.GetIds()), len(blocks), pageSize, n)
	}
	out := make([]uint64, len(blocks))
	for i, b := range blocks {
		out[i] = b.Sequence
	}
	return out, nil
}

// importCode is the gRPC code of an import that brought nothing.
func importCode(err error) codes.Code {
	var local localError
	switch {
	case errors.Is(err, errNoHolder):
		return codes.NotFound
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.As(err, &local):
		return status.Code(toStatus(local.err))
	}
	return codes.Unavailable
}

// toStatus maps errors of our packages to gRPC codes, never Unknown.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var alloc *pool.AllocError
	code := codes.Internal
	switch {
	case errors.As(err, &alloc), errors.Is(err, pool.ErrExhausted), errors.Is(err, pool.ErrOutOfMemory),
		errors.Is(err, pool.ErrTooManyLeases):
		code = codes.ResourceExhausted
	case errors.Is(err, layout.ErrInvalid), errors.Is(err, layout.ErrBlockSize), errors.Is(err, layout.ErrReplicasDiffer), errors.Is(err, pool.ErrBadSlot),
		errors.Is(err, pool.ErrInvalidArgument), errors.Is(err, ErrConfig):
		code = codes.InvalidArgument
	case errors.Is(err, pool.ErrInvalidTransition), errors.Is(err, pool.ErrStaleBlock):
		code = codes.FailedPrecondition
	case errors.Is(err, pool.ErrUnknownBlockSet):
		code = codes.NotFound
	case errors.Is(err, pool.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		code = codes.Unavailable
	}
	return status.Error(code, err.Error())
}

// loadWeight weighs a node's KV usage against its overlap when ranking
// holders for routers: score = overlap/query - loadWeight × usage.
const loadWeight = 1.0

func (e *engineServer) Lookup(ctx context.Context, req *fabricpb.LookupRequest) (*fabricpb.LookupResponse, error) {
	a := e.a
	// Lookup holds nothing for a session, but a call naming a bad or ended
	// one is refused like every other: the engine must learn at once.
	if _, err := a.sessionOf(ctx); err != nil {
		return nil, err
	}
	var perBlock uint64 // bytes one block moves into the engine's set
	bs := int(req.GetBlockSize())
	if id := req.GetBlockSet(); id != 0 {
		// Its restores from the tiers take slots there (localTiers).
		s, err := a.joinableSet(ctx, id)
		if err != nil {
			return nil, err
		}
		l := s.set.Layout()
		perBlock = l.Strides().Shard * uint64(l.TPSize)
		if bs == 0 {
			bs = l.PageSize
		}
	}
	if bs == 0 {
		bs = 16
	}
	if len(req.GetHashes()) > MaxRequestBlocks {
		return nil, status.Errorf(codes.InvalidArgument, "hashes: %d (at most %d)", len(req.GetHashes()), MaxRequestBlocks)
	}
	hashes, err := requestHashes(req.GetHashes(), req.GetTokens(), bs, -1)
	if err != nil {
		return nil, err
	}
	matches, onDisk := a.findHolders(hashes)
	loads := map[index.NodeID]float64{}
	// Members the index has no id for hold nothing: candidates with no
	// overlap, ranked here rather than named in the index.
	var idle []*fabricpb.Overlap
	for _, m := range a.members.Members() {
		if id, ok := a.index.Lookup(m.Name); ok {
			loads[id] = m.Meta.Load.KVUsage
		} else {
			idle = append(idle, &fabricpb.Overlap{Node: m.Name, Score: -loadWeight * m.Meta.Load.KVUsage})
		}
	}
	out := &fabricpb.LookupResponse{Hashes: hashes}
	for _, r := range index.Rank(matches, loads, len(hashes), loadWeight) {
		if name := a.index.Name(r.Node); name != "" { // "" if dropped since
			out.Overlaps = append(out.Overlaps, &fabricpb.Overlap{Node: name, Blocks: uint32(r.Blocks), Score: r.Score})
		}
	}
	if len(idle) > 0 {
		out.Overlaps = append(out.Overlaps, idle...)
		sort.SliceStable(out.Overlaps, func(i, j int) bool { return out.Overlaps[i].Score > out.Overlaps[j].Score })
	}
	if perBlock > 0 {
		for _, o := range out.Overlaps {
			o.Estimate = estimateNone
			if o.Blocks == 0 || o.Node == a.cfg.NodeName {
				continue
			}
			o.FetchBytes = uint64(o.Blocks) * perBlock
			d, basis, transport := a.fetchEstimate(o.Node, hashes[:o.Blocks], perBlock, onDisk)
			o.FetchEstimateUs, o.Estimate, o.Transport = uint64(d.Microseconds()), basis, transport
		}
	}
	if id := req.GetBlockSet(); id != 0 {
		s, err := a.enginesSet(id)
		if err != nil {
			return nil, err
		}
		out.LocalTiers = a.localTiers(ctx, s, hashes, !req.GetNoRestore())
	}
	return out, nil
}

// importTimeout is the bound on an engine's import that asked for ms
// milliseconds (ImportRequest.timeout_ms): what it asked, but at most the
// agent's import_timeout (limit), which is also the bound where it asked
// none. An import waits (for a busy holder, for another import bringing
// its blocks) until its bound: one the engine set past import_timeout
// would hold its call, and the blocks other imports wait for it to bring,
// for as long as it asked, up to 49 days.
func importTimeout(ms uint32, limit time.Duration) time.Duration {
	if d := time.Duration(ms) * time.Millisecond; d > 0 && d < limit {
		return d
	}
	return limit
}

func (e *engineServer) Import(ctx context.Context, req *fabricpb.ImportRequest) (*fabricpb.ImportResponse, error) {
	s, err := e.setFor(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	page := s.set.Layout().PageSize
	hashes, err := requestHashes(req.GetHashes(), req.GetTokens(), page, -1)
	if err != nil {
		return nil, err
	}
	if len(hashes) == 0 || len(hashes) > MaxRequestBlocks {
		what := "hashes"
		if req.GetTokens() != nil {
			what = fmt.Sprintf("tokens: %d ids make %d full blocks of %d", len(req.GetTokens().GetIds()), len(hashes), page)
		}
		return nil, status.Errorf(codes.InvalidArgument, "%s: %d blocks (want 1..%d)", what, len(hashes), MaxRequestBlocks)
	}
	var ts *tokenSource
	if t := req.GetTokens(); t != nil {
		ts = &tokenSource{ids: t.GetIds(), opts: layout.HashOptions{Salt: t.GetSalt(), LoRA: t.GetLora()}}
	}
	ctx, cancel := context.WithTimeout(ctx, importTimeout(req.GetTimeoutMs(), e.a.cfg.ImportTimeout))
	defer cancel()
	res := e.a.importBlocks(ctx, s, hashes, ts)
	// Where the session ended during the import, the blocks it brought
	// were given back (by detach, or by hold after it): none is listed.
	if err := s.gone(); err != nil {
		return nil, err
	}
	out := &fabricpb.ImportResponse{Blocks: res.refs, Fetches: res.fetches, Results: make([]*fabricpb.BlockResult, len(hashes))}
	for i, h := range hashes {
		r := &fabricpb.BlockResult{Hash: h}
		switch {
		case i < len(res.refs) && res.here[i]:
			r.Slot, r.Outcome = res.refs[i].GetSlot(), fabricpb.Outcome_OUTCOME_LOCAL
		case i < len(res.refs):
			r.Slot, r.Outcome = res.refs[i].GetSlot(), fabricpb.Outcome_OUTCOME_IMPORTED
		default:
			r.Outcome, r.Code = fabricpb.Outcome_OUTCOME_MISSING, uint32(importCode(res.err))
			if res.err != nil {
				r.Reason = res.err.Error()
			}
		}
		out.Results[i] = r
	}
	if res.err != nil {
		out.Error = res.err.Error()
		if len(res.refs) == 0 {
			// Nothing brought: a call error, so that callers that only
			// check the status see it.
			return nil, status.Error(importCode(res.err), res.err.Error())
		}
	}
	return out, nil
}

func (e *engineServer) Status(ctx context.Context, req *fabricpb.StatusRequest) (*fabricpb.StatusResponse, error) {
	a := e.a
	if _, err := a.sessionOf(ctx); err != nil {
		return nil, err
	}
	out := &fabricpb.StatusResponse{
		Node:         a.cfg.NodeName,
		Version:      buildinfo.Version(),
		IndexEntries: uint64(a.index.Metrics().Pairs),
		Imports:      a.stats.imports.Load(),
		ImportBytes:  a.stats.importBytes.Load(),
	}
	joined, _ := a.members.Joined()
	out.Joined = joined
	out.Lane, out.LaneFallbacks = a.laneStatus()
	out.ImportsInFlight = uint64(max(a.stats.inflight.Load(), 0))
	out.Leases = uint64(a.pool.Metrics().Leases)
	for _, m := range a.members.Members() {
		g := m.Meta.GPUs
		mb := &fabricpb.Member{Node: m.Name, GossipAddr: m.Addr.String(), PeerAddr: m.Meta.PeerAddr, State: "alive",
			Rdma: m.Meta.Transports&membership.TransportRDMA != 0,
			Gpus: uint32(g.Count), GpuPoolBytes: g.PoolBytes, GpuNics: uint32(g.NICs), GpuModel: g.Model}
		if m.MetaErr != nil {
			mb.State = "alive (bad metadata: " + m.MetaErr.Error() + ")"
		}
		if id, ok := a.index.Lookup(m.Name); ok {
			mb.Blocks = uint64(a.index.NodeBlocks(id))
		}
		if l, ok := a.health.link(m.Name); ok {
			mb.PeerReachable, mb.PeerAuthenticated, mb.PeerError = l.Reachable, l.Authenticated, l.LastError
		}
		mb.IndexMode, mb.IndexReplicas, mb.IndexMismatch = indexModeName(m.Meta.Index), uint32(m.Meta.Index.Replicas), a.indexMismatch(m)
		if mb.IndexMismatch {
			out.IndexMismatchedMembers++
		}
		out.Members = append(out.Members, mb)
	}
	sort.Slice(out.Members, func(i, j int) bool { return out.Members[i].Node < out.Members[j].Node })
	for _, d := range a.members.Departed() {
		state := "failed"
		if d.Kind == membership.MemberLeave {
			state = "left"
		}
		out.Members = append(out.Members, &fabricpb.Member{Node: d.Name, GossipAddr: d.Addr.String(), PeerAddr: d.Meta.PeerAddr,
			State: state, SinceUnixMs: d.Since.UnixMilli()})
	}
	// One pass over the block sets, so that the pool's totals and the
	// sets listed agree.
	for i, st := range a.storages {
		p := &fabricpb.Pool{Kind: a.poolKind, SizeBytes: st.Size(), Device: -1, RdmaRegistration: a.rdmaReg[i], RdmaDevice: a.poolDevice[i]}
		if a.gpus != nil {
			p.Device = int32(a.gpus[i])
		}
		out.Pools = append(out.Pools, p)
	}
	for _, s := range a.engineSets() {
		l := s.set.Layout()
		seen := map[int]bool{}
		for r, reg := range l.Regions {
			i, err := s.set.RegionStorage(r)
			if err != nil {
				continue
			}
			out.Pools[i].CarvedBytes += reg.Size
			if !seen[i] {
				seen[i] = true
				out.Pools[i].BlockSets++
			}
		}
		m := s.set.Metrics()
		out.BlockSets = append(out.BlockSets, &fabricpb.BlockSet{
			Id: uint64(s.set.ID()), Engine: s.engine, LayoutDigest: l.Digest().Short(),
			TpSize: uint32(l.TPSize), PageSize: uint32(l.PageSize), Slots: uint32(m.Slots),
			Free: uint32(m.Free), Registered: uint32(m.Registered), Leased: uint32(m.Leased),
		})
		s.mu.Lock()
		bs := out.BlockSets[len(out.BlockSets)-1]
		bs.Sessions = uint32(len(s.users))
		bs.Orphaned, bs.Adoptions = s.orphaned, s.adoptions
		if !s.idleSince.IsZero() {
			bs.IdleSinceUnixMs = s.idleSince.UnixMilli()
		}
		s.mu.Unlock()
	}
	out.Sessions = a.sessionsStatus()
	out.Tiers = a.tierStatus()
	own := a.indexModeMeta()
	out.IndexMode, out.IndexReplicas = indexModeName(own), uint32(own.Replicas)
	if a.owned != nil {
		o := a.owned.metrics()
		out.OwnedIndex = &fabricpb.OwnedIndex{OpsSent: o.OpsSent, OpCallsSent: o.OpCalls, OpsReceived: o.OpsReceived,
			LookupsAsked: o.LookupsAsked, LookupsAnswered: o.LookupsAnswered,
			CacheHits: o.Cache.Hits, CacheMisses: o.Cache.Misses, CacheExpiries: o.Cache.Expired,
			Handoffs: o.Handoffs, HandoffOps: o.HandoffOps, StreamErrors: o.StreamErrors, StreamReplaces: o.StreamReplaces}
	}
	mt := a.members.Metrics()
	out.GossipBytesIn, out.GossipBytesOut = mt.GossipBytesIn, mt.GossipBytesOut
	out.GossipRangeRepairs, out.GossipSnapshotRepairs = mt.RangeRepairs, mt.SnapshotRepairs
	return out, nil
}

// indexModeName is an index mode as status names it: whole or owned.
func indexModeName(x membership.IndexMode) string {
	if x.Owned {
		return IndexOwned
	}
	return IndexWhole
}
