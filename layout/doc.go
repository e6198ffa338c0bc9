// Package layout says what a KV block is and where it sits in memory, and how
// to copy blocks between two nodes that lay them out differently.
//
// It is pure: values and functions, no I/O, no goroutines, no clocks. Every
// other package of kvfabric builds on it.
//
// # Block identity
//
// A block is named by its sequence hash, chained over the xxh3 local hashes
// of every token block before it (see [Hasher]); the recipe is bit for bit
// the one of Dynamo's KV router.
//
// # Memory
//
// A [Layout] describes one block set: the [ModelConfig] that makes blocks
// comparable, the page size, the tensor-parallel size, the KV order within a
// (layer, K/V) chunk, the arrangement of layers, an alignment and one
// [Region] per TP rank. Slot s of the block set is shard r in region r. The
// offsets are derived, never sent as free parameters:
//
//	planes       = 2 (K and V), or 1 for MLA (one latent tensor)
//	heads/rank   = KVHeads/TP; 1 when TP > KVHeads (heads replicated);
//	               KVHeads for MLA (no split)
//	chunk        = page × heads/rank × headDim × dtype size
//	                 NHD: [token][head][dim]   HND: [head][token][dim]
//
//	fully contiguous:                   layer separate:
//	  kv stride    = chunk                kv stride    = chunk
//	  layer stride = planes × chunk       block stride = align(planes × chunk)
//	  block stride = align(layers ×       layer stride = align(slots ×
//	                 layer stride)                       block stride)
//	  offset(s,l,p) = s×block +           offset(s,l,p) = l×layer +
//	                  l×layer + p×kv                      s×block + p×kv
//
// # Plans
//
// [NewPlan] maps slots of a source layout onto slots of a destination layout
// and returns, per destination rank, the copy [Segment]s that move them,
// translating tensor parallelism, KV order, arrangement and page size. A
// segment may be strided (Count pieces at fixed strides), so that the
// per-token copies of an NHD head slice stay one descriptor. [Execute]
// applies a plan to host memory.
package layout
