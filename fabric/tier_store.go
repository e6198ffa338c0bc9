package fabric

import (
	"context"
	"sync/atomic"

	"github.com/kvfabric/kvfabric/pool/disk"
)

// tierStore is what the tiers ask of a tier's store: a disk tier's
// *disk.Store and the host tier's *disk.MemStore alike (the same keys,
// sentinels and batch rules; a batch of either through newBatch).
type tierStore interface {
	Put(ctx context.Context, k disk.Key, data []byte) error
	PutBatch(ctx context.Context, items []disk.PutItem) []error
	Get(ctx context.Context, k disk.Key, dst []byte) (int, error)
	GetPieces(ctx context.Context, k disk.Key, pieces ...[]byte) (int, error)
	// GetGen and GetPiecesGen are Get and GetPieces that return the
	// generation of the copy read (also where it failed a check: too
	// large, corrupt); Gen is the generation of the copy held; DeleteIf
	// deletes the copy of k only while it is that generation's: a copy
	// committed since in its place is kept.
	GetGen(ctx context.Context, k disk.Key, dst []byte) (int, uint64, error)
	GetPiecesGen(ctx context.Context, k disk.Key, pieces ...[]byte) (int, uint64, error)
	Gen(k disk.Key) (uint64, bool)
	Delete(k disk.Key) error
	DeleteIf(k disk.Key, gen uint64) error
	Has(k disk.Key) bool
	// Parent is the parent kept with k's copy; SetParent keeps another
	// with the copy held (a disk store journals it with its next commit).
	Parent(k disk.Key) (uint64, bool)
	SetParent(k disk.Key, parent uint64) bool
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
	SetParent(i int, parent uint64)
	Commit() []error
}

var (
	_ tierStore = (*disk.Store)(nil)
	_ tierStore = (*disk.MemStore)(nil)
	_ tierPuts  = (*disk.Batch)(nil)
	_ tierPuts  = (*disk.MemBatch)(nil)
)

// newBatch starts a batch of puts in st, a *disk.Store or a
// *disk.MemStore (the one other kind of store there is).
func newBatch(st tierStore) tierPuts {
	if m, ok := st.(*disk.MemStore); ok {
		return m.NewBatch()
	}
	return st.(*disk.Store).NewBatch()
}

// storeRef is a tier's store once open: Load is nil until then.
type storeRef struct{ p atomic.Pointer[tierStore] }

func (r *storeRef) Load() tierStore {
	if p := r.p.Load(); p != nil {
		return *p
	}
	return nil
}

func (r *storeRef) Store(s tierStore) { r.p.Store(&s) }
