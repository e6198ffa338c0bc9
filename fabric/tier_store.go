package fabric

import (
	"context"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// tierStore is what the tiers ask of a tier's store: a disk tier's
// *disk.Store and the host tier's *disk.MemStore alike (the same keys,
// sentinels and batch rules).
type tierStore interface {
	NewBatch() tierPuts
	PutBatch(ctx context.Context, items []disk.PutItem) []error
	Get(ctx context.Context, k disk.Key, dst []byte) (int, error)
	GetPieces(ctx context.Context, k disk.Key, pieces ...[]byte) (int, error)
	Delete(k disk.Key) error
	Free() int
	Keys() []disk.Key
	Stats() disk.Stats
	Close() error
}

// tierPuts is a store's batch of puts (disk.Batch, disk.MemBatch).
type tierPuts interface {
	Add(ctx context.Context, k disk.Key, data []byte)
	AddPieces(ctx context.Context, k disk.Key, pieces ...[]byte)
	Wait(i int) error
	Replace(ctx context.Context, i int, data []byte) bool
	Drop(i int)
	Commit() []error
}

type diskStore struct{ *disk.Store }

func (s diskStore) NewBatch() tierPuts { return s.Store.NewBatch() }

type memStore struct{ *disk.MemStore }

func (s memStore) NewBatch() tierPuts { return s.MemStore.NewBatch() }

// storeRef is a tier's store once open: Load is nil until then.
type storeRef struct{ p atomic.Pointer[tierStore] }

func (r *storeRef) Load() tierStore {
	if p := r.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *storeRef) Store(s tierStore) { r.p.Store(&s) }
