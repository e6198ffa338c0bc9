package fabric

import (
	"context"
	crand "crypto/rand"
	"encoding/binary"
	"errors"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/pool"
)

// SessionMetadata is the gRPC metadata key that names the session a call
// works under.
const SessionMetadata = fabricpb.SessionMetadata

// session is an engine's session: what the engine allocated, referenced or
// registered a block set for under it is given back when it ends.
type session struct {
	id     uint64 // 0: the implicit session of calls that name none
	pid    int32
	uid    uint32
	opened time.Time

	mu     sync.Mutex
	engine string
	ended  bool
	why    string                    // why it ended
	sets   map[pool.SetID]*engineSet // the sets it uses
}

// setUse is what one session holds in one block set: references on
// registered blocks and allocated slots, by slot. Guarded by the set's mu.
type setUse struct {
	refs map[int]slotRef
	// done: the session ended or dropped the set, and what it held was
	// given back; a call still running gives back what it takes.
	done bool
}

type slotRef struct {
	gen  uint64
	refs int
}

// sessionSet is a block set as one session sees it, for the length of one
// call.
type sessionSet struct {
	*engineSet
	sess *session
	use  *setUse
	// attached: the call's attach made the set one of the session's
	// (attach).
	attached bool
	// beforeHold and beforeCallerCheck are the agent's test hooks of
	// those names.
	beforeHold        func(session uint64)
	beforeCallerCheck func(ctx context.Context)
}

// hold records a reference handed to the session, and reports whether the
// session holds it: false once the session ended, or dropped the set,
// since the call attached the set (detach marked its use done), and then
// the reference is given back here, as nobody else will give it back. A
// call that gets false must not hand the slot to the engine (s.gone says
// what to answer instead).
func (s *sessionSet) hold(b pool.Block) bool {
	return s.holdAll([]pool.Block{b})
}

// holdAll is hold for many references, under one hold of the set's lock:
// all are held, or (false) all are given back. With none it reports
// whether the session still holds what it held.
func (s *sessionSet) holdAll(bs []pool.Block) bool {
	if f := s.beforeHold; f != nil && len(bs) > 0 {
		f(s.sess.id)
	}
	s.mu.Lock()
	if !s.use.done {
		for _, b := range bs {
			r := s.use.refs[b.Slot]
			if r.gen != b.Generation {
				r = slotRef{gen: b.Generation}
			}
			r.refs++
			s.use.refs[b.Slot] = r
		}
		s.mu.Unlock()
		return true
	}
	s.mu.Unlock()
	// The session ended while the call ran: nobody will give them back.
	for _, b := range bs {
		giveBack(s.set, b.Slot, slotRef{gen: b.Generation, refs: 1})
	}
	return false
}

// gone is nil while the session holds what it took in the set under this
// call; once it ended, or dropped the set, during the call (everything it
// held there given back by detach, and what the call takes after by hold),
// gone is the call's answer in place of slots or blocks: FAILED_PRECONDITION,
// as for a call that names an ended session, for the engine must not use
// them and opens a new session. A handler that hands slots or blocks to
// the engine asks it after its last hold: a session that ends after that
// ends as after the call.
func (s *sessionSet) gone() error {
	s.mu.Lock()
	done := s.use.done
	s.mu.Unlock()
	if !done {
		return nil
	}
	// endSession marks the session ended before detach marks its uses
	// done: a use done by a session not ended is a dropped set.
	s.sess.mu.Lock()
	ended, why := s.sess.ended, s.sess.why
	s.sess.mu.Unlock()
	if ended {
		return status.Errorf(codes.FailedPrecondition,
			"session %d: ended during the call (%s); the slots and blocks it held, this call's included, were given back: open a new session", s.sess.id, why)
	}
	return status.Errorf(codes.FailedPrecondition,
		"block set %d: session %d dropped it during the call; the slots and blocks it held there, this call's included, were given back", s.set.ID(), s.sess.id)
}

