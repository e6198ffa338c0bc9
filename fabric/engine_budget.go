package fabric

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Bounds on the memory of engine requests being served. A request's cost
// is its encoded size times engineRequestCost, for the decoded request and
// what serving it makes from it (hashes, matches, the answer).
const (
	// MaxEngineMessage is the largest message the engine socket takes.
	MaxEngineMessage = 64 << 20
	// DefaultEngineRequestMemory is Config.EngineRequestMemory's default:
	// four of the largest requests at once.
	DefaultEngineRequestMemory = 4 * engineRequestCost * MaxEngineMessage
	// DefaultEngineSessionRequestMemory is
	// Config.EngineSessionRequestMemory's default: two of the largest.
	DefaultEngineSessionRequestMemory = 2 * engineRequestCost * MaxEngineMessage
	// MinEngineRequestMemory is the least EngineRequestMemory and
	// EngineSessionRequestMemory: the cost of one of the largest requests
	// (128 MiB), which a smaller bound would refuse every time, however
	// idle the agent; at 1 byte every request was refused.
	MinEngineRequestMemory = engineRequestCost * MaxEngineMessage
	// MinEngineQuota is the least EngineQuota: the smallest pool
	// (MinPoolBytes, 1 MiB). Below it a quota is a unit left out, and
	// every Register was refused.
	MinEngineQuota = MinPoolBytes

	engineRequestCost = 2
)

// requestBudget counts the bytes of requests in flight, in total and per
// session, and refuses what would pass either bound instead of waiting:
// a request waiting would hold its memory all the same.
type requestBudget struct {
	total, perSession int64

	mu        sync.Mutex
	used      int64
	bySession map[uint64]int64
	refused   uint64
}

func newRequestBudget(total, perSession int64) *requestBudget {
	return &requestBudget{total: total, perSession: perSession, bySession: map[uint64]int64{}}
}

// take reserves n bytes for session, or says why not.
func (b *requestBudget) take(session uint64, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.bySession[session]
	switch {
	case s+n > b.perSession:
		b.refused++
		return status.Errorf(codes.ResourceExhausted, "engine requests in flight: this one needs %d bytes, the session has %d of %d in flight; wait for them or send smaller requests", n, s, b.perSession)
	case b.used+n > b.total:
		b.refused++
		return status.Errorf(codes.ResourceExhausted, "engine requests in flight: this one needs %d bytes, engines have %d of %d in flight; try again shortly", n, b.used, b.total)
	}
	b.used += n
	b.bySession[session] = s + n
	return nil
}

func (b *requestBudget) give(session uint64, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if b.bySession[session] -= n; b.bySession[session] <= 0 {
		delete(b.bySession, session)
	}
}

// snapshot returns the bytes in flight and the requests refused so far.
func (b *requestBudget) snapshot() (used int64, refused uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.refused
}

// budgetInterceptor charges each unary engine call's request to the budget
// for as long as it is served. The session is read from the metadata
// only (a bad id is the handler's to refuse).
func (a *Agent) budgetInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return handler(ctx, req)
	}
	var session uint64
	if s, err := a.sessionOf(ctx); err == nil {
		session = s.id
	}
	n := int64(proto.Size(m)) * engineRequestCost
	if err := a.reqBudget.take(session, n); err != nil {
		a.log.Warn("engine request refused: too much in flight", "method", info.FullMethod, "session", session, "bytes", n, "err", err)
		return nil, err
	}
	defer a.reqBudget.give(session, n)
	return handler(ctx, req)
}

// populateEngineLimits fills the defaults of the bounds on engine requests
// and sessions.
func (c *Config) populateEngineLimits() {
	if c.EngineRequestMemory == 0 {
		c.EngineRequestMemory = DefaultEngineRequestMemory
	}
	if c.EngineSessionRequestMemory == 0 {
		c.EngineSessionRequestMemory = min(DefaultEngineSessionRequestMemory, c.EngineRequestMemory)
	}
	if c.EngineSessions == 0 {
		c.EngineSessions = DefaultEngineSessions
	}
	if c.EngineSessionsPerProcess == 0 {
		c.EngineSessionsPerProcess = min(DefaultEngineSessionsPerProcess, c.EngineSessions)
	}
}

func (c *Config) validateEngineLimits() error {
	switch {
	case c.EngineRequestMemory < 0:
		return badSetting("engine_request_memory", "%d is negative", c.EngineRequestMemory)
	case c.EngineRequestMemory < MinEngineRequestMemory:
		return badSetting("engine_request_memory", "%d is below %d (128MiB), the cost of the largest engine request, which it would refuse every time; is a unit missing? (e.g. 512MiB)",
			c.EngineRequestMemory, MinEngineRequestMemory)
	case c.EngineQuota < 0:
		return badSetting("engine_quota", "%d is negative", c.EngineQuota)
	case c.EngineQuota > 0 && c.EngineQuota < MinEngineQuota:
		return badSetting("engine_quota", "%d is below the smallest pool, %d bytes (1MiB); is a unit missing? (e.g. 16GiB)", c.EngineQuota, MinEngineQuota)
	case c.EngineSessionRequestMemory >= 0 && c.EngineSessionRequestMemory < MinEngineRequestMemory:
		return badSetting("engine_session_request_memory", "%d is below %d (128MiB), the cost of the largest engine request, which it would refuse every time; is a unit missing? (e.g. 256MiB)",
			c.EngineSessionRequestMemory, MinEngineRequestMemory)
	case c.EngineSessionRequestMemory < 0 || c.EngineSessionRequestMemory > c.EngineRequestMemory:
		return badSetting("engine_session_request_memory", "%d is not in %d..engine_request_memory (%d)", c.EngineSessionRequestMemory, MinEngineRequestMemory, c.EngineRequestMemory)
	case c.EngineSessions < 0 || c.EngineSessions > MaxEngineSessions:
		return badSetting("engine_sessions", "%d is not in 1..%d (0: %d)", c.EngineSessions, MaxEngineSessions, DefaultEngineSessions)
	case c.EngineSessionsPerProcess < 0 || c.EngineSessionsPerProcess > c.EngineSessions:
		return badSetting("engine_sessions_per_process", "%d is not in 1..engine_sessions (%d)", c.EngineSessionsPerProcess, c.EngineSessions)
	}
	return nil
}
