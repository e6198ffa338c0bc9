package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"unicode/utf8"
)

// MetaMaxSize is memberlist's limit on node metadata.
const MetaMaxSize = 512

// ErrMetaTooLarge is returned, at start or by SetMeta, when the encoded
// metadata does not fit memberlist's 512 bytes.
var ErrMetaTooLarge = errors.New("membership: node metadata too large")

// Transports is a set of peer transports a node offers.
type Transports uint8

// The transports a node may offer.
const (
	TransportQUIC Transports = 1 << iota
	TransportRDMA
)

const allTransports = TransportQUIC | TransportRDMA

// Load is the load a node reports, for routers weighing overlap against load.
type Load struct {
	// KVUsage is the fraction of the node's KV pools in use, in [0, 1]. It
	// travels with a resolution of 1/65535.
	KVUsage float64
	// Waiting is the number of requests queued at the node's engines.
	Waiting uint32
	// Imports is the number of imports in flight.
	Imports uint32
}

// Meta is what a node tells every other node about itself through
// memberlist. Layouts never travel here, only their digest; peers fetch the
// layouts over the peer transport when the digest changes.
type Meta struct {
	// PeerAddr is the address of the node's peer transport (QUIC), host:port.
	PeerAddr string
	// APIAddr is the address of the node's engine API, if it serves one
	// beyond its unix socket; empty otherwise.
	APIAddr string
	// Transports are the peer transports the node offers.
	Transports Transports
	// LayoutDigest identifies the node's set of block-set layouts.
	LayoutDigest uint64
	// Load is the node's load when the metadata was last updated.
	Load Load
	// Incarnation is the node's event incarnation: it changes when the
	// node restarts, and peers then replace its entries. Membership sets it.
	Incarnation uint64
	// GPUs summarises the node's device pools; zero for a node without.
	GPUs GPUs
	// Index is how the node keeps the cluster's block index; the zero
	// value is the whole index (every node before the field kept it).
	Index IndexMode
}

// IndexMode is a node's index mode, which every member of a cluster must
// share: Owned says the node keeps owned slices, Replicas (1..255) owners
// a hash; not Owned, the whole index (Replicas 0).
type IndexMode struct {
	Owned    bool
	Replicas uint8
}

// String names the mode as the agent's settings do.
func (x IndexMode) String() string {
	if !x.Owned {
		return "whole"
	}
	return fmt.Sprintf("owned/%d", x.Replicas)
}

// MaxGPUModelLen bounds GPUs.Model.
const MaxGPUModelLen = 64

// GPUs is a compact summary of a node's GPUs with device pools, for
// operators and routers: how much KV the node holds in HBM, on what, and
// how its NICs reach it.
type GPUs struct {
	// Count is the GPUs with a device pool.
	Count uint8
	// PoolBytes is the bytes of their device pools.
	PoolBytes uint64
	// NICs is the RDMA devices the pools are registered with: Count where
	// the node has a NIC per GPU, 0 without RDMA.
	NICs uint8
	// Model is the first GPU's product name, UTF-8 of at most
	// MaxGPUModelLen bytes.
	Model string
}

// Encoding of Meta (all varints unsigned):
//
//	+---------+------+-----------+----------+------------+---------------+
//	| version | type | peer addr | api addr | transports | layout digest |
//	|   u8=1  | u8=3 | len + str | len+str  |     u8     |    u64 LE     |
//	+---------+------+-----------+----------+------------+---------------+
//	| kv usage u16 LE (÷65535) | waiting uvarint | imports uvarint | incarnation uvarint |
//	+--------------------------+-----------------+-----------------+---------------------+
//	| gpus u8 > 0 | pool bytes uvarint | nics u8 | model len + str |
//	+-------------+--------------------+---------+-----------------+
//	| index mode u8 = 1 (owned) | replicas u8 |
//	+---------------------------+-------------+
//
// The GPU section is written only for a node with GPUs, so that nodes
// that predate it decode every other node's metadata; its absence decodes
// as no GPUs. The index section is written only for a node in owned mode,
// after the GPU section, which is then written for a node without GPUs
// too as its count alone (gpus 0); its absence decodes as the whole index,
// so that a node in whole mode encodes as before the section existed.
//
// The node name is memberlist's own and is not repeated.