// drop returns a reference held by the session on slot.
func (s *sessionSet) drop(slot int) (pool.Block, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.use.refs[slot]
	if !ok || r.refs == 0 {
		return pool.Block{}, status.Errorf(codes.FailedPrecondition, "slot %d: the session holds no reference on it", slot)
	}
	r.refs--
	if r.refs == 0 {
		delete(s.use.refs, slot)
	} else {
		s.use.refs[slot] = r
	}
	return pool.Block{Slot: slot, Generation: r.gen}, nil
}

// unholdAll gives back the session's references on bs that a call took
// and will not report (its caller gave up first): each dropped from the
// session, then returned to the pool by op (Release for blocks, Abort
// for slots never registered).
func (s *sessionSet) unholdAll(bs []pool.Block, op func(*pool.BlockSet, pool.Block) error) {
	for _, b := range bs {
		if d, err := s.drop(b.Slot); err == nil {
			op(s.set, d)
		}
	}
}

// callerGone gives back what a call held for the session, bs, where its
// caller gave up (its deadline passed, or it went away) before the call
// could answer: the engine will never learn of them, and they would stay
// the session's until it ends. It returns the error to answer with, nil
// where the caller still waits.
func (s *sessionSet) callerGone(ctx context.Context, bs []pool.Block, op func(*pool.BlockSet, pool.Block) error) error {
	if f := s.beforeCallerCheck; f != nil {
		f(ctx)
	}
	err := ctx.Err()
	if err == nil {
		return nil
	}
	s.unholdAll(bs, op)
	return status.FromContextError(err).Err()
}

// giveBack returns what a session held on one slot to the pool: references
// on a registered block are released, an allocated slot is freed. A slot
// recycled since (another generation) has nothing of the session's left.
func giveBack(set *pool.BlockSet, slot int, r slotRef) (released, freed int) {
	info, err := set.Slot(slot)
	if err != nil || info.Generation != r.gen {
		return 0, 0
	}
	b := pool.Block{Slot: slot, Generation: r.gen}
	switch info.State {
	case pool.Registered:
		for range r.refs {
			if set.Release(b) == nil {
				released++
			}
		}
	case pool.Partial, pool.Complete:
		if set.Abort(b) == nil {
			freed++
		}
	}
	return released, freed
}

// newSessionID returns an id no other open session has; ids are random so
// that a stale id from an ended session is not some other engine's.
func (a *Agent) newSessionID() uint64 {
	var b [8]byte
	for {
		crand.Read(b[:])
		id := binary.LittleEndian.Uint64(b[:]) >> 11 // exact in a JSON number
		if _, taken := a.sessions[id]; id != 0 && !taken {
			return id
		}
	}
}

// openSession starts a session for the engine process at the other end of
// ctx's connection.
func (a *Agent) openSession(ctx context.Context, engine string) *session {
	s := &session{engine: engine, opened: time.Now(), sets: map[pool.SetID]*engineSet{}}
	if p, ok := peer.FromContext(ctx); ok {
		if c, ok := p.AuthInfo.(peerCred); ok {
			s.pid, s.uid = c.pid, c.uid
		}
	}
	a.sessMu.Lock()
	s.id = a.newSessionID()
	a.sessions[s.id] = s
	a.sessMu.Unlock()
	a.log.Info("engine session opened", "session", s.id, "engine", engine, "pid", s.pid, "uid", s.uid)
	return s
}

// endSession gives back everything s holds; registered blocks stay cached.
func (a *Agent) endSession(s *session, why string) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended, s.why = true, why
	sets, engine := s.sets, s.engine
	s.sets = nil
	s.mu.Unlock()
	a.sessMu.Lock()
	delete(a.sessions, s.id)
	a.sessMu.Unlock()
	var released, freed int
	for _, es := range sets {
		r, f := a.detach(s, es)
		released += r
		freed += f
	}
	a.log.Info("engine session ended", "session", s.id, "engine", engine, "pid", s.pid, "why", why,
		"block_sets", len(sets), "released", released, "freed", freed)
}

