package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// errLeaseLost is the cause of a read's end when its lease could not be
// renewed: the holder said it had ended, or did not answer.
var errLeaseLost = errors.New("lease could not be renewed")

// renewer is the part of a peer that renews leases.
type renewer interface {
	Renew(ctx context.Context, leaseID uint64, d time.Duration) (time.Duration, error)
}

// leaseKeeper renews the leases an import holds on one holder (the chunk
// being read and the chunk leased ahead) once half of each granted term
// has passed, so that a read that outlives the holder's term goes on.
// Terms are counted from when the lease was asked for, which is never
// later than when the holder started counting.
//
// keep and drop may be called from any goroutine; close stops the loop
// and returns after it has exited.
type leaseKeeper struct {
	peer     renewer
	renewals *atomic.Uint64 // counts renewals granted

	mu     sync.Mutex
	leases map[uint64]*keptLease
	closed bool // keep after close hands back an ended lease
	wake   chan struct{}

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// keptLease is one lease under renewal. ctx ends with errLeaseLost as its
// cause when a renewal fails, and plainly when the lease is dropped.
type keptLease struct {
	id     uint64
	term   time.Duration
	due    time.Time // when to renew next
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newLeaseKeeper(peer renewer, renewals *atomic.Uint64) *leaseKeeper {
	k := &leaseKeeper{
		peer:     peer,
		renewals: renewals,
		leases:   map[uint64]*keptLease{},
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go k.loop()
	return k
}

// keep renews lease id, granted for term when it was asked for at asked,
// until it is dropped. Reads under the lease use the returned lease's ctx,
// derived from parent.
func (k *leaseKeeper) keep(parent context.Context, id uint64, term time.Duration, asked time.Time) *keptLease {
	ctx, cancel := context.WithCancelCause(parent)
	l := &keptLease{id: id, term: term, due: asked.Add(term / 2), ctx: ctx, cancel: cancel}
	k.mu.Lock()
	if k.closed {
		// A lease answered after its import gave up (leased ahead, then
		// abandoned): nothing will read under it.
		k.mu.Unlock()
		cancel(nil)
		return l
	}
	k.leases[id] = l
	k.mu.Unlock()
	select {
	case k.wake <- struct{}{}:
	default:
	}
	return l
}

// drop stops renewing lease id (it is being released or abandoned).
func (k *leaseKeeper) drop(id uint64) {
	k.mu.Lock()
	l := k.leases[id]
	delete(k.leases, id)
	k.mu.Unlock()
	if l != nil {
		l.cancel(nil)
	}
}

// close stops renewing every lease and waits for the loop to exit.
func (k *leaseKeeper) close() {
	k.once.Do(func() { close(k.stop) })
	<-k.done
	k.mu.Lock()
	k.closed = true
	for id, l := range k.leases {
		l.cancel(nil)
		delete(k.leases, id)
	}
	k.mu.Unlock()
}

func (k *leaseKeeper) loop() {
	defer close(k.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*keptLease
		next := now.Add(time.Hour)
		k.mu.Lock()
		for _, l := range k.leases {
			if !l.due.After(now) {
				due = append(due, l)
			} else if l.due.Before(next) {
				next = l.due
			}
		}
		k.mu.Unlock()
		for _, l := range due {
			k.renew(l)
		}
		if len(due) > 0 {
			continue
		}
		timer.Reset(next.Sub(now))
		select {
		case <-k.stop:
			return
		case <-k.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// renew extends l by its term; a lease that cannot be renewed is lost. The
// next renewal is due half way through the term the holder granted, which
// its cap may have made shorter than the one asked for.
func (k *leaseKeeper) renew(l *keptLease) {
	asked := time.Now()
	granted, err := k.peer.Renew(l.ctx, l.id, l.term)
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.leases[l.id] != l {
		return // dropped meanwhile
	}
	if err != nil || granted <= 0 {
		if err == nil {
			err = errors.New("the holder says it has ended")
		}
		delete(k.leases, l.id)
		l.cancel(fmt.Errorf("%w: lease %d: %v", errLeaseLost, l.id, err))
		return
	}
	l.due = asked.Add(min(granted, l.term) / 2)
	k.renewals.Add(1)
}
