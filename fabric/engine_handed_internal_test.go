package fabric

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/pool"
)

// closeReceivers closes the pidfds the agent's sets hold for the processes
// their memory was handed to.
func closeReceivers(a *Agent) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, es := range a.sets {
		es.mu.Lock()
		for pid, fd := range es.receivers {
			if fd >= 0 {
				unix.Close(fd)
			}
			delete(es.receivers, pid)
		}
		es.mu.Unlock()
	}
}

// receives says whether pid is recorded as a process es's memory was
// handed to.
func receives(es *engineSet, pid int32) bool {
	es.mu.Lock()
	defer es.mu.Unlock()
	_, ok := es.receivers[pid]
	return ok
}

// A Register records its process as the receiver of the set it is given
// before it lets go of the agent's lock, not once it has answered: a
// Register of another live process right after it (here, in the window
// where the engine API recorded the receiver only after the choice) does
// not join that set, whether it was made for the first Register or taken
// up by it from the layout's idle sets.
func TestRegisterRecordsItsProcessBeforeAnotherJoins(t *testing.T) {
	for _, idle := range []bool{false, true} {
		name := "a new set"
		if idle {
			name = "an idle set taken up"
		}
		t.Run(name, func(t *testing.T) {
			var a *Agent
			var sets []*engineSet
			if idle {
				a, sets = quotaAgent(t, quotaSet{"e", 1, false})
			} else {
				a, _ = quotaAgent(t)
			}
			t.Cleanup(func() { closeReceivers(a) })
			a.cfg.BlockSetSlots = 1 << 10
			// Two live processes: the test's own and its parent.
			p1, p2 := int32(os.Getpid()), int32(os.Getppid())
			s1 := &session{id: 1, engine: "e", sets: map[pool.SetID]*engineSet{}}
			s2 := &session{id: 2, engine: "e", sets: map[pool.SetID]*engineSet{}}
			first, err := a.blockSetForSession(s1, "e", belowLayout(0), nil, p1)
			if err != nil {
				t.Fatal(err)
			}
			if idle && first.engineSet != sets[0] {
				t.Fatalf("first Register given set %d, want the idle set %d", first.set.ID(), sets[0].set.ID())
			}
			if !receives(first.engineSet, p1) {
				t.Errorf("set %d chosen for process %d without it recorded as its receiver", first.set.ID(), p1)
			}
			second, err := a.blockSetForSession(s2, "e", belowLayout(0), nil, p2)
			if err != nil {
				t.Fatal(err)
			}
			if second.engineSet == first.engineSet {
				t.Fatalf("process %d given set %d, handed to live process %d: both would map it", p2, first.set.ID(), p1)
			}
			if receives(second.engineSet, p1) || !receives(second.engineSet, p2) {
				t.Errorf("set %d's receivers %v, want process %d only", second.set.ID(), second.receivers, p2)
			}
		})
	}
}

