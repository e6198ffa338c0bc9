package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/kvfabric/kvfabric/fabric/index"
)

// The owned-slices index's calls travel as transfer index calls (method
// 10), whose payload is this:
//
//	ops call (an origin's block events for one owner, in order):
//	  u8 1 | u64 incarnation | u64 first | u8 flags | uvarint n | n × (u8 kind | u64 hash)
//	  answer: u8 0 (applied) or 1 (replace needed)
//	lookup call (who holds each hash):
//	  u8 2 | uvarint n | n × u64 hash
//	  answer: uvarint m | m × (uvarint len | name) | n × (uvarint k | k × uvarint name index)
//	lookup call with tiers (who holds each hash, and whether on disk only):
//	  u8 3 | uvarint n | n × u64 hash
//	  answer: as a lookup's, each holder's name index shifted left by one,
//	  bit 0 set where the holder has the hash on a disk tier only
//
// Op kinds are index.OpStore to index.MaxOpKind (index.OpStoreDisk and
// OpRemoveDisk: a copy on a disk tier). Nodes send the lookup with tiers,
// and answer both lookups; to an owner that predates lookups with tiers
// and disk copies, they send lookups without and disk copies as plain ones
// (cluster_owned_compat.go).
// Integers are little-endian. Ops are numbered per origin run and owner
// from first on, so that an owner applies each exactly once and in order
// and notices a gap; flags bit 0 says the first op starts the stream
// afresh: the owner forgets what it held of the origin before applying.

const (
	ownedCallOps         = 1
	ownedCallLookup      = 2
	ownedCallLookupTiers = 3

	flagReplace = 1

	ansApplied = 0
	ansReplace = 1

	// maxOwnedOps bounds the ops of one call (9 bytes each); maxLookupHashes
	// the hashes of one lookup call; maxOwnedNameLen a holder's name.
	maxOwnedOps     = index.MaxOpsPerCall
	maxLookupHashes = 1 << 14
	maxOwnedNameLen = 253
)

// errOwnedWire is matched by every malformed index call or answer.
var errOwnedWire = errors.New("fabric: malformed index call")

func appendOpsCall(b []byte, c index.OpsCall) []byte {
	b = append(b, ownedCallOps)
	b = binary.LittleEndian.AppendUint64(b, c.Inc)
	b = binary.LittleEndian.AppendUint64(b, c.First)
	var f byte
	if c.Replace {
		f |= flagReplace
	}
	b = append(b, f)
	b = binary.AppendUvarint(b, uint64(len(c.Ops)))
	for _, o := range c.Ops {
		b = append(b, o.Kind)
		b = binary.LittleEndian.AppendUint64(b, o.Hash)
	}
	return b
}

func decodeOpsCall(b []byte) (index.OpsCall, error) {
	var c index.OpsCall
	if len(b) < 18 || b[0] != ownedCallOps {
		return c, fmt.Errorf("%w: ops call of %d bytes", errOwnedWire, len(b))
	}
	c.Inc = binary.LittleEndian.Uint64(b[1:])
	c.First = binary.LittleEndian.Uint64(b[9:])
	if b[17]&^flagReplace != 0 {
		return c, fmt.Errorf("%w: unknown flags %#x", errOwnedWire, b[17])
	}
	c.Replace = b[17]&flagReplace != 0
	n, k := binary.Uvarint(b[18:])
	if k <= 0 || n > maxOwnedOps {
		return c, fmt.Errorf("%w: op count not in [0, %d]", errOwnedWire, maxOwnedOps)
	}
	rest := b[18+k:]
	if uint64(len(rest)) != n*9 {
		return c, fmt.Errorf("%w: %d ops in %d bytes", errOwnedWire, n, len(rest))
	}
	if c.First == 0 || c.First+n < c.First {
		return c, fmt.Errorf("%w: ops numbered from %d", errOwnedWire, c.First)
	}
	c.Ops = make([]index.Op, n)
	for i := range c.Ops {
		o := index.Op{Kind: rest[9*i], Hash: binary.LittleEndian.Uint64(rest[9*i+1:])}
		if o.Kind < index.OpStore || o.Kind > index.MaxOpKind {
			return c, fmt.Errorf("%w: op %d of unknown kind %d", errOwnedWire, i, o.Kind)
		}
		c.Ops[i] = o
	}
	return c, nil
}

