package pool

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/kvfabric/kvfabric/layout"
)

// Clock tells the time leases expire by. Tests inject a manual clock; the
// zero Config uses the wall clock. Now may be called concurrently.
type Clock interface {
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// EventSink receives batches of store and remove events, in order, from the
// pool's own goroutine, one batch at a time. It may block: the pool never
// waits for it, events that find the buffer full are dropped and counted,
// and the next batch says how many. The sink owns the batch.
type EventSink func(EventBatch)

// Config configures a Pool. The zero value is usable; DefaultConfig spells
// the defaults out.
type Config struct {
	// Logger receives the few things worth logging (fallbacks, expiries in
	// bulk). If nil, slog.Default().
	Logger *slog.Logger
	// Clock drives lease expiry. If nil, the wall clock.
	Clock Clock
	// Events receives store and remove events. If nil, events are counted
	// and discarded.
	Events EventSink
	// EventBuffer is the events held for the sink before new ones are
	// dropped. One operation's events (a block set freed, one
	// allocation's evictions) are taken whole while the buffer is not
	// full, so it may hold that many more for a moment. If zero, 8192.
	EventBuffer int
	// MaxEventBatch bounds the events handed to the sink in one call. If
	// zero, 1024.
	MaxEventBatch int
	// ExpiryInterval is how often the pool's goroutine reaps expired leases.
	// If zero, 1 s; if negative, only calls reap (ExpireLeases, and Renew,
	// ReleaseLease and CheckRead on the lease they name).
	ExpiryInterval time.Duration
	// LowWatermark is the fraction of a block set's slots: when an
	// allocation leaves fewer free slots than that, inactive blocks are
	// recycled until HighWatermark is free. If zero, 0.05; if negative, no
	// recycling ahead of need.
	LowWatermark float64
	// HighWatermark is the fraction of free slots recycling stops at. If
	// zero, 0.10. It must not be below LowWatermark.
	HighWatermark float64
	// MaxLeases bounds the live leases of the pool, so that peers cannot
	// exhaust memory with them. If zero, 65536.
	MaxLeases int
	// MaxLeaseBlocks bounds the hashes of one lease request. If zero, 4096.
	MaxLeaseBlocks int
	// MaxLeaseDuration bounds the duration a lease or renewal may ask for.
	// If zero, 5 minutes.
	MaxLeaseDuration time.Duration

	// Offload, if set, is offered each block that recycling is about to
	// take and that has no copy below yet (see OffloadFunc). If nil,
	// blocks are recycled as they are.
	Offload OffloadFunc
	// OffloadWatermark is, with Offload set, the fraction of a block set's
	// slots in use past which blocks are offered ahead of need (it takes
	// the place of 1 - LowWatermark). If zero, 0.90; at most 1.
	OffloadWatermark float64
	// OffloadInFlight is, with Offload set, the fraction of a block set's
	// slots that may wait for or be under a copy below at once (at least
	// one slot). Past it Offload is not offered more: recycling for an
	// allocation drops blocks as it would without a tier, so that an
	// allocation waits for copies only when the set's other slots are all
	// in use. If zero, DefaultOffloadInFlight; 1: blocks are dropped only
	// when Offload refuses them, and allocations wait for copies instead.
	OffloadInFlight float64

	// OffloadGiveUp lets an allocation that finds no other slot take the
	// slots of blocks whose copy below is under way, instead of failing
	// (and its caller waiting for the copies): first those whose bytes
	// were read or written already (EndCopy), which reach the tier below
	// all the same; then those whose copy has not begun, and last those
	// being written straight from their slots (StartCopy direct): each of
	// these is copied out (OffloadTake) or dropped as it would be without
	// a tier. Only a slot being read (between BeginCopy and EndCopy) is
	// never taken. The Offload hook's copier must then call BeginCopy (or
	// StartCopy) before it reads a block's slot and skip the block when it
	// refuses, and after a direct write take EndCopy's error to mean the
	// slot was taken under the write. If false, such slots are kept until
	// Offloaded.
	OffloadGiveUp bool
	// OffloadTake, with OffloadGiveUp, is called when an allocation takes
	// the slot of a block whose copy has not begun or is being written
	// straight from the slot: it may copy the block's bytes out of the
	// slot now (RegionBytes; the set's lock is held: it must not block nor
	// call the set's other methods), so that the copy goes on from them
	// and the block is not lost, and returns whether it did. If nil, or
	// false, the block is dropped (Metrics.OffloadsGivenUp).
	OffloadTake func(set *BlockSet, blk Block, sum uint64, hasSum bool) bool

	// OffloadSkips, with Offload set, says of a new block set's layout
	// (its regions placed) that the Offload hook would refuse every one
	// of its blocks (no tier can take them): such a set is never offered
	// a block and not recycled ahead of need (recycling ahead stops at
	// the first block the hook refuses), so a block of it is recycled
	// only when an allocation needs its slot, and Retains is every slot
	// not retired. It is called with the pool's lock held: it must not
	// call the pool. If nil, every set's blocks are offered.
	OffloadSkips func(l *layout.Layout) bool
}

// DefaultConfig returns the defaults for an agent.
func DefaultConfig() Config {
	return Config{
		EventBuffer:      8192,
		MaxEventBatch:    1024,
		ExpiryInterval:   time.Second,
		LowWatermark:     0.05,
		HighWatermark:    0.10,
		MaxLeases:        65536,
		MaxLeaseBlocks:   4096,
		MaxLeaseDuration: 5 * time.Minute,
	}
}

// DefaultLocalConfig returns defaults for tests and a single machine:
// smaller buffers and a faster expiry loop.
func DefaultLocalConfig() Config {
	c := DefaultConfig()
	c.EventBuffer = 1024
	c.MaxEventBatch = 256
	c.ExpiryInterval = 100 * time.Millisecond
	c.MaxLeases = 4096
	return c
}

// populate fills defaults and validates; it is the only place that does.
func (c Config) populate() (Config, error) {
	d := DefaultConfig()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = d.EventBuffer
	}
	if c.MaxEventBatch == 0 {
		c.MaxEventBatch = d.MaxEventBatch
	}
	if c.ExpiryInterval == 0 {
		c.ExpiryInterval = d.ExpiryInterval
	}
	if c.LowWatermark == 0 {
		c.LowWatermark = d.LowWatermark
	}
	if c.HighWatermark == 0 {
		c.HighWatermark = d.HighWatermark
	}
	if c.MaxLeases == 0 {
		c.MaxLeases = d.MaxLeases
	}
	if c.MaxLeaseBlocks == 0 {
		c.MaxLeaseBlocks = d.MaxLeaseBlocks
	}
	if c.MaxLeaseDuration == 0 {
		c.MaxLeaseDuration = d.MaxLeaseDuration
	}
	if c.OffloadWatermark == 0 {
		c.OffloadWatermark = DefaultOffloadWatermark
	}
	if c.OffloadInFlight == 0 {
		c.OffloadInFlight = DefaultOffloadInFlight
	}
	bad := func(field, format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: %s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.EventBuffer < 0:
		return bad("EventBuffer", "%d is negative", c.EventBuffer)
	case c.MaxEventBatch < 0:
		return bad("MaxEventBatch", "%d is negative", c.MaxEventBatch)
	case c.LowWatermark > 1:
		return bad("LowWatermark", "%g is above 1", c.LowWatermark)
	case c.HighWatermark < 0 || c.HighWatermark > 1:
		return bad("HighWatermark", "%g is not in (0, 1]", c.HighWatermark)
	case c.LowWatermark > c.HighWatermark:
		return bad("HighWatermark", "%g is below LowWatermark %g", c.HighWatermark, c.LowWatermark)
	case c.MaxLeases < 0:
		return bad("MaxLeases", "%d is negative", c.MaxLeases)
	case c.MaxLeaseBlocks < 0:
		return bad("MaxLeaseBlocks", "%d is negative", c.MaxLeaseBlocks)
	case c.MaxLeaseDuration < 0:
		return bad("MaxLeaseDuration", "%v is negative", c.MaxLeaseDuration)
	case c.OffloadWatermark < 0 || c.OffloadWatermark > 1:
		return bad("OffloadWatermark", "%g is not in (0, 1]", c.OffloadWatermark)
	case c.OffloadInFlight < 0 || c.OffloadInFlight > 1:
		return bad("OffloadInFlight", "%g is not in (0, 1]", c.OffloadInFlight)
	}
	return c, nil
}