// A process recorded as a set's receiver keeps other processes off the
// set only while it lives: once it has exited (its session ended), the
// next Register of another process takes the set up, its slots zeroed
// as they are handed out.
func TestSetOfAnExitedReceiverJoinedAgain(t *testing.T) {
	cat, err := exec.LookPath("cat")
	if err != nil {
		t.Skip("no cat to stand for an engine process")
	}
	a, _ := quotaAgent(t)
	t.Cleanup(func() { closeReceivers(a) })
	a.cfg.BlockSetSlots = 1 << 10
	a.cfg.BlockSetGrace = time.Hour
	// The first engine: a child that lives until its input ends.
	cmd := exec.Command(cat)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := false
	t.Cleanup(func() {
		if !exited {
			in.Close()
			cmd.Wait()
		}
	})
	p1, p2, p3 := int32(cmd.Process.Pid), int32(os.Getppid()), int32(os.Getpid())
	s1 := &session{id: 1, engine: "e", sets: map[pool.SetID]*engineSet{}}
	first, err := a.blockSetForSession(s1, "e", belowLayout(0), nil, p1)
	if err != nil {
		t.Fatal(err)
	}
	s2 := &session{id: 2, engine: "e", sets: map[pool.SetID]*engineSet{}}
	second, err := a.blockSetForSession(s2, "e", belowLayout(0), nil, p2)
	if err != nil {
		t.Fatal(err)
	}
	if second.engineSet == first.engineSet {
		t.Fatalf("process %d given set %d while its receiver %d lives", p2, first.set.ID(), p1)
	}
	in.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the first engine's process: %v", err)
	}
	exited = true
	a.endSession(s1, "its process exited")
	s3 := &session{id: 3, engine: "e", sets: map[pool.SetID]*engineSet{}}
	third, err := a.blockSetForSession(s3, "e", belowLayout(0), nil, p3)
	if err != nil {
		t.Fatal(err)
	}
	if third.engineSet != first.engineSet {
		t.Fatalf("process %d given set %d, want set %d, whose receiver %d has exited", p3, third.set.ID(), first.set.ID(), p1)
	}
	first.mu.Lock()
	zero := first.zeroFresh
	first.mu.Unlock()
	if !zero {
		t.Error("the set taken up from an exited process does not zero the slots it hands out")
	}
	if receives(first.engineSet, p1) {
		t.Errorf("exited process %d still recorded as set %d's receiver", p1, first.set.ID())
	}
}

// exitedFD starts a child that exits at once and returns its pid and a
// pidfd of it, opened before the child was waited for (skipping where
// pidfds are not to be had).
func exitedFD(t *testing.T) (int32, int) {
	t.Helper()
	child := exec.Command("true")
	if err := child.Start(); err != nil {
		t.Skip(err)
	}
	fd, err := unix.PidfdOpen(child.Process.Pid, 0)
	if err != nil {
		child.Wait()
		t.Skipf("pidfd_open: %v", err)
	}
	if err := child.Wait(); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	return int32(child.Process.Pid), fd
}

