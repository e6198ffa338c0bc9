package pool

import (
	"math/bits"
	"math/rand/v2"
	"time"
)

// Reading the clock costs 20 to 90 ns depending on the machine, as much as
// the operation timed, so latency is sampled: one operation in
// latencySampleRate is timed, chosen at random so that no pattern of calls
// escapes it. The histograms are unbiased; their counts are a fraction of
// the operations.
const latencySampleRate = 16

var epoch = time.Now()

func sinceEpoch() time.Duration { return time.Since(epoch) }

// sampleStart decides whether to time this operation and, if so, when it
// started.
func sampleStart() (time.Duration, bool) {
	if rand.Uint32()%latencySampleRate != 0 {
		return 0, false
	}
	return sinceEpoch(), true
}

// Histogram counts durations in power-of-two buckets of nanoseconds: bucket
// i holds durations d with 2^(i-1) <= d < 2^i ns (bucket 0 holds zero). It
// is a value; the pool hands out copies.
type Histogram struct {
	Counts [64]uint64
	// Sum is the total of the durations recorded.
	Sum time.Duration
}

func (h *Histogram) record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.Counts[bits.Len64(uint64(d))]++
	h.Sum += d
}

func (h *Histogram) merge(o *Histogram) {
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	h.Sum += o.Sum
}

// Count returns the durations recorded.
func (h *Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Metrics is a snapshot of a pool or one block set. Counts are slots unless
// named otherwise; cumulative counters count since the pool was made.
type Metrics struct {
	// Slots is the slots in total.
	Slots int
	// Free is the slots in Reset, ready to allocate.
	Free int
	// Active is the slots in use: Partial, Complete, Retired, or
	// Registered with users or leases.
	Active int
	// Inactive is the Registered blocks with no users and no leases, which
	// allocation may recycle, leaves first: a block that a block in use
	// extends stays until that one is released and recycled.
	Inactive int
	// Registered is the blocks in the registry, active or not.
	Registered int
	// Leased is the slots held by at least one lease.
	Leased int
	// Leases is the live leases.
	Leases int
	// LeasesExpired counts leases that passed their deadline.
	LeasesExpired uint64
	// Evictions counts Registered blocks recycled.
	Evictions uint64
	// Demoted is the Registered blocks marked as held by other nodes too
	// (BlockSet.Demote): recycled before the blocks only this node holds.
	Demoted int
	// EventsDropped counts events the sink could not take in time (pool
	// metrics only; events are per pool).
	EventsDropped uint64
	// AllocLatency is the time Allocate took, waiting for the lock
	// included, sampled (one call in 16).
	AllocLatency Histogram
	// ReleaseLatency is the time Release and Abort took, sampled likewise.
	ReleaseLatency Histogram
	// Utilization is Active/Slots: the fraction that allocation cannot
	// have, even by recycling.
	Utilization float64

	// Offloading is the blocks whose copy to the tier below is under way
	// (Config.Offload); they count as Active.
	Offloading int
	// OffloadsGivenUp counts the blocks dropped because allocations took
	// their slots before their copy below began, or while it was written
	// straight from them (StartCopy direct), and OffloadTake did not copy
	// them out (Config.OffloadGiveUp); they count in Evictions too.
	// Counted where the slot is taken, it is the one count of them (the
	// copier that finds its block gone does not count it again); a pool's
	// count includes its freed sets', so it only grows.
	OffloadsGivenUp uint64

	// Retired is the slots out of use for good (BlockSet.Retire); a
	// pool's count includes its freed sets', so it only grows.
	Retired int
	// WithheldBytes is the memory retired slots keep out of use: in a set
	// still held, the retired slots' share of its regions; of a set freed
	// with retired slots, all its memory, which no other set gets. A
	// pool's count includes its freed sets', so it only grows.
	WithheldBytes uint64
}

func (m *Metrics) add(o *Metrics) {
	m.Slots += o.Slots
	m.Free += o.Free
	m.Active += o.Active
	m.Inactive += o.Inactive
	m.Registered += o.Registered
	m.Leased += o.Leased
	m.Leases += o.Leases
	m.LeasesExpired += o.LeasesExpired
	m.Evictions += o.Evictions
	m.Demoted += o.Demoted
	m.Offloading += o.Offloading
	m.OffloadsGivenUp += o.OffloadsGivenUp
	m.Retired += o.Retired
	m.WithheldBytes += o.WithheldBytes
	m.AllocLatency.merge(&o.AllocLatency)
	m.ReleaseLatency.merge(&o.ReleaseLatency)
}

func (m *Metrics) finish() {
	if m.Slots > 0 {
		m.Utilization = float64(m.Active) / float64(m.Slots)
	}
}
