package fabric

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
)

// The session count takes sessions up to each bound and refuses one past,
// per process and in all, naming the bound; sessions of an unknown
// process (pid 0) count only in all; what is given back can be taken
// again.
func TestSessionCount(t *testing.T) {
	c := newSessionCount(5, 2)
	steps := []struct {
		desc   string
		pid    int32
		refuse string // "" to take it, else what the refusal says
	}{
		{"process 7's first", 7, ""},
		{"process 7's second, at its bound", 7, ""},
		{"process 7's third, past its bound", 7, "process 7 has 2 open, at most 2 (engine_sessions_per_process)"},
		{"an unknown process's first", 0, ""},
		{"an unknown process's second, at a process's bound", 0, ""},
		{"an unknown process's third, past a process's bound", 0, ""},
		{"process 8's first, past the total", 8, "5 open in all, at most 5 (engine_sessions)"},
		{"an unknown process's fourth, past the total", 0, "5 open in all, at most 5 (engine_sessions)"},
	}
	for _, s := range steps {
		err := c.take(s.pid)
		switch {
		case s.refuse == "" && err != nil:
			t.Fatalf("%s: %v", s.desc, err)
		case s.refuse == "":
		case status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), s.refuse):
			t.Fatalf("%s: %v, want ResourceExhausted saying %q", s.desc, err, s.refuse)
		}
	}
	if open, byProcess, total := c.snapshot(); open != 5 || byProcess != 1 || total != 2 {
		t.Fatalf("open %d, refused %d per process and %d in all; want 5, 1 and 2", open, byProcess, total)
	}
	c.give(0)
	if err := c.take(8); err != nil {
		t.Fatalf("after an unknown process's session ended: %v", err)
	}
	c.give(7)
	if err := c.take(7); err != nil {
		t.Fatalf("after one of process 7's sessions ended: %v", err)
	}
	for _, pid := range []int32{7, 7, 8, 0, 0} {
		c.give(pid)
	}
	if open, _, _ := c.snapshot(); open != 0 || len(c.byPID) != 0 {
		t.Fatalf("all given back: %d open, by process %v", open, c.byPID)
	}
}

// refusedStream is a session stream of process pid that the agent refuses
// before it reads anything: only its context is asked for.
type refusedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s refusedStream) Context() context.Context        { return s.ctx }
func (refusedStream) Send(*fabricpb.SessionEvent) error { panic("a refused stream is sent nothing") }
func (refusedStream) Recv() (*fabricpb.SessionRequest, error) {
	panic("a refused stream is read nothing")
}

// Refused session streams are logged spaced, not each: a flood of them,
// each of a process of its own (so that no two lines are alike, and the
// log's folding of repeats does not apply), logs one line while every
// refusal is counted.
func TestRefusedSessionsLoggedSpaced(t *testing.T) {
	var logs lockedLog
	log := slog.New(newRepeatFolder(slog.NewTextHandler(&logs, nil), time.Now, afterFunc))
	a := &Agent{log: log, sessCount: newSessionCount(1, 1)}
	if err := a.sessCount.take(1); err != nil { // the total, taken
		t.Fatal(err)
	}
	const refused = 50
	for pid := int32(2); pid < 2+refused; pid++ {
		ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: peerCred{pid: pid}})
		if err := (&engineServer{a: a}).OpenSession(refusedStream{ctx: ctx}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("process %d's session past the total: %v, want ResourceExhausted", pid, err)
		}
	}
	if lines := logs.lines("engine session refused"); lines != 1 {
		t.Fatalf("%d refusals in a row logged %d lines, want 1", refused, lines)
	}
	if _, _, total := a.sessCount.snapshot(); total != refused {
		t.Fatalf("refusals counted %d, want %d", total, refused)
	}
}
