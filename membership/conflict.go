package membership

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrNameConflict is matched by *NameConflictError.
var ErrNameConflict = errors.New("membership: node name taken")

// NameConflictError says that another live member runs under this node's
// name and started first, so this node refuses to run: two nodes under one
// name would take each other's blocks in every index.
type NameConflictError struct {
	Name string
	// Other is the other member's gossip address.
	Other netip.AddrPort
	// OtherIncarnation is the other member's run, 0 if its metadata could
	// not be read.
	OtherIncarnation uint64
}

func (e *NameConflictError) Error() string {
	return fmt.Sprintf("membership: node name %q is taken by the live member at %s (run %d, started first): give this node another name",
		e.Name, e.Other, e.OtherIncarnation)
}

// Is makes errors.Is(err, ErrNameConflict) true.
func (e *NameConflictError) Is(target error) bool { return target == ErrNameConflict }

// Stopped is closed when the node stops by itself, which it does when it
// finds another live member running under its name that started first; Err
// says which. Close the Membership still, to release it.
func (m *Membership) Stopped() <-chan struct{} { return m.conflicted }

// Err returns why the node stopped by itself (a *NameConflictError), nil
// while it has not.
func (m *Membership) Err() error {
	m.conflictMu.Lock()
	defer m.conflictMu.Unlock()
	return m.conflict
}

// conflictDelegate is memberlist's ConflictDelegate: memberlist calls it,
// under its node lock, when an alive message names a known member at
// another address, and ignores the message. It must not block or call
// memberlist: a conflict over this node's name goes to settleConflict.
type conflictDelegate Membership

func (d *conflictDelegate) NotifyConflict(existing, other *memberlist.Node) {
	m := (*Membership)(d)
	theirs := toMember(other)
	if existing.Name != m.cfg.Name {
		a, _ := netip.AddrFromSlice(existing.Addr)
		m.log.Warn("membership: two members claim one name; keeping the first", "peer", existing.Name,
			"addr", netip.AddrPortFrom(a.Unmap(), existing.Port), "other_addr", theirs.Addr)
		return
	}
	select {
	case m.conflicts <- theirs:
	default: // one is being settled; memberlist will report this one again
	}
}

// refuseTakenName settles a conflict that the initial join found, and
// returns the error that makes Start refuse, if this node must yield.
func (m *Membership) refuseTakenName() error {
	select {
	case other := <-m.conflicts:
		return m.settleConflict(other)
	default:
		return nil
	}
}

// watchConflicts settles conflicts found later (a seed that answers late,
// a healed partition) and stops the node, without a leave, if it must
// yield. A member found not answering is not asked again for a while:
// memberlist reports it at every exchange until it reaps it.
func (m *Membership) watchConflicts(ctx context.Context) {
	cleared := map[netip.AddrPort]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case other := <-m.conflicts:
			if until, ok := cleared[other.Addr]; ok && time.Now().Before(until) {
				continue
			}
			if err := m.settleConflict(other); err != nil {
				m.log.Error("membership: stopping", "err", err)
				m.shutdown(false)
				return
			}
			cleared[other.Addr] = time.Now().Add(conflictRecheck * m.cfg.ProbeInterval)
		}
	}
}

// conflictRecheck is how many probe intervals a settled conflict with one
// address is not looked at again.
const conflictRecheck = 10

// settleConflict decides about another member under this node's name.
// The later run yields, if the other answers a ping under the name: a
// member that does not is most likely this node's previous run, dead and
// not yet declared so, which must not keep its successor from starting
// (memberlist accepts the successor once it declares the old run dead
// and Config.DeadNameReclaim has passed).
func (m *Membership) settleConflict(other Member) error {
	if !m.yields(m.Addr(), other) {
		m.log.Warn("membership: a node started later under this node's name; it must stop", "peer", other.Addr)
		return nil
	}
	if !m.answers(other.Addr) {
		m.log.Info("membership: a member under this node's name does not answer; a previous run?", "peer", other.Addr)
		return nil
	}
	err := &NameConflictError{Name: m.cfg.Name, Other: other.Addr}
	if other.MetaErr == nil {
		err.OtherIncarnation = other.Meta.Incarnation
	}
	m.conflictMu.Lock()
	defer m.conflictMu.Unlock()
	if m.conflict == nil {
		m.conflict = err
		close(m.conflicted)
	}
	return m.conflict
}

// answers pings addr under this node's name, a few times, since pings go
// over UDP; each waits ProbeTimeout.
func (m *Membership) answers(addr netip.AddrPort) bool {
	for range 3 {
		if _, err := m.ml.Ping(m.cfg.Name, net.UDPAddrFromAddrPort(addr)); err == nil {
			return true
		}
	}
	return false
}

// yields decides which of two nodes under one name stops: the later run,
// by incarnation (the start time unless configured); if the runs cannot be
// told apart, the one at the greater address, as both sides see it.
func (m *Membership) yields(self netip.AddrPort, other Member) bool {
	if other.MetaErr == nil && other.Meta.Incarnation != 0 && other.Meta.Incarnation != m.cfg.Incarnation {
		return other.Meta.Incarnation < m.cfg.Incarnation
	}
	return self.Compare(other.Addr) > 0
}

// runAccepted says whether inc may be origin's run: the one in the
// metadata memberlist accepted for the name, when there is one. Events,
// marks or snapshots of another run come from an instance memberlist did
// not accept (a duplicate of the name, which must not take the live node's
// place in the index) or from a restart whose alive message has not
// arrived yet (memberChanged switches to it then, and repair fetches what
// was skipped). m.mu is held.
func (m *Membership) runAccepted(origin string, inc uint64) bool {
	mb, ok := m.members[origin]
	return !ok || mb.MetaErr != nil || mb.Meta.Incarnation == 0 || mb.Meta.Incarnation == inc
}
