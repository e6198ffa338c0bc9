package sim

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// The owned-slices design in the simulation: each node runs the agent's
// streams (index.Publisher on the origin side, index.Slice on the owner
// side) and follows its own membership view as the agent does; a call
// goes from origin to owner in memory, as the agent's transfer index call
// would over QUIC, when the two can reach each other, and its bytes are
// counted as the wire would carry them.

// callOverhead is what one index call costs on the wire beyond its
// payload and answer: the request and response frames' headers and
// protobuf tags (5 + 3 bytes each way), a QUIC stream's frames and a
// packet's QUIC short header, UDP and IP headers each way (about 50
// bytes). An estimate: the simulation carries no QUIC.
const callOverhead = 2*(5+3) + 2*50

// ownedWatch and ownedSend are the agent's intervals: how often a node
// compares its member list with its placement, and sends queued ops
// without being woken.
const (
	ownedWatch = 50 * time.Millisecond
	ownedSend  = 10 * time.Millisecond
)

// stepOwned is step for ModeOwned: the node's publisher queues the events
// for the owners, and the ground truth takes them.
func (c *Cluster) stepOwned(n *Node, id index.NodeID, now time.Time, gone, fresh []uint64) {
	queued := false
	if len(gone) > 0 {
		queued = n.pub.Remove(gone...)
		c.truth.Remove(id, gone...)
	}
	if len(fresh) > 0 {
		c.track.published(fresh, c.cfg.Replicas, now)
		queued = n.pub.Store(fresh...) || queued
		c.truth.Store(id, fresh...)
		for _, h := range fresh {
			n.held = append(n.held, heldBlock{h, now})
		}
	}
	if queued {
		select {
		case n.wake <- struct{}{}:
		default:
		}
	}
}

// ownedLoop is a node's membership watch and sender, as the agent's
// watchLoop and sendLoop.
func (c *Cluster) ownedLoop(n *Node) {
	watch := time.NewTicker(ownedWatch)
	defer watch.Stop()
	send := time.NewTicker(ownedSend)
	defer send.Stop()
	inc := n.M.Incarnation()
	for {
		select {
		case <-n.M.Stopped():
			return
		case <-watch.C:
			if n.dead.Load() {
				return
			}
			ms := n.M.Members()
			names := make([]string, len(ms))
			for i, m := range ms {
				names[i] = m.Name
			}
			n.pub.SetMembers(names)
		case <-send.C:
		case <-n.wake:
		}
		if n.dead.Load() {
			return
		}
		for _, o := range n.pub.Next(time.Now(), inc) {
			c.deliver(n, o)
		}
	}
}

// deliver makes one call from origin n, in line: the agent has one call
// out per owner, and a call in memory takes microseconds.
func (c *Cluster) deliver(n *Node, o index.Outgoing) {
	now := time.Now()
	w := c.Node(o.Owner)
	if w == nil || !c.reachable(n.Name, o.Owner) {
		n.pub.Done(o, index.Failed, now)
		return
	}
	b := int64(19 + uvarintLen(len(o.Call.Ops)) + 9*len(o.Call.Ops) + callOverhead/2)
	n.directOut.Add(b)
	w.directIn.Add(b)
	applied, err := w.slice.Apply(n.Name, o.Call)
	const answer = 1 + callOverhead/2
	w.directOut.Add(answer)
	n.directIn.Add(answer)
	if applied > 0 {
		at := time.Now()
		for _, op := range o.Call.Ops[len(o.Call.Ops)-applied:] {
			if op.Kind == index.OpStore {
				c.track.applied(op.Hash, at)
			}
		}
		w.applied.Add(int64(applied))
	}
	switch {
	case errors.Is(err, index.ErrReplaceNeeded):
		n.pub.Done(o, index.Replace, now)
	case err != nil:
		n.pub.Done(o, index.Failed, now)
	default:
		n.pub.Done(o, index.Applied, now)
	}
}

func uvarintLen(x int) int {
	n := 1
	for ; x >= 0x80; x >>= 7 {
		n++
	}
	return n
}

// ownedExpected returns, for each live node, the (hash, holder) pairs its
// slice must hold under the placement of the live nodes, and their digest
// (as index.Index.Digest sums them).
func (c *Cluster) ownedExpected(nodes []*Node) (pairs map[string]int64, digests map[string]uint64) {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	place := index.NewPlacement(names, c.cfg.Replicas)
	pairs, digests = map[string]int64{}, map[string]uint64{}
	var owners [index.MaxReplicas]string
	for _, n := range nodes {
		seen := map[uint64]bool{}
		for _, b := range n.heldNow() {
			if seen[b] {
				continue
			}
			seen[b] = true
			for _, w := range place.AppendOwners(owners[:0], b) {
				pairs[w]++
				digests[w] += index.PairDigest(b, n.Name)
			}
		}
	}
	return pairs, digests
}

// heldNow returns the node's blocks. The load must be stopped, or the
// caller must not mind a torn read.
func (n *Node) heldNow() []uint64 {
	out := make([]uint64, len(n.held))
	for i, b := range n.held {
		out[i] = b.hash
	}
	return out
}

// ownedConverged is Converged for ModeOwned: every live node sees the live
// nodes, and each slice holds exactly the pairs it owns.
func (c *Cluster) ownedConverged(nodes []*Node) bool {
	pairs, digests := c.ownedExpected(nodes)
	for _, n := range nodes {
		if n.M.NumMembers() != len(nodes) {
			return false
		}
		if n.Index.Metrics().Pairs != pairs[n.Name] || n.Index.Digest() != digests[n.Name] {
			return false
		}
	}
	return true
}

// ownedCheck is Check for ModeOwned: block by block, each owner's slice
// names exactly the live nodes that hold each block it owns, and holds
// nothing else.
func (c *Cluster) ownedCheck(nodes []*Node) error {
	names := make([]string, len(nodes))
	for i, n := range nodes {
		names[i] = n.Name
	}
	place := index.NewPlacement(names, c.cfg.Replicas)
	holders := map[uint64][]string{}
	for _, n := range nodes {
		for _, h := range n.heldNow() {
			if !slices.Contains(holders[h], n.Name) {
				holders[h] = append(holders[h], n.Name)
			}
		}
	}
	pairs := map[string]int64{}
	var owners [index.MaxReplicas]string
	for h, hs := range holders {
		slices.Sort(hs)
		for _, w := range place.AppendOwners(owners[:0], h) {
			pairs[w] += int64(len(hs))
			got := c.Node(w).slice.Holders([]uint64{h})[0]
			slices.Sort(got)
			if !slices.Equal(got, hs) {
				return fmt.Errorf("sim: owner %s of %#x indexes %v, the live holders are %v", w, h, got, hs)
			}
		}
	}
	for _, n := range nodes {
		if got := n.Index.Metrics().Pairs; got != pairs[n.Name] {
			return fmt.Errorf("sim: %s indexes %d pairs, owns %d", n.Name, got, pairs[n.Name])
		}
	}
	return nil
}
