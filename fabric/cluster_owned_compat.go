package fabric

import (
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/transfer"
)

// Lookups with tiers (call kind 3) and disk copies (op kinds
// index.OpStoreDisk and OpRemoveDisk) came after the owned index's first
// calls (lookups of kind 2, op kinds OpStore to OpForget). An owner that
// predates them refuses both as invalid requests, so that a cluster
// upgraded one node at a time would lose the lookups asked of its older
// owners and stall every stream of ops to them at the first disk copy.
// Instead, an owner that refuses a call of the newer kinds is asked again
// at once in the older ones (a lookup of kind 2, whose holders then count
// as holding the hash in memory; disk copies sent as plain stores and
// removes, as such an owner was sent them before), and is sent the older
// kinds from then on, for legacyRecheck, after which the newer are tried
// again (it may have been upgraded meanwhile).
//
// The owner's metadata does not say what it speaks: a node that predates
// such a section reads a member's metadata with one more section as
// malformed, which would break the membership that the fallback keeps.

// legacyRecheck is how long an owner that refused the newer calls is sent
// the older ones before the newer are tried again.
const legacyRecheck = time.Minute

// legacyOwners are the owners that refused the newer calls, with when.
type legacyOwners struct {
	mu    sync.Mutex
	since map[string]time.Time
}

// is says whether owner refused the newer calls within legacyRecheck of
// now.
func (l *legacyOwners) is(owner string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.since[owner]
	if ok && now.Sub(t) >= legacyRecheck {
		delete(l.since, owner)
		return false
	}
	return ok
}

// mark records that owner refused a call of the newer kinds at now.
func (l *legacyOwners) mark(owner string, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.since == nil {
		l.since = map[string]time.Time{}
	}
	l.since[owner] = now
}

// refusedKind says whether err is an owner's refusal of a call it cannot
// decode: what an owner that predates a call's kind answers. Only the
// owner's own answer counts (a RemoteError with its code): a stream that
// ended early, or an answer that would not decode, is this side's
// ErrFrame, which also wraps ErrInvalidRequest, and must not mark an
// owner that speaks the new kinds as older than it is.
func refusedKind(err error) bool {
	var re *transfer.RemoteError
	return errors.As(err, &re) && re.Code == transfer.CodeInvalidRequest
}

// lookup asks owner w who holds hashes: with tiers, unless w refused them
// lately or refuses them now.
func (o *ownedIndex) lookup(w string, hashes []uint64) ([][]index.Holder, error) {
	now := time.Now()
	tiers := !o.legacy.is(w, now)
	for {
		payload := appendLookupCall(nil, hashes, tiers)
		o.stats.lookupCalls.Add(1)
		ans, err := o.call(w, payload)
		if tiers && refusedKind(err) {
			o.legacy.mark(w, now)
			o.a.log.Info("index owner refuses lookups with tiers: asking it without", "peer", w, "err", err)
			tiers = false
			continue
		}
		if err != nil {
			return nil, err
		}
		return decodeLookupAnswer(ans, len(hashes), tiers)
	}
}

// sendOps makes the ops call c to its owner and returns the owner's
// answer: with disk copies as such, unless the owner refused them lately
// or refuses them now.
func (o *ownedIndex) sendOps(c index.Outgoing) ([]byte, error) {
	now := time.Now()
	call := c.Call
	if o.legacy.is(c.Owner, now) {
		call.Ops = opsBeforeTiers(call.Ops)
	}
	ans, err := o.call(c.Owner, appendOpsCall(nil, call))
	if refusedKind(err) && hasDiskOps(call.Ops) {
		o.legacy.mark(c.Owner, now)
		o.a.log.Info("index owner refuses disk copies: sending them as copies", "peer", c.Owner, "err", err)
		call.Ops = opsBeforeTiers(call.Ops)
		ans, err = o.call(c.Owner, appendOpsCall(nil, call))
	}
	return ans, err
}

func hasDiskOps(ops []index.Op) bool {
	return slices.ContainsFunc(ops, func(op index.Op) bool { return op.Kind == index.OpStoreDisk || op.Kind == index.OpRemoveDisk })
}

// opsBeforeTiers returns ops with disk copies' stores and removes as plain
// ones; ops itself if it has none.
func opsBeforeTiers(ops []index.Op) []index.Op {
	if !hasDiskOps(ops) {
		return ops
	}
	out := slices.Clone(ops)
	for i, op := range out {
		switch op.Kind {
		case index.OpStoreDisk:
			out[i].Kind = index.OpStore
		case index.OpRemoveDisk:
			out[i].Kind = index.OpRemove
		}
	}
	return out
}
