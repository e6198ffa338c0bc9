package fabric

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/peer"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool"
)

// Engine memory isolation. An engine maps the memory of its own block sets
// only: each rank region of a host block set is a pool.Section with a
// memory file and a token of its own, made when the set is made (fresh
// pages, zeroed by the kernel), so that no descriptor or file an engine
// receives reaches another set. When a set is freed its sections are
// closed; the pool may carve its range again, but under a new section, so
// an engine that kept its mapping keeps the old pages and can neither read
// nor write the next set's.
//
// A set is shared only within one engine process: the agent records every
// process it handed a set's memory to (the caller of Register, and each
// peer of the descriptor socket by SO_PEERCRED), and a session of another
// process joins the set only once every one of them has exited (a pidfd
// says so). Slots of a set taken over that way are zeroed when they are
// allocated, so a fresh slot never shows the previous engine's bytes.
//
// Sections replace the pages under the pool's addresses, which memory
// registered with a NIC or the CUDA driver would not follow: with RDMA,
// and with a host pool pinned through the CUDA driver (cuMemHostRegister),
// each set's sections are registered when it is made and deregistered
// when it is freed, before its range can get new pages.

// setMemory is one rank region of a block set, as engines receive it.
type setMemory struct {
	sec *pool.Section
	// token maps the section over the descriptor socket; renewed as the
	// set passes on (renewSetMemory). Guarded by Agent.memMu.
	token string
	// rdma is the section's bytes while registered with the NIC.
	rdma []byte
	// pinned: the section is registered with the CUDA driver.
	pinned bool
}

// memoryRef is what a token on the descriptor socket names.
type memoryRef struct {
	es   *engineSet
	rank int
}

// tokenKey is how tokens are kept: a lookup by digest learns nothing of a
// token by timing.
func tokenKey(token string) [32]byte { return sha256.Sum256([]byte(token)) }

// isolatable says whether block sets can get sections: the pool is host
// memory that no driver registered as a whole (pinned through CUDA, it is
// registered set by set).
func (a *Agent) isolatable() bool {
	if a.host == nil || len(a.storages) != 1 {
		return false
	}
	return a.storages[0] == pool.Storage(a.host) || a.pinned != nil && a.storages[0] == pool.Storage(a.pinned)
}

// giveSetMemory makes the sections of a new block set. a.mu is held.
func (a *Agent) giveSetMemory(es *engineSet) error {
	mem, err := a.prepareSetMemory(es.set.Layout(), es.set.ID())
	if err != nil {
		return err
	}
	return a.placeSetMemory(es, mem)
}

// prepareSetMemory makes the memory files of the sections of a block set
// of layout l, block set id (0: not made yet), placed nowhere: what can
// fail of a set's memory before its range is touched (a descriptor or a
// file, its size, its access), so that a caller can learn it before it
// gives anything up for the set (the quota's swap, swapFallback).
// placeSetMemory places them; closeSetMemory closes them unplaced. nil
// where sets get no memory of their own. a.mu is held.
func (a *Agent) prepareSetMemory(l *layout.Layout, id pool.SetID) ([]*setMemory, error) {
	if !a.isolated {
		return nil, nil
	}
	page := uint64(os.Getpagesize())
	size := (l.Strides().Region + page - 1) &^ (page - 1) // each rank's region (pool.Pool.NewBlockSetOn)
	mem := make([]*setMemory, l.TPSize)
	set := "kvfabric-set"
	if id != 0 {
		set = fmt.Sprintf("kvfabric-set%d", id)
	}
	for r := range l.TPSize {
		// The name of a named file says nothing an engine could guess:
		// the directory is not listable, and a file is opened by the name
		// its engine was told.
		tok := newMemoryToken()
		sec, err := a.host.NewSectionFile(size, fmt.Sprintf("%s-rank%d-%s", set, r, tok[len("mem-"):]))
		if err != nil {
			a.closeSetMemory(mem)
			return nil, fmt.Errorf("fabric: memory of block set %d rank %d: %w", id, r, err)
		}
		mem[r] = &setMemory{sec: sec, token: newMemoryToken()}
		if a.cfg.MemoryDir != "" {
			if err := a.applySocketAccess(sec.Path(), 0o666); err != nil {
				a.closeSetMemory(mem)
				return nil, fmt.Errorf("fabric: memory file %s: %w", sec.Path(), err)
			}
		}
	}
	if err := a.memoryHook(false, mem); err != nil {
		a.closeSetMemory(mem)
		return nil, err
	}
	return mem, nil
}