// closeAtEnd closes the pidfds es still holds for its receivers when t
// ends.
func closeAtEnd(t *testing.T, es *engineSet) {
	t.Cleanup(func() {
		for _, fd := range es.receivers {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	})
}

// A call of a process a set was handed to is let through as it is, and
// leaves the set's other receivers alone: another that has exited does
// not make the set zero the slots it allocates (the caller had them all
// along), as it does for a process that takes the set over.
func TestCallOfAReceiverZeroesNothing(t *testing.T) {
	self := int32(os.Getpid())
	gone, fd := exitedFD(t)
	es := &engineSet{receivers: map[int32]int{self: -1, gone: fd}}
	closeAtEnd(t, es)
	if !es.mayCall(self) {
		t.Fatal("a receiver's call refused")
	}
	if es.zeroFresh || !receives(es, gone) {
		t.Fatalf("a receiver's call: zeroFresh %v, the exited receiver recorded %v; want the set as it was", es.zeroFresh, receives(es, gone))
	}
	// A process it was not handed to (here this one, no longer recorded)
	// takes the set over once the others have exited: zeroed from now.
	delete(es.receivers, self)
	if !es.mayCall(self) {
		t.Fatal("a call of a process after the set's others exited refused")
	}
	if !es.zeroFresh || receives(es, gone) {
		t.Fatalf("a takeover: zeroFresh %v, the exited receiver recorded %v; want zeroing, the receiver forgotten", es.zeroFresh, receives(es, gone))
	}
}

// A receiver recorded under the caller's pid whose pidfd says it has
// exited is another process, whose pid the caller got since: not the
// caller. mayCall and mayJoin forget it and zero the set's slots from then
// on, as for any process taking a set over, and the caller is refused
// where another receiver still runs.
func TestReceiverOfAReusedPidNotTheCaller(t *testing.T) {
	self := int32(os.Getpid())
	for _, tc := range []struct {
		desc string
		ask  func(es *engineSet, pid int32) bool
	}{
		{"mayCall", (*engineSet).mayCall},
		{"mayJoin", (*engineSet).mayJoin},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			_, fd := exitedFD(t)
			es := &engineSet{receivers: map[int32]int{self: fd}, joinToken: "old"}
			closeAtEnd(t, es)
			if !tc.ask(es, self) {
				t.Fatal("refused with no other receiver")
			}
			if !es.zeroFresh || receives(es, self) {
				t.Fatalf("zeroFresh %v, the exited receiver under this pid recorded %v; want zeroing, the receiver forgotten", es.zeroFresh, receives(es, self))
			}
			// The set passed from the exited receiver to this process: the
			// token that receiver handed on joins it no more.
			if es.joinToken == "old" || es.joinToken == "" {
				t.Fatalf("join token %q once the set passed on; want a new one", es.joinToken)
			}
		})
	}
	// This process is a receiver that runs, and another has exited: the
	// set does not pass on, and keeps the token its processes share.
	t.Run("liveCallerKeepsToken", func(t *testing.T) {
		selfFD, err := unix.PidfdOpen(int(self), 0)
		if err != nil {
			t.Skipf("pidfd_open: %v", err)
		}
		gone, goneFD := exitedFD(t)
		es := &engineSet{receivers: map[int32]int{self: selfFD, gone: goneFD}, joinToken: "old"}
		closeAtEnd(t, es)
		if !es.mayJoin(self) {
			t.Fatal("a receiver that runs refused; the set's other receiver has exited")
		}
		if es.joinToken != "old" || receives(es, gone) {
			t.Fatalf("join token %q, the exited receiver recorded %v; want the token kept, the receiver forgotten", es.joinToken, receives(es, gone))
		}
	})
	// Another receiver still runs: the caller, not the process it was
	// handed to under this pid, is refused.
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Skip(err)
	}
	t.Cleanup(func() { live.Process.Kill(); live.Wait() })
	fd, err := unix.PidfdOpen(live.Process.Pid, 0)
	if err != nil {
		t.Skipf("pidfd_open: %v", err)
	}
	_, goneFD := exitedFD(t)
	es := &engineSet{receivers: map[int32]int{self: goneFD, int32(live.Process.Pid): fd}}
	closeAtEnd(t, es)
	if es.mayCall(self) {
		t.Fatal("a call of this pid allowed while the set's other receiver runs; its receiver under this pid has exited")
	}
}

// A process handed a set's memory (the descriptor socket) under a pid
// whose recorded receiver has exited is recorded under its own pidfd, not
// the exited one's: the next process asking to join is refused while it
// runs, and the set zeroes its slots from then on.
func TestHandedToAReusedPidRecordsTheNewProcess(t *testing.T) {
	self := int32(os.Getpid())
	// The exited child's pidfd stands for the receiver that had this pid.
	_, fd := exitedFD(t)
	es := &engineSet{receivers: map[int32]int{self: fd}}
	closeAtEnd(t, es)
	(&Agent{}).handedTo(es, self)
	if !es.zeroFresh {
		t.Error("the set taken up from an exited receiver does not zero the slots it hands out")
	}
	if other := int32(os.Getppid()); es.mayJoin(other) {
		t.Fatalf("process %d may join the set while process %d, handed its memory, runs", other, self)
	}
	if !receives(es, self) {
		t.Fatalf("process %d, handed the set's memory, not recorded", self)
	}
}

// implicitSessionSet is an agent with one idle block set, not freed by
// its timer once dropped, and its implicit session (the one of
// sessionless calls), empty.
func implicitSessionSet(t *testing.T) (*Agent, *session, *engineSet) {
	t.Helper()
	a, sets := quotaAgent(t, quotaSet{"e", 1, false})
	t.Cleanup(func() { closeReceivers(a) })
	a.cfg.BlockSetGrace = time.Hour
	sess := &session{sets: map[pool.SetID]*engineSet{}}
	a.unowned = sess
	return a, sess, sets[0]
}