// sessionOf returns the session ctx's call works under: the one its
// metadata names, else the implicit session. A session opened by another
// process (both known by SO_PEERCRED) is refused.
func (a *Agent) sessionOf(ctx context.Context) (*session, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	v := md.Get(SessionMetadata)
	if len(v) == 0 {
		return a.unowned, nil
	}
	if len(v) > 1 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %d values, want one", SessionMetadata, len(v))
	}
	id, err := strconv.ParseUint(v[0], 10, 64)
	if err != nil || id == 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%s: %q is not a session id", SessionMetadata, v[0])
	}
	a.sessMu.Lock()
	s := a.sessions[id]
	a.sessMu.Unlock()
	if s == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "session %d: not open (it ended, or the agent restarted); open a new one", id)
	}
	// Ids are no secret (Status lists them): a session is its process's,
	// and another process's calls under it would rename it, hold their
	// sets under it, and spend its request budget.
	if pid := callerPID(ctx); pid > 0 && s.pid > 0 && pid != s.pid {
		return nil, status.Errorf(codes.PermissionDenied, "session %d: opened by process %d, not by process %d; a process calls under the sessions it opened", id, s.pid, pid)
	}
	return s, nil
}

// attach makes es one of the sets s uses, and returns it as s sees it; no
// process is checked or recorded (attachJoining of pid 0).
func (a *Agent) attach(s *session, es *engineSet) (*sessionSet, error) {
	return a.attachJoining(s, es, 0)
}

// attachJoining is attach for a Register of process pid that has chosen
// es (handOver): pid is checked (may it join es) and recorded as a
// receiver in the same hold of es.mu in which es is made one of s's sets,
// before any call can see s use es: a call of another process that took
// es up since the Register chose it (reusableSet's mayJoin, in an earlier
// hold) keeps es, nothing is attached, and errJoinedMeanwhile is returned,
// for the Register to choose again. A process of pid 0 may join, and is
// recorded as no receiver.
func (a *Agent) attachJoining(s *session, es *engineSet, pid int32) (*sessionSet, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return nil, status.Errorf(codes.FailedPrecondition, "session %d: ended", s.id)
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed {
		return nil, status.Errorf(codes.NotFound, "block set %d: freed (no session used it); register again", es.set.ID())
	}
	if es.claim != nil {
		return nil, &setClaimedError{set: es.set.ID(), done: es.claim}
	}
	if !es.callLocked(pid, true) {
		return nil, errJoinedMeanwhile
	}
	u := es.users[s.id]
	attached := u == nil
	if attached {
		u = &setUse{refs: map[int]slotRef{}}
		es.users[s.id] = u
		if es.freeTimer != nil {
			es.freeTimer.Stop()
			es.freeTimer = nil
		}
		es.timerGen++
		es.idleSince = time.Time{}
		a.adoptLocked(es)
	}
	s.sets[es.set.ID()] = es
	return &sessionSet{engineSet: es, sess: s, use: u, attached: attached, beforeHold: a.cfg.hooks.beforeHold,
		beforeCallerCheck: a.cfg.hooks.beforeCallerCheck}, nil
}

// setClaimedError is attach's answer for an idle set that a Register is
// freeing to make its engine's new set (swapFallback's claim): no session
// takes it up meanwhile. done is closed when the claim ends.
type setClaimedError struct {
	set  pool.SetID
	done <-chan struct{}
}

func (e *setClaimedError) Error() string {
	return "fabric: block set " + strconv.FormatUint(uint64(e.set), 10) + " is being freed for a new set of its engine"
}