// appendLookupCall encodes a lookup of hashes, with tiers or not.
func appendLookupCall(b []byte, hashes []uint64, tiers bool) []byte {
	kind := byte(ownedCallLookup)
	if tiers {
		kind = ownedCallLookupTiers
	}
	b = append(b, kind)
	b = binary.AppendUvarint(b, uint64(len(hashes)))
	for _, h := range hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// decodeLookupCall decodes a lookup, with tiers or not (b[0] says which).
func decodeLookupCall(b []byte) ([]uint64, error) {
	if len(b) < 2 || (b[0] != ownedCallLookup && b[0] != ownedCallLookupTiers) {
		return nil, fmt.Errorf("%w: lookup call of %d bytes", errOwnedWire, len(b))
	}
	n, k := binary.Uvarint(b[1:])
	if k <= 0 || n == 0 || n > maxLookupHashes {
		return nil, fmt.Errorf("%w: lookup of a hash count not in [1, %d]", errOwnedWire, maxLookupHashes)
	}
	rest := b[1+k:]
	if uint64(len(rest)) != 8*n {
		return nil, fmt.Errorf("%w: %d hashes in %d bytes", errOwnedWire, n, len(rest))
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(rest[8*i:])
	}
	return out, nil
}

// appendLookupAnswer encodes holders[i], the holders of hash i, with their
// tiers or not.
func appendLookupAnswer(b []byte, holders [][]index.Holder, tiers bool) []byte {
	idx := map[string]int{}
	var names []string
	for _, hs := range holders {
		for _, h := range hs {
			if _, ok := idx[h.Name]; !ok {
				idx[h.Name] = len(names)
				names = append(names, h.Name)
			}
		}
	}
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, n := range names {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	for _, hs := range holders {
		b = binary.AppendUvarint(b, uint64(len(hs)))
		for _, h := range hs {
			x := uint64(idx[h.Name])
			if tiers {
				x <<= 1
				if h.DiskOnly {
					x |= 1
				}
			}
			b = binary.AppendUvarint(b, x)
		}
	}
	return b
}

// decodeLookupAnswer decodes the holders of n hashes, with their tiers or
// not.
func decodeLookupAnswer(b []byte, n int, tiers bool) ([][]index.Holder, error) {
	bad := func(what string) ([][]index.Holder, error) {
		return nil, fmt.Errorf("%w: lookup answer: %s", errOwnedWire, what)
	}
	m, k := binary.Uvarint(b)
	// Each name takes at least two bytes (its length and one), and an
	// index names at most index.MaxNodes nodes: a count past either lies,
	// and nothing is made for it.
	if k <= 0 || m > uint64(len(b)-k)/2 || m > index.MaxNodes {
		return bad(fmt.Sprintf("name count %d (%d bytes left, at most %d nodes)", m, len(b)-max(k, 0), index.MaxNodes))
	}
	b = b[k:]
	names := make([]string, m)
	seen := make(map[string]bool, m)
	for i := range names {
		l, k := binary.Uvarint(b)
		if k <= 0 || l == 0 || l > maxOwnedNameLen || uint64(len(b)-k) < l {
			return bad(fmt.Sprintf("name %d", i))
		}
		names[i] = string(b[k : k+int(l)])
		if seen[names[i]] {
			return bad(fmt.Sprintf("name %d repeats another", i))
		}
		seen[names[i]] = true
		b = b[k+int(l):]
	}
	// named[x] is 1 + the hash whose holders last named x: a holder named
	// twice for one hash is malformed.
	named := make([]int, m)
	out := make([][]index.Holder, n)
	for i := range out {
		c, k := binary.Uvarint(b)
		if k <= 0 || c > m || c > uint64(len(b)) {
			return bad(fmt.Sprintf("holders of hash %d", i))
		}
		b = b[k:]
		hs := make([]index.Holder, c)
		for j := range hs {
			x, k := binary.Uvarint(b)
			disk := false
			if tiers {
				x, disk = x>>1, x&1 == 1
			}
			if k <= 0 || x >= m || named[x] == i+1 {
				return bad(fmt.Sprintf("holder %d of hash %d", j, i))
			}
			named[x] = i + 1
			hs[j] = index.Holder{Name: names[x], DiskOnly: disk}
			b = b[k:]
		}
		out[i] = hs
	}
	if len(b) != 0 {
		return bad(fmt.Sprintf("%d bytes after the last hash", len(b)))
	}
	return out, nil
}