// A call naming a set by its id is asked again, once the set is attached,
// whether its process may use it: a Register of another process that
// took the set up between the call's check and its attach (here, the set
// handed to the test's parent, which runs) leaves the call refused
// (PERMISSION_DENIED) and the set not one of the call's session's.
func TestSetHandedToAnotherBetweenCheckAndAttach(t *testing.T) {
	a, sess, es := implicitSessionSet(t)
	other := int32(os.Getppid())
	handed := false
	a.cfg.hooks.beforeAttach = func(got *engineSet) {
		if got == es && !handed {
			handed = true
			a.handedTo(es, other) // another process's Register took it up
		}
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: peerCred{pid: int32(os.Getpid())}})
	_, err := (&engineServer{a: a}).setFor(ctx, uint64(es.set.ID()))
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a call naming set %d, handed to running process %d before its attach: %v, want PermissionDenied", es.set.ID(), other, err)
	}
	if !handed {
		t.Fatal("the hook did not run")
	}
	es.mu.Lock()
	users := len(es.users)
	es.mu.Unlock()
	sess.mu.Lock()
	_, used := sess.sets[es.set.ID()]
	sess.mu.Unlock()
	if users != 0 || used {
		t.Fatalf("after the refused call: the set's sessions %d, the call's session uses it %v; want neither", users, used)
	}
}

// A call under the implicit session, which every sessionless call of any
// process uses, is asked whether its process may use the set it names
// even where the session has the set already: another process's
// sessionless call that attached the set to that session, and recorded
// its process, between this call's check and its attach leaves this call
// refused (PERMISSION_DENIED), the other process's use kept.
func TestImplicitSessionSetTakenUpByAnotherProcessCall(t *testing.T) {
	a, sess, es := implicitSessionSet(t)
	other := int32(os.Getppid())
	taken := false
	a.cfg.hooks.beforeAttach = func(got *engineSet) {
		if got == es && !taken {
			taken = true
			// Another process's sessionless call, as setFor makes it.
			if _, err := a.attach(sess, es); err != nil {
				t.Error(err)
			}
			if !es.joinByCall(other) {
				t.Error("the other process's call may not take the idle set up")
			}
		}
	}
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: peerCred{pid: int32(os.Getpid())}})
	_, err := (&engineServer{a: a}).setFor(ctx, uint64(es.set.ID()))
	if !taken {
		t.Fatal("the hook did not run")
	}
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a sessionless call naming set %d, taken up meanwhile by running process %d's sessionless call: %v, want PermissionDenied", es.set.ID(), other, err)
	}
	if receives(es, int32(os.Getpid())) || !receives(es, other) {
		t.Errorf("set %d's receivers %v, want process %d only", es.set.ID(), es.receivers, other)
	}
	es.mu.Lock()
	_, used := es.users[sess.id]
	es.mu.Unlock()
	if !used {
		t.Error("the other process's use of the set was undone by the refused call")
	}
}