// closeSetMemory closes memory prepareSetMemory made, placed or not, and
// ends the registrations of what was placed.
func (a *Agent) closeSetMemory(mem []*setMemory) {
	for _, m := range mem {
		if m != nil {
			a.unregister(m)
			m.sec.Close()
		}
	}
}

// memoryHook runs the setMemory test hook, if set, on mem's sections.
func (a *Agent) memoryHook(placed bool, mem []*setMemory) error {
	f := a.cfg.hooks.setMemory
	if f == nil {
		return nil
	}
	secs := make([]*pool.Section, len(mem))
	for r, m := range mem {
		secs[r] = m.sec
	}
	return f(placed, secs)
}

// placeSetMemory puts the sections of mem (prepareSetMemory's, for es's
// layout) under es's ranks, registers them (the CUDA driver, the NIC:
// where that fails they are used unregistered) and hands out their
// tokens: es's memory from then on. Where a section cannot be placed (its
// mapping, or its page lock) mem is closed. a.mu is held.
func (a *Agent) placeSetMemory(es *engineSet, mem []*setMemory) error {
	if !a.isolated {
		return nil
	}
	l := es.set.Layout()
	page := uint64(os.Getpagesize())
	undo := func() { a.closeSetMemory(mem) }
	if len(mem) != l.TPSize {
		undo()
		return fmt.Errorf("fabric: memory of block set %d: %d ranks' sections for %d ranks", es.set.ID(), len(mem), l.TPSize)
	}
	for r := range l.TPSize {
		off, err := es.set.RegionOffset(r)
		if err != nil {
			undo()
			return err
		}
		size := (l.Regions[r].Size + page - 1) &^ (page - 1)
		if got := mem[r].sec.Size(); got != size {
			undo()
			return fmt.Errorf("fabric: memory of block set %d rank %d: a section of %d bytes for %d", es.set.ID(), r, got, size)
		}
		if err := mem[r].sec.Place(off); err != nil {
			undo()
			return fmt.Errorf("fabric: memory of block set %d rank %d: %w", es.set.ID(), r, err)
		}
		if a.pinned != nil {
			if err := a.pinned.Pin(off, size); err != nil {
				// The memory is still good host memory; copies to a GPU
				// are slower from it.
				a.log.Warn("pinning a block set's memory through the CUDA driver failed: it stays pageable",
					"set", es.set.ID(), "rank", r, "bytes", size, "err", err)
			} else {
				mem[r].pinned = true
			}
		}
		if a.hostRDMA {
			b := a.host.Bytes()[off : off+size]
			if _, err := a.transport.RegisterMemory(b); err != nil {
				// Its blocks move over QUIC: readers find no registered region.
				a.log.Warn("RDMA registration of a block set's memory failed: its blocks move over QUIC",
					"set", es.set.ID(), "rank", r, "bytes", size, "err", err)
			} else {
				mem[r].rdma = b
			}
		}
	}
	if err := a.memoryHook(true, mem); err != nil {
		undo()
		return err
	}
	a.memMu.Lock()
	for r, m := range mem {
		a.memTokens[tokenKey(m.token)] = memoryRef{es: es, rank: r}
	}
	a.memMu.Unlock()
	es.mem = mem
	es.renewMem = func() error { return a.renewSetMemory(es) }
	return nil
}

