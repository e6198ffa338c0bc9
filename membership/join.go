package membership

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"
)

// JoinReason says why joining a seed failed, as far as memberlist tells.
type JoinReason uint8

// Join failure reasons.
const (
	// JoinUnreachable: no connection to the seed (nothing listens there, a
	// firewall, a wrong address or a name that does not resolve).
	JoinUnreachable JoinReason = iota + 1
	// JoinWrongKey: the seed and this node encrypt gossip differently
	// (another key, or encryption on one side only).
	JoinWrongKey
	// JoinNoAnswer: the seed took the connection and closed it without an
	// answer, which is what a memberlist of another cluster name does; the
	// seed's log names the reason.
	JoinNoAnswer
	// JoinOther: anything else; the error says what.
	JoinOther
	numJoinReasons
)

func (r JoinReason) String() string {
	switch r {
	case JoinUnreachable:
		return "unreachable"
	case JoinWrongKey:
		return "wrong_key"
	case JoinNoAnswer:
		return "no_answer"
	case JoinOther:
		return "other"
	}
	return fmt.Sprintf("JoinReason(%d)", uint8(r))
}

// explain is what an operator should check for r.
func (r JoinReason) explain() string {
	switch r {
	case JoinUnreachable:
		return "seed unreachable (is an agent running there, is the address right, is TCP open?)"
	case JoinWrongKey:
		return "gossip key differs from the seed's (or only one side encrypts)"
	case JoinNoAnswer:
		return "seed closed the connection without answering: most likely a different cluster name (the seed's log says)"
	}
	return "join failed"
}

// JoinError is a failed join of one seed.
type JoinError struct {
	Seed   string
	Reason JoinReason
	Err    error // memberlist's error
}

func (e *JoinError) Error() string {
	return fmt.Sprintf("membership: join %s: %s: %v", e.Seed, e.Reason.explain(), e.Err)
}

func (e *JoinError) Unwrap() error { return e.Err }

// classifyJoin names the reason of a memberlist join error. memberlist
// flattens its errors into text, so the text is all there is to go by.
func classifyJoin(seed string, err error) *JoinError {
	// memberlist wraps one seed's error in a list ("1 error occurred: ...");
	// keep the error itself.
	if w, ok := err.(interface{ WrappedErrors() []error }); ok && len(w.WrappedErrors()) == 1 {
		err = w.WrappedErrors()[0]
	}
	s := err.Error()
	r := JoinOther
	switch {
	case strings.Contains(s, "could decrypt"), strings.Contains(s, "encryption is not configured"),
		strings.Contains(s, "remote state is not encrypted"), strings.Contains(s, "message authentication failed"):
		r = JoinWrongKey
	case strings.Contains(s, "dial tcp"), strings.Contains(s, "failed to resolve"),
		strings.Contains(s, "no route to host"), strings.Contains(s, "network is unreachable"):
		r = JoinUnreachable
	case strings.HasSuffix(s, "EOF"), strings.Contains(s, "connection reset by peer"),
		strings.Contains(s, "broken pipe"), strings.Contains(s, "i/o timeout"):
		r = JoinNoAnswer
	}
	return &JoinError{Seed: seed, Reason: r, Err: err}
}

// Joined reports whether the node has joined the cluster: once a seed
// answered, or another node joined it, or when it has no seeds (it starts
// a cluster). It stays true from then on. lastErr is the latest failed
// join since a seed last answered (or every seed was found a member), nil
// if none failed since.
func (m *Membership) Joined() (joined bool, lastErr error) {
	m.joinMu.Lock()
	defer m.joinMu.Unlock()
	if m.lastJoinErr != nil {
		lastErr = m.lastJoinErr
	}
	return m.joined.Load() || len(m.cfg.Seeds) == 0, lastErr
}

// markJoined records a join that worked: the node is joined, and earlier
// failures are history.
func (m *Membership) markJoined() {
	m.joinMu.Lock()
	m.lastJoinErr = nil
	m.joinMu.Unlock()
	if !m.joined.Swap(true) && len(m.cfg.Seeds) > 0 {
		m.log.Info("membership: joined the cluster", "members", m.numMembers())
	}
}

// rejoin joins the seeds that are not alive members, and reports whether
// none of them could be joined. memberlist forgets a dead node's address
// after a while and never calls it again, so without the periodic rejoin
// the two sides of a healed partition would stay apart. Each failure is
// logged, as a warning while the node is alone.
func (m *Membership) rejoin() (failed bool) {
	// Our own copies (Members): memberlist's records change under its
	// lock while we read.
	members := m.Members()
	present := map[string]bool{}
	for _, mb := range members {
		present[mb.Addr.String()] = true
	}
	var missing []string
	for _, s := range m.cfg.Seeds {
		if ap, err := netip.ParseAddrPort(s); err == nil {
			s = ap.String()
		}
		if !present[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		m.markJoined()
		return false
	}
	alone := len(members) <= 1
	failed = true
	for _, s := range missing {
		m.metrics.joinAttempts.Add(1)
		n, err := m.ml.Join([]string{s})
		if err == nil && n > 0 {
			failed = false
			m.markJoined()
			continue
		}
		if err == nil {
			err = fmt.Errorf("no node answered")
		}
		je := classifyJoin(s, err)
		m.metrics.joinFailures.Add(1)
		m.metrics.joinFailuresBy[je.Reason].Add(1)
		m.joinMu.Lock()
		m.lastJoinErr = je
		m.joinMu.Unlock()
		if alone {
			m.log.Warn("membership: cannot join seed; retrying", "seed", s, "reason", je.Reason, "why", je.Reason.explain(), "err", je.Err)
		} else {
			m.log.Debug("membership: rejoining seed failed; will retry", "seed", s, "reason", je.Reason, "err", je.Err)
		}
	}
	return failed
}

// joinBackoff is the first wait before retrying seeds that all failed:
// an eighth of RejoinInterval (at least 50 ms). It doubles with each round
// that fails, up to RejoinInterval.
func (m *Membership) joinBackoff() time.Duration {
	return min(m.cfg.RejoinInterval, max(m.cfg.RejoinInterval/8, 50*time.Millisecond))
}

// joinLoop rejoins seeds: after a round where none answered, with a
// backoff from joinBackoff doubling to RejoinInterval, otherwise
// every RejoinInterval; each wait jittered by ±20 % so that nodes started
// together do not knock at the same instant.
func (m *Membership) joinLoop(ctx context.Context, failed bool) {
	defer m.wg.Done()
	backoff := m.joinBackoff()
	for {
		wait := m.cfg.RejoinInterval
		if failed {
			wait = backoff
			backoff = min(2*backoff, m.cfg.RejoinInterval)
		} else {
			backoff = m.joinBackoff()
		}
		nominal := wait
		wait = wait*4/5 + rand.N(wait*2/5+1)
		m.log.Debug("membership: next join round", "after_failure", failed, "nominal", nominal, "wait", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		failed = m.rejoin()
	}
}