// A Register checks that its process may join the set it is given, and
// records it as a receiver, in one hold of the set's lock: a call of
// another process that took the set up after the Register chose it
// (here, between reusableSet and handOver: such a call holds no agent
// lock) keeps the set, the Register's session does not use it, and the
// Register chooses again: a new set where the pool has room, else (the
// set was its fallback, no room for one of the slots asked) the pool's
// refusal (the quota), never the other process's set.
func TestRegisterChecksAgainAsItRecords(t *testing.T) {
	for _, fallback := range []bool{false, true} {
		name := "reused"
		if fallback {
			name = "fallback"
		}
		t.Run(name, func(t *testing.T) {
			a, sets := quotaAgent(t, quotaSet{"e", 1, false})
			t.Cleanup(func() { closeReceivers(a) })
			a.cfg.BlockSetGrace = time.Hour
			a.cfg.BlockSetSlots = 1 << 10 // the idle set's count: it is reused
			if fallback {
				a.cfg.BlockSetSlots = 1 << 15 // past the pool: the idle set is the fallback
			}
			es := sets[0]
			self, other := int32(os.Getpid()), int32(os.Getppid())
			joined := false
			a.cfg.hooks.beforeHandOver = func(got *engineSet) {
				if got == es && !joined {
					joined = true
					if !es.joinByCall(other) { // another process's call takes it up
						t.Error("the other process's call may not take the idle set up")
					}
				}
			}
			sess := &session{id: 1, engine: "e", sets: map[pool.SetID]*engineSet{}}
			ss, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, self)
			if !joined {
				t.Fatal("the hook did not run")
			}
			if fallback {
				if err == nil {
					t.Fatalf("Register with no room and its fallback taken up by process %d: given set %d, want an error", other, ss.set.ID())
				}
				// The pool's refusal, chosen again: not the set taken up.
				if errors.Is(err, errJoinedMeanwhile) || status.Code(toStatus(err)) != codes.ResourceExhausted {
					t.Fatalf("Register with no room and its fallback taken up by process %d: %v, want the quota's refusal (ResourceExhausted)", other, err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if ss.engineSet == es {
					t.Fatalf("process %d given set %d, taken up by running process %d's call: both use it", self, es.set.ID(), other)
				}
				if !receives(ss.engineSet, self) {
					t.Errorf("process %d not recorded as the receiver of its new set %d", self, ss.set.ID())
				}
			}
			if receives(es, self) || !receives(es, other) {
				t.Errorf("set %d's receivers %v, want process %d only", es.set.ID(), es.receivers, other)
			}
			es.mu.Lock()
			users := len(es.users)
			es.mu.Unlock()
			sess.mu.Lock()
			_, used := sess.sets[es.set.ID()]
			sess.mu.Unlock()
			if users != 0 || used {
				t.Fatalf("set %d's sessions %d, the Register's session uses it %v; want neither", es.set.ID(), users, used)
			}
		})
	}
}

// A Register whose new set is taken up, as it is handed over, by a call
// of another process that named it by its id is answered ABORTED (register
// again), a status the engine can read, and the set that process's
// session uses is not made idle (its grace timer) under it.
func TestNewSetTakenUpAsItIsHandedOver(t *testing.T) {
	a, _ := quotaAgent(t)
	t.Cleanup(func() { closeReceivers(a) })
	a.cfg.BlockSetGrace = time.Hour
	a.cfg.BlockSetSlots = 1 << 10
	self, other := int32(os.Getpid()), int32(os.Getppid())
	otherSess := &session{id: 2, sets: map[pool.SetID]*engineSet{}}
	var taken *engineSet
	a.cfg.hooks.beforeHandOver = func(got *engineSet) {
		if taken == nil {
			taken = got
			// Another process's call, as setFor makes it.
			if _, err := a.attach(otherSess, got); err != nil {
				t.Error(err)
			}
			if !got.joinByCall(other) {
				t.Error("the other process's call may not take the new set up")
			}
		}
	}
	sess := &session{id: 1, engine: "e", sets: map[pool.SetID]*engineSet{}}
	_, err := a.blockSetForSession(sess, "e", belowLayout(0), nil, self)
	if taken == nil {
		t.Fatal("the hook did not run")
	}
	if status.Code(err) != codes.Aborted {
		t.Fatalf("Register whose new set %d was taken up by process %d's call: %v, want ABORTED", taken.set.ID(), other, err)
	}
	taken.mu.Lock()
	idle, users := !taken.idleSince.IsZero(), len(taken.users)
	taken.mu.Unlock()
	if idle || users != 1 {
		t.Errorf("new set %d, used by process %d's session: idle %v, sessions %d; want not idle, 1", taken.set.ID(), other, idle, users)
	}
}