// renewSetMemory gives each rank's memory of es a new token and, for a
// named file, a new name, as es passes to another process: the old ones
// no longer map it. es.mu is held.
func (a *Agent) renewSetMemory(es *engineSet) error {
	a.memMu.Lock()
	defer a.memMu.Unlock()
	var errs []error
	for r, m := range es.mem {
		delete(a.memTokens, tokenKey(m.token))
		m.token = newMemoryToken()
		a.memTokens[tokenKey(m.token)] = memoryRef{es: es, rank: r}
		if err := m.sec.Rename(fmt.Sprintf("kvfabric-set%d-rank%d", es.set.ID(), r)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		a.log.Warn("a block set's memory files could not be renamed as it passes to another engine: it is not reused", "set", es.set.ID(), "err", err)
		return err
	}
	return nil
}

// dropSetMemoryLocked forgets a freed set's tokens and closes its sections
// and the pidfds of the processes it was handed to. es.mu is held.
func (a *Agent) dropSetMemoryLocked(es *engineSet) {
	a.memMu.Lock()
	for _, m := range es.mem {
		delete(a.memTokens, tokenKey(m.token))
	}
	a.memMu.Unlock()
	for _, m := range es.mem {
		a.unregister(m)
		m.sec.Close()
	}
	for pid, fd := range es.receivers {
		if fd >= 0 {
			unix.Close(fd)
		}
		delete(es.receivers, pid)
	}
}

// unregister ends m's RDMA and CUDA registrations, if it has them. The
// set is freed: no lease and no import reads it.
func (a *Agent) unregister(m *setMemory) {
	if m.pinned {
		if err := a.pinned.Unpin(m.sec.Offset()); err != nil {
			a.log.Error("CUDA registration of a freed block set's memory not ended", "bytes", m.sec.Size(), "err", err)
		}
		m.pinned = false
	}
	if m.rdma == nil {
		return
	}
	if err := a.transport.DeregisterMemory(m.rdma); err != nil {
		a.log.Error("RDMA registration of a freed block set's memory not ended", "bytes", len(m.rdma), "err", err)
	}
	m.rdma = nil
}

// memoryFor answers a token of the descriptor socket: a duplicate of the
// rank's descriptor (the caller closes it) and its size, recording pid as
// a process the set was handed to. The token alone is not enough: pid
// must be one of those processes, or may take the set up (no other is
// running: mayJoin), so that a process that learned a token from another
// (its logs, its plans) cannot map memory a running engine writes.
func (a *Agent) memoryFor(token string, pid int32) (fd int, size uint64, ok bool) {
	a.memMu.Lock()
	ref, found := a.memTokens[tokenKey(token)]
	a.memMu.Unlock()
	if !found {
		return -1, 0, false
	}
	es := ref.es
	// The check (which renews the set's names where it passes on to pid),
	// the token looked up again, and pid's record as a receiver in one
	// hold of es.mu: a process whose token the check made stale is
	// refused and not recorded, and keeps no one off the set.
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed || !es.callLocked(pid, false) {
		return -1, 0, false
	}
	a.memMu.Lock()
	if a.memTokens[tokenKey(token)] == ref {
		// Duplicated under the lock that dropSetMemory takes before it
		// closes the section: the number cannot be another file's.
		m := es.mem[ref.rank]
		var err error
		fd, err = unix.FcntlInt(uintptr(m.sec.FD()), unix.F_DUPFD_CLOEXEC, 0)
		found = err == nil
		size = m.sec.Size()
	} else {
		found = false
	}
	a.memMu.Unlock()
	if !found {
		return -1, 0, false
	}
	if _, had := es.receivers[pid]; pid > 0 && !had {
		es.receiveLocked(pid)
	}
	return fd, size, true
}

// callerPID is the process at the other end of an engine call, 0 where
// the platform does not say.
func callerPID(ctx context.Context) int32 {
	if p, ok := peer.FromContext(ctx); ok {
		if c, ok := p.AuthInfo.(peerCred); ok {
			return c.pid
		}
	}
	return 0
}

// handedTo records that process pid may map es's memory from now on. A
// receiver recorded under pid whose pidfd says it has exited is another
// process, whose pid this one got since: it is forgotten (forgetLocked)
// and pid recorded anew, so that its exit is not taken for this one's.
func (a *Agent) handedTo(es *engineSet, pid int32) {
	if pid <= 0 {
		return
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	if es.freed {
		return
	}
	if fd, ok := es.receivers[pid]; ok {
		if processAlive(pid, fd) {
			return
		}
		es.forgetLocked(pid, fd) // another process had this pid
	}
	es.receiveLocked(pid)
}

// receiveLocked records pid, a process that is not recorded yet, as one
// es's memory was handed to. es.mu is held.
func (es *engineSet) receiveLocked(pid int32) {
	if es.receivers == nil {
		es.receivers = map[int32]int{}
	}
	// The pidfd is what tells, later, that this process (and not another
	// that got its pid since) has exited.
	fd, err := unix.PidfdOpen(int(pid), 0)
	if err != nil {
		fd = -1
	}
	es.receivers[pid] = fd
}

// mayJoin says whether a session of process pid may use es: every other
// process es's memory was handed to has exited. Processes found gone are
// forgotten, and es zeroes the slots it allocates from then on; one
// recorded under pid itself is another process where its pidfd says it
// has exited (pid reused since), and is forgotten so too. Where es so
// passes to pid, a process it was not handed to (none of its receivers
// runs), es gets a new join token (renewJoinToken); a receiver that runs
// keeps its set's token when another has exited. es.mu is not held.
func (es *engineSet) mayJoin(pid int32) bool {
	if pid <= 0 {
		return true
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.mayJoinLocked(pid)
}

// mayJoinLocked is mayJoin with es.mu held and pid known (above 0).
func (es *engineSet) mayJoinLocked(pid int32) bool {
	forgot, callerLive := false, false
	for p, fd := range es.receivers {
		if processAlive(p, fd) {
			if p == pid {
				callerLive = true // the caller itself
				continue
			}
			return false
		}
		es.forgetLocked(p, fd)
		forgot = true
	}
	if (forgot || es.renewOwed) && !callerLive {
		es.renewJoinToken()
		if es.renewMem != nil {
			// A set whose memory names could not be renewed does not
			// pass on: the next engine gets a set of its own.
			if es.renewOwed = es.renewMem() != nil; es.renewOwed {
				return false
			}
		}
	}
	return true
}

// renewJoinToken gives es a new join token as it passes to a process
// other than those it was handed to, all of which have exited: whoever
// learned the old token from them (their plans, their logs) cannot join
// the new owner's set. es.mu is held.
func (es *engineSet) renewJoinToken() {
	es.joinToken = newJoinToken()
}

// mayCall says whether a call of process pid may name es: pid is one of
// the processes es's memory was handed to, or may join it (mayJoin). One
// of them asks nothing of the others: another that has exited does not
// make es zero its slots for a process that had them all along. A
// receiver recorded under pid that has exited (its pidfd) is not the
// caller but a process whose pid the caller got since: the caller is
// asked as any other (mayJoin), which forgets that receiver, so that es
// zeroes its slots and gets a new join token as it passes on.
func (es *engineSet) mayCall(pid int32) bool { return es.call(pid, false) }

// joinByCall is mayCall for a call whose session has just taken es up
// (setFor): a process that may join es is recorded as a receiver in the
// same hold of es.mu, as a Register's process is (handedTo), so that no
// other process's Register is handed es while this one uses it (it may
// write es's memory through a mapping it got otherwise: inherited, or
// from the receiver that exited), and its later calls are a receiver's.
func (es *engineSet) joinByCall(pid int32) bool { return es.call(pid, true) }

// call is mayCall, and joinByCall where record is set. A caller of pid 0
// may call, and is recorded as no receiver, as by handedTo.
func (es *engineSet) call(pid int32, record bool) bool {
	if pid <= 0 {
		return true
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.callLocked(pid, record)
}

// callLocked is call with es.mu held: a Register's attach
// (attachJoining) checks and records its process so, in the hold of es.mu
// in which it makes es one of its session's sets.
func (es *engineSet) callLocked(pid int32, record bool) bool {
	if pid <= 0 {
		return true
	}
	fd, handed := es.receivers[pid]
	handed = handed && processAlive(pid, fd)
	if handed || !es.mayJoinLocked(pid) {
		return handed
	}
	if record && !es.freed {
		es.receiveLocked(pid)
	}
	return true
}

// forgetLocked forgets receiver pid, found exited (its pidfd fd, -1 for
// none): es zeroes the slots it allocates from then on. es.mu is held.
func (es *engineSet) forgetLocked(pid int32, fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
	delete(es.receivers, pid)
	es.zeroFresh = true
}

// processAlive says whether process pid (its pidfd, or -1 where none could
// be opened) has not exited.
func processAlive(pid int32, pidfd int) bool {
	if pidfd >= 0 {
		// A pidfd polls readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n == 0
	}
	return unix.Kill(int(pid), 0) != unix.ESRCH
}

// zeroSlots clears slots, padding included, in every rank: slots of a set
// taken over from an engine that has exited reach the next one zeroed.
func zeroSlots(set *pool.BlockSet, slots []pool.Block) {
	l := set.Layout()
	block := l.Strides().Block
	layers := l.Model.Layers
	if l.Arrangement == layout.FullyContiguous {
		layers = 1 // a slot's shard is one extent
	}
	for r := range l.TPSize {
		mem, err := set.RankBytes(r)
		if err != nil {
			return // device memory: not handed out by this path
		}
		for _, b := range slots {
			for layer := range layers {
				off := l.ChunkOffset(b.Slot, layer, 0)
				clear(mem[off : off+block])
			}
		}
	}
}
