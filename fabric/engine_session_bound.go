package fabric

import (
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Bounds on the engine sessions open at once. A session is cheap (its
// stream, two goroutines, what it holds in its block sets), but nothing
// else bounds how many one process opens: each stays until its stream
// ends. An engine opens one per process: vLLM at TP 8 is 9 processes (the
// scheduler and a worker per GPU), SGLang the same, so the defaults leave
// room for a hundred such engines on one node and for a process that
// opens a few sessions, not for one that opens them without end.
const (
	// DefaultEngineSessions is Config.EngineSessions's default.
	DefaultEngineSessions = 1024
	// DefaultEngineSessionsPerProcess is
	// Config.EngineSessionsPerProcess's default.
	DefaultEngineSessionsPerProcess = 64
	// MaxEngineSessions bounds Config.EngineSessions.
	MaxEngineSessions = 1 << 16
)

// sessionCount counts the session streams being served (OpenSession), in
// all and by process, and refuses one past either bound at once. A
// stream counts from its start, before its first SessionRequest: one
// that never sends it holds its place until the keepalive bound ends it.
// Streams of an unknown process (pid 0) count only in all: they may be
// many processes, which the agent cannot tell apart.
type sessionCount struct {
	total, perProcess int

	mu    sync.Mutex
	open  int
	byPID map[int32]int
	// refusedProcess and refusedTotal count the streams refused past the
	// per-process bound and past the total.
	refusedProcess, refusedTotal uint64
	// refusedLog spaces the log lines of refusals (OpenSession): at most
	// one per sessionRefusedLogEvery, those not logged counted in the
	// next; kvfabric_engine_sessions_refused_total counts every one.
	refusedLog logSpacing
}

// sessionRefusedLogEvery is how often, at most, a refused session stream
// is logged.
const sessionRefusedLogEvery = 10 * time.Second

func newSessionCount(total, perProcess int) *sessionCount {
	return &sessionCount{total: total, perProcess: perProcess, byPID: map[int32]int{}}
}

// take counts a session stream of process pid, or says why not.
func (c *sessionCount) take(pid int32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.byPID[pid]
	switch {
	case pid > 0 && n >= c.perProcess:
		c.refusedProcess++
		return status.Errorf(codes.ResourceExhausted, "engine sessions: process %d has %d open, at most %d (engine_sessions_per_process); end one before opening another", pid, n, c.perProcess)
	case c.open >= c.total:
		c.refusedTotal++
		return status.Errorf(codes.ResourceExhausted, "engine sessions: %d open in all, at most %d (engine_sessions); try again once one ends", c.open, c.total)
	}
	c.open++
	c.byPID[pid] = n + 1 // pid 0's too, though no bound looks at it
	return nil
}

// give uncounts a session stream of process pid that take counted.
func (c *sessionCount) give(pid int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.open--
	if c.byPID[pid]--; c.byPID[pid] <= 0 {
		delete(c.byPID, pid)
	}
}

// snapshot returns the session streams open and those refused so far,
// past the per-process bound and past the total.
func (c *sessionCount) snapshot() (open int, refusedProcess, refusedTotal uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open, c.refusedProcess, c.refusedTotal
}
