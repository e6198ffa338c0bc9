package pool

import (
	"errors"
	"fmt"
)

// Sentinels. Every error the package returns matches one of them with
// errors.Is, so that the engine API can map it to a status code.
var (
	// ErrNotSupported is returned where the platform lacks a backend.
	ErrNotSupported = errors.New("pool: not supported")
	// ErrClosed is returned after Close.
	ErrClosed = errors.New("pool: closed")
	// ErrInvalidConfig is matched by bad Config, HostConfig and layout input.
	ErrInvalidConfig = errors.New("pool: invalid config")
	// ErrExhausted is matched by *AllocError.
	ErrExhausted = errors.New("pool: not enough free slots")
	// ErrInvalidTransition is matched by *TransitionError.
	ErrInvalidTransition = errors.New("pool: invalid transition")
	// ErrStaleBlock is returned when a Block's generation no longer matches
	// its slot: the slot was recycled since the handle was issued.
	ErrStaleBlock = errors.New("pool: stale block")
	// ErrBadSlot is returned for a slot index outside the block set.
	ErrBadSlot = errors.New("pool: slot out of range")
	// ErrUnknownBlockSet is returned for a block set id the pool never made.
	ErrUnknownBlockSet = errors.New("pool: unknown block set")
	// ErrUnknownLease is returned for a lease id that is not live: never
	// issued, released, or expired and reaped.
	ErrUnknownLease = errors.New("pool: unknown lease")
	// ErrLeaseExpired is returned when a lease passed its deadline.
	ErrLeaseExpired = errors.New("pool: lease expired")
	// ErrTooManyLeases is returned when Config.MaxLeases are live.
	ErrTooManyLeases = errors.New("pool: too many leases")
	// ErrBadLease is returned for a lease request that breaks the limits
	// (duration, number of hashes).
	ErrBadLease = errors.New("pool: invalid lease request")
	// ErrReadDenied is matched by *ReadError.
	ErrReadDenied = errors.New("pool: read outside lease")
	// ErrNotHostMemory is returned when bytes are asked of memory this
	// process cannot address (device memory).
	ErrNotHostMemory = errors.New("pool: not host memory")
	// ErrInvalidArgument is returned for a call's argument that is out of
	// range (a count that is not positive, a rank past the last).
	ErrInvalidArgument = errors.New("pool: invalid argument")
	// ErrOutOfMemory is returned when the pool's storage cannot hold a new
	// block set.
	ErrOutOfMemory = errors.New("pool: storage full")
	// ErrBlockSetBusy is returned by FreeBlockSet and ReclaimBlockSet
	// while a slot of the set is allocated, referenced or leased.
	ErrBlockSetBusy = errors.New("pool: block set in use")
	// ErrBlockSetRetired is returned by ReclaimBlockSet for a set with
	// Retired slots, whose memory freeing it would withhold.
	ErrBlockSetRetired = errors.New("pool: block set has retired slots")
)

// AllocError says why an allocation failed. It matches ErrExhausted.
type AllocError struct {
	// Asked is the slots requested.
	Asked int
	// Free is the slots in Reset when the request failed.
	Free int
	// Inactive is the Registered blocks nobody uses.
	Inactive int
	// Pinned is zero unless recycling was tried and stopped short: then it
	// is the inactive blocks it could not take because Registered blocks in
	// use extend them (all of Inactive).
	Pinned int
	// Offloading is the blocks being copied to the tier below: their
	// slots are free once the copies are done (see Config.Offload).
	Offloading int
	// Copying is those of Offloading being read for their copy now
	// (BeginCopy): under Config.OffloadGiveUp, the only ones an
	// allocation cannot take, free within a copy in memory.
	Copying int
	// Spare is the slots AllocateSpare handed out that are not yet
	// registered or given back: held by work done only with room to
	// spare (reading ahead), which the caller may end to get them back.
	Spare int
}

func (e *AllocError) Error() string {
	msg := e.message()
	if e.Spare > 0 {
		msg += fmt.Sprintf(" (%d held by reads ahead)", e.Spare)
	}
	return msg
}

func (e *AllocError) message() string {
	if e.Offloading > 0 {
		return fmt.Sprintf("pool: not enough free slots: asked for %d, %d free, %d recyclable, and %d being copied to the tier below",
			e.Asked, e.Free, e.Inactive, e.Offloading)
	}
	if e.Pinned > 0 {
		return fmt.Sprintf("pool: not enough free slots: asked for %d, %d free, and %d inactive blocks are prefixes of blocks in use",
			e.Asked, e.Free, e.Pinned)
	}
	return fmt.Sprintf("pool: not enough free slots: asked for %d, %d free and %d recyclable",
		e.Asked, e.Free, e.Inactive)
}

// Is makes errors.Is(err, ErrExhausted) true.
func (e *AllocError) Is(target error) bool { return target == ErrExhausted }

// TransitionError is an operation applied to a slot in a state that does
// not allow it. It matches ErrInvalidTransition.
type TransitionError struct {
	// Op is the operation: "commit", "register", "abort", "release".
	Op string
	// Slot is the slot index.
	Slot int
	// State is the state the slot was in.
	State State
	// Reason adds what else was wrong, if anything (no users, ...).
	Reason string
}

func (e *TransitionError) Error() string {
	s := fmt.Sprintf("pool: invalid transition: %s of slot %d in state %s", e.Op, e.Slot, e.State)
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	return s
}

// Is makes errors.Is(err, ErrInvalidTransition) true.
func (e *TransitionError) Is(target error) bool { return target == ErrInvalidTransition }

// ReadError says why a read was refused. It matches ErrReadDenied.
type ReadError struct {
	Lease  LeaseID
	Rank   int
	Offset uint64
	Length uint64
	// Reason names what is outside: the rank, padding, a slot not leased.
	Reason string
}

func (e *ReadError) Error() string {
	return fmt.Sprintf("pool: read outside lease: lease %#x rank %d [%d, +%d): %s",
		uint64(e.Lease), e.Rank, e.Offset, e.Length, e.Reason)
}

// Is makes errors.Is(err, ErrReadDenied) true.
func (e *ReadError) Is(target error) bool { return target == ErrReadDenied }