// MarshalBinary encodes m; it fails if a field is out of range or the result
// exceeds MetaMaxSize.
func (m *Meta) MarshalBinary() ([]byte, error) {
	if err := m.validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 64)
	b = append(b, wireVersion, msgMeta)
	b = appendStr(b, m.PeerAddr)
	b = appendStr(b, m.APIAddr)
	b = append(b, byte(m.Transports))
	b = binary.LittleEndian.AppendUint64(b, m.LayoutDigest)
	b = binary.LittleEndian.AppendUint16(b, uint16(math.Round(m.Load.KVUsage*65535)))
	b = binary.AppendUvarint(b, uint64(m.Load.Waiting))
	b = binary.AppendUvarint(b, uint64(m.Load.Imports))
	b = binary.AppendUvarint(b, m.Incarnation)
	if m.GPUs.Count > 0 || m.Index.Owned {
		b = append(b, m.GPUs.Count)
	}
	if m.GPUs.Count > 0 {
		b = binary.AppendUvarint(b, m.GPUs.PoolBytes)
		b = append(b, m.GPUs.NICs)
		b = appendStr(b, m.GPUs.Model)
	}
	if m.Index.Owned {
		b = append(b, indexOwned, m.Index.Replicas)
	}
	if len(b) > MetaMaxSize {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrMetaTooLarge, len(b), MetaMaxSize)
	}
	return b, nil
}

func (m *Meta) validate() error {
	for _, f := range []struct{ name, v string }{{"PeerAddr", m.PeerAddr}, {"APIAddr", m.APIAddr}} {
		if len(f.v) > MaxNameLen {
			return fmt.Errorf("%w: %s is %d bytes, limit %d", ErrInvalidMeta, f.name, len(f.v), MaxNameLen)
		}
		if f.v != "" {
			if _, err := netip.ParseAddrPort(f.v); err != nil {
				return fmt.Errorf("%w: %s %q: %v", ErrInvalidMeta, f.name, f.v, err)
			}
		}
	}
	if m.Transports&^allTransports != 0 {
		return fmt.Errorf("%w: unknown transports %#x", ErrInvalidMeta, uint8(m.Transports&^allTransports))
	}
	if !(m.Load.KVUsage >= 0 && m.Load.KVUsage <= 1) { // also refuses NaN
		return fmt.Errorf("%w: Load.KVUsage %v outside [0, 1]", ErrInvalidMeta, m.Load.KVUsage)
	}
	g := m.GPUs
	if len(g.Model) > MaxGPUModelLen || !utf8.ValidString(g.Model) {
		return fmt.Errorf("%w: GPUs.Model %q: not UTF-8 of at most %d bytes", ErrInvalidMeta, g.Model, MaxGPUModelLen)
	}
	if g.Count == 0 && (g.PoolBytes != 0 || g.NICs != 0 || g.Model != "") {
		return fmt.Errorf("%w: GPUs %+v without a GPU", ErrInvalidMeta, g)
	}
	if g.NICs > g.Count {
		return fmt.Errorf("%w: GPUs: %d NICs for %d GPUs", ErrInvalidMeta, g.NICs, g.Count)
	}
	if m.Index.Owned != (m.Index.Replicas > 0) {
		return fmt.Errorf("%w: Index %+v: owned slices take 1..255 replicas, the whole index none", ErrInvalidMeta, m.Index)
	}
	return nil
}

// indexOwned is the index section's mode byte for owned slices.
const indexOwned = 1

// ErrInvalidMeta is matched by errors about a field of Meta.
var ErrInvalidMeta = errors.New("membership: invalid node metadata")

// UnmarshalBinary decodes metadata received from a peer and validates it.
func (m *Meta) UnmarshalBinary(b []byte) error {
	if len(b) > MetaMaxSize {
		return malformed("metadata: %d bytes, limit %d", len(b), MetaMaxSize)
	}
	r := reader{b: b}
	r.header(msgMeta, "metadata")
	var out Meta
	out.PeerAddr = r.str("metadata peer addr")
	out.APIAddr = r.str("metadata api addr")
	out.Transports = Transports(r.byte("metadata transports"))
	out.LayoutDigest = r.u64le("metadata layout digest")
	out.Load.KVUsage = float64(r.u16le("metadata kv usage")) / 65535
	out.Load.Waiting = r.u32("metadata waiting")
	out.Load.Imports = r.u32("metadata imports")
	out.Incarnation = r.uvarint("metadata incarnation")
	if r.err == nil && len(r.b) > 0 {
		out.GPUs.Count = r.byte("metadata gpus")
		switch {
		case out.GPUs.Count > 0:
			out.GPUs.PoolBytes = r.uvarint("metadata gpu pool bytes")
			out.GPUs.NICs = r.byte("metadata gpu nics")
			out.GPUs.Model = r.str("metadata gpu model")
		case len(r.b) == 0:
			r.fail("metadata: a GPU section of no GPUs")
		}
	}
	if r.err == nil && len(r.b) > 0 {
		if mode := r.byte("metadata index mode"); mode != indexOwned && r.err == nil {
			r.fail("metadata: index mode %d unknown", mode)
		}
		out.Index = IndexMode{Owned: true, Replicas: r.byte("metadata index replicas")}
	}
	r.end("metadata")
	if r.err != nil {
		return r.err
	}
	if err := out.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	*m = out
	return nil
}