// attachUnclaimed is attach for a session that names es (an engine call
// on a set it registered): where a Register has claimed es, it waits for
// the claim to end (or ctx), then attaches es, or finds it freed
// (NOT_FOUND: register again).
func (a *Agent) attachUnclaimed(ctx context.Context, s *session, es *engineSet) (*sessionSet, error) {
	for {
		ss, err := a.attach(s, es)
		var c *setClaimedError
		if !errors.As(err, &c) {
			return ss, err
		}
		select {
		case <-c.done:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// detach gives back what s holds in es; a set left with no session is
// freed after the grace period.
func (a *Agent) detach(s *session, es *engineSet) (released, freed int) {
	es.mu.Lock()
	u := es.users[s.id]
	delete(es.users, s.id)
	var refs map[int]slotRef
	if u != nil {
		u.done = true
		refs, u.refs = u.refs, nil
	}
	es.mu.Unlock()
	for slot, r := range refs {
		rl, f := giveBack(es.set, slot, r)
		released += rl
		freed += f
	}
	es.mu.Lock()
	if len(es.users) == 0 && !es.freed && es.idleSince.IsZero() {
		es.idleSince = time.Now()
		a.scheduleFree(es, a.cfg.BlockSetGrace)
	}
	es.mu.Unlock()
	return released, freed
}

// scheduleFree frees es after d if no session uses it by then. es.mu is
// held.
func (a *Agent) scheduleFree(es *engineSet, d time.Duration) {
	if es.freeTimer != nil {
		es.freeTimer.Stop()
	}
	// A timer that fired while the set was being taken up again must not
	// cut a later grace period short.
	es.timerGen++
	gen := es.timerGen
	es.freeTimer = time.AfterFunc(d, func() {
		select {
		case <-a.done:
			return
		default:
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		a.freeIdleLocked(es, gen) // a timer's free never lets go of a.mu
	})
}

// blockSetRetry is how soon a set whose grace timer could not free it
// because peers lease its blocks (or a copy reads them) is tried again.
const blockSetRetry = time.Second

// freeIdleLocked frees es if no session uses it, and reports whether it
// did. A grace timer passes its generation, and frees nothing unless it is
// still the set's latest timer (checked under the same lock as the users,
// so that a session that takes the set up and drops it again in between
// restarts the grace period); others pass 0. a.mu is held.
//
// Freeing for room now (timerGen 0), where the set's read-ahead is under
// way (it holds slots busy until its reads end), it ends the read-ahead
// and waits for it without a.mu or es.mu, so that engine calls go on
// meanwhile (Registers excepted: blockSetForSession holds a.registerMu),
// then takes a.mu again and looks at the set anew: a session may have
// taken it up, or a grace timer freed it. unlocked says it let go of a.mu
// so: the caller must then not count on what it read under a.mu before
// the call (which sets are idle, the memory they take, es itself, freed
// by its timer where freed is false, or any other set). Which sets are
// idle changes without a.mu too (Agent.relocks): a.mu held throughout
// keeps only the sets there are as they were.
func (a *Agent) freeIdleLocked(es *engineSet, timerGen uint64) (freed, unlocked bool) {
	for waited := false; ; waited = true {
		freed, wait := a.freeIdleOnceLocked(es, timerGen, waited)
		if !wait {
			return freed, waited
		}
		a.mu.Unlock()
		if a.tiers != nil {
			// The read-ahead takes neither a.mu nor es.mu (nor does its
			// forget of the blocks it finds lost), so the wait lasts only
			// as long as its reads.
			ctx, cancel := context.WithTimeout(a.tiers.ctx, a.cfg.ImportTimeout)
			a.tiers.endAhead(ctx, es)
			cancel()
		}
		if f := a.cfg.hooks.idleUnlocked; f != nil {
			f(es)
		}
		a.mu.Lock()
		a.relocks++
	}
}

// setFreed says whether es was freed (and so is gone from a.sets).
func setFreed(es *engineSet) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.freed
}

// freeIdleOnceLocked is freeIdleLocked under a.mu throughout: it frees es
// if it may, or says to wait for its read-ahead first (where it frees for
// room now, has not waited yet, and one is under way). a.mu is held.
func (a *Agent) freeIdleOnceLocked(es *engineSet, timerGen uint64, waited bool) (freed, wait bool) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed || len(es.users) > 0 || (timerGen != 0 && timerGen != es.timerGen) {
		return false, false
	}
	if timerGen != 0 && a.keepAsOrphanLocked(es) {
		return false, false
	}
	if n := es.set.Retired(); n > 0 {
		// Freed, its memory would be withheld from every other set
		// (pool.BlockSet.Retire) for no gain, and made room for none:
		// kept instead, its other slots and cached blocks for a later
		// engine of its layout, attached at once only when it has the
		// slots asked for usable, else only when no new set fits
		// (Agent.reusableSet). Said once, when its grace period ends.
		if timerGen != 0 {
			a.log.Info("idle block set kept: slots retired in it would keep its memory from any other set", "set", es.set.ID(), "retired", n)
		}
		if es.freeTimer != nil {
			es.freeTimer.Stop()
			es.freeTimer = nil
		}
		return false, false
	}
	switch {
	case timerGen == 0 && !waited && a.cfg.hooks.idleUnlocked != nil:
		return false, true // as where a read-ahead is under way
	case a.tiers == nil:
	case timerGen == 0 && !waited && a.tiers.aheadUnderWay(es):
		// Freed for room now (for a new set, or within the engine's
		// quota): its read-ahead holds slots busy until its reads end, so
		// it is ended and waited for (without the locks), and the set
		// freed then rather than skipped.
		return false, true
	default:
		// Its slots given back as its reads end (a grace timer's free,
		// or one started again while the last was waited for: the set
		// may be found busy and tried again).
		a.tiers.stopAhead(es)
	}
	if f := a.cfg.hooks.beforeSetFree; f != nil {
		f(es)
	}
	// Reclaimed, not freed: a slot retired since Retired was asked (a
	// device read-ahead's or restore's upload that outlived a wait, found
	// unsynced) makes the pool refuse, rather than free the set with its
	// memory withheld, where the caller counted on its room (a quota's
	// swap makes its new set there, the engine left with neither set);
	// a grace expiry, which counts on no room, keeps it too, as a cache.
	if err := a.pool.ReclaimBlockSet(es.set.ID()); err != nil {
		if errors.Is(err, pool.ErrBlockSetRetired) {
			// As above, kept, with its other slots and cached blocks.
			a.log.Info("idle block set kept: a slot retired in it as it was freed would keep its memory from any other set", "set", es.set.ID())
			if es.freeTimer != nil {
				es.freeTimer.Stop()
				es.freeTimer = nil
			}
			return false, false
		}
		if errors.Is(err, pool.ErrBlockSetBusy) {
			// Only its timer's own free is tried again soon. A free for
			// room leaves the set's timer as it was: its grace period
			// (or none, an orphan kept as a cache), which a retry would
			// cut short, freeing or orphaning an idle set a Register
			// merely found busy (and may have gone on without, or been
			// given as its fallback) about a second later.
			if timerGen != 0 {
				a.log.Debug("idle block set busy; trying again", "set", es.set.ID(), "err", err)
				a.scheduleFree(es, blockSetRetry)
			} else {
				a.log.Debug("idle block set busy; not freed for room", "set", es.set.ID(), "err", err)
			}
		} else {
			a.log.Error("idle block set not freed", "set", es.set.ID(), "err", err)
		}
		return false, false
	}
	es.freed = true
	if a.tiers != nil {
		a.tiers.aheadFreed(es)
	}
	if es.orphaned {
		a.stats.orphans.reclaimed.Add(1)
	}
	a.dropSetMemoryLocked(es)
	if es.freeTimer != nil {
		es.freeTimer.Stop()
		es.freeTimer = nil
	}
	delete(a.sets, es.set.ID())
	a.pokeMeta()
	a.log.Info("block set freed", "set", es.set.ID(), "engine", es.engine, "idle", time.Since(es.idleSince).Round(time.Millisecond))
	return true, false
}

// freeIdleSets frees the sets no session uses that may says it may free,
// longest idle first, until made succeeds, and returns made's last answer.
// keep, if not nil, is never freed: the set a Register falls back to where
// made still fails. Where freeing one let go of a.mu, made is asked again,
// and, where it still fails, pool.ErrOutOfMemory returned at once: which
// sets are idle, and which may says it may free, was read before, and the
// caller looks again (sets gone idle or orphaned meanwhile, engines within
// a fair share since, the quota). Sets in tried are not freed, and those
// it tries and does not free go into it (makeRoomInQuota; nil for
// none). a.mu is held.
func (a *Agent) freeIdleSets(made func() (*pool.BlockSet, error), may func(*engineSet) bool, keep *engineSet, tried triedSets) (*pool.BlockSet, error) {
	type idleSet struct {
		es       *engineSet
		since    time.Time
		orphaned bool
	}
	var idle []idleSet
	for _, es := range a.sets {
		es.mu.Lock()
		if len(es.users) == 0 && !es.freed {
			idle = append(idle, idleSet{es, es.idleSince, es.orphaned})
		}
		es.mu.Unlock()
	}
	// Orphans first, whoever made them: their engines are gone
	// (engine_orphans.go).
	idle = slices.DeleteFunc(idle, func(is idleSet) bool {
		return is.es == keep || tried[is.es] || (!is.orphaned && !may(is.es))
	})
	sort.Slice(idle, func(i, j int) bool {
		if idle[i].orphaned != idle[j].orphaned {
			return idle[i].orphaned
		}
		return idle[i].since.Before(idle[j].since)
	})
	set, err := made()
	for _, is := range idle {
		es := is.es
		if !errors.Is(err, pool.ErrOutOfMemory) {
			break
		}
		// Where it let go of a.mu meanwhile, another may have freed es
		// or another set (a grace timer): made is asked again all the
		// same, and the list is not gone on with.
		freed, unlocked := a.freeIdleLocked(es, 0)
		if !freed && tried != nil {
			tried[es] = true
		}
		if freed || unlocked {
			set, err = made()
		}
		if unlocked {
			break
		}
	}
	return set, err
}

// OpenSession keeps a session open for as long as its stream lives and
// SessionRequests arrive within the keepalive bound. A stream past the
// bounds on sessions (sessionCount) is refused before anything is read.
func (e *engineServer) OpenSession(stream fabricpb.Engine_OpenSessionServer) error {
	a := e.a
	ctx := stream.Context()
	pid := callerPID(ctx)
	if err := a.sessCount.take(pid); err != nil {
		// Spaced: a runaway process (or one forking without end) may
		// open sessions many times a second, each line of its own pid;
		// the metric counts every refusal.
		if log, quiet := a.sessCount.refusedLog.due(time.Now(), sessionRefusedLogEvery); log {
			a.log.Warn("engine session refused: too many open", "pid", pid, "err", err, "not_logged", quiet)
		}
		return err
	}
	defer a.sessCount.give(pid)
	type recv struct {
		req *fabricpb.SessionRequest
		err error
	}
	msgs := make(chan recv, 1)
	go func() {
		for {
			req, err := stream.Recv()
			select {
			case msgs <- recv{req, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	bound := a.cfg.SessionKeepalive
	timer := time.NewTimer(bound)
	defer timer.Stop()
	var first *fabricpb.SessionRequest
	select {
	case m := <-msgs:
		if m.err != nil {
			return m.err
		}
		first = m.req
		if err := checkString("engine", first.GetEngine(), MaxEngineName); err != nil {
			return err
		}
	case <-timer.C:
		return status.Errorf(codes.DeadlineExceeded, "session: no first SessionRequest within %v", bound)
	case <-ctx.Done():
		return ctx.Err()
	case <-a.done:
		return status.Error(codes.Unavailable, "session: the agent is stopping")
	}
	s := a.openSession(ctx, first.GetEngine())
	why := "closed by the engine"
	defer func() { a.endSession(s, why) }()
	if err := stream.Send(&fabricpb.SessionEvent{Session: s.id, KeepaliveMs: uint32(bound / time.Millisecond)}); err != nil {
		why = "first event not sent: " + err.Error()
		return err
	}
	for {
		timer.Reset(bound)
		select {
		case m := <-msgs:
			if m.err != nil {
				if status.Code(m.err) == codes.Canceled || ctx.Err() != nil {
					why = "connection closed"
				}
				return nil
			}
		case <-timer.C:
			why = "no keepalive for " + bound.String()
			return status.Errorf(codes.DeadlineExceeded, "session %d: no SessionRequest for %v; ended", s.id, bound)
		case <-ctx.Done():
			why = "connection closed"
			return ctx.Err()
		case <-a.done:
			why = "agent stopping"
			return status.Error(codes.Unavailable, "session: the agent is stopping")
		}
	}
}

// DropBlockSet gives back what the calling session holds in a block set.
func (e *engineServer) DropBlockSet(ctx context.Context, req *fabricpb.DropBlockSetRequest) (*fabricpb.DropBlockSetResponse, error) {
	sess, err := e.a.sessionOf(ctx)
	if err != nil {
		return nil, err
	}
	es, err := e.a.joinableSet(ctx, req.GetBlockSet())
	if err != nil {
		return nil, err
	}
	sess.mu.Lock()
	_, used := sess.sets[es.set.ID()]
	delete(sess.sets, es.set.ID())
	sess.mu.Unlock()
	if !used {
		return nil, status.Errorf(codes.FailedPrecondition, "block set %d: session %d does not use it", req.GetBlockSet(), sess.id)
	}
	r, f := e.a.detach(sess, es)
	return &fabricpb.DropBlockSetResponse{Released: uint32(r), Freed: uint32(f)}, nil
}

// sessionsStatus lists the sessions, the implicit one when it holds
// anything.
func (a *Agent) sessionsStatus() []*fabricpb.Session {
	a.sessMu.Lock()
	all := make([]*session, 0, len(a.sessions)+1)
	for _, s := range a.sessions {
		all = append(all, s)
	}
	a.sessMu.Unlock()
	all = append(all, a.unowned)
	var out []*fabricpb.Session
	for _, s := range all {
		s.mu.Lock()
		ps := &fabricpb.Session{Id: s.id, Engine: s.engine, Pid: s.pid, Uid: s.uid, OpenedUnixMs: s.opened.UnixMilli()}
		sets := make([]*engineSet, 0, len(s.sets))
		for _, es := range s.sets {
			sets = append(sets, es)
		}
		s.mu.Unlock()
		sort.Slice(sets, func(i, j int) bool { return sets[i].set.ID() < sets[j].set.ID() })
		for _, es := range sets {
			ps.BlockSets = append(ps.BlockSets, uint64(es.set.ID()))
			es.mu.Lock()
			if u := es.users[s.id]; u != nil {
				for slot, r := range u.refs {
					if info, err := es.set.Slot(slot); err == nil && info.Generation == r.gen && info.State == pool.Registered {
						ps.Refs += uint32(r.refs)
					} else {
						ps.Slots++
					}
				}
			}
			es.mu.Unlock()
		}
		if s.id == 0 && len(ps.BlockSets) == 0 {
			continue
		}
		out = append(out, ps)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].OpenedUnixMs < out[j].OpenedUnixMs })
	return out
}
