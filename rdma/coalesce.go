package rdma

import "fmt"

// Piece is one copy a plan asks for: Length bytes of the peer's memory at
// RemoteAddr (under RKey) into ours at LocalAddr (under LKey).
type Piece struct {
	RemoteAddr uint64
	RKey       uint32
	LocalAddr  uint64
	LKey       uint32
	Length     uint64
}

// MaxReadBytes is the most one READ moves (the sum of its scatter list).
const MaxReadBytes = maxMessage

// Coalesce turns pieces, in order, into as few READs as the limits allow: a
// piece that continues the previous one on the remote side (same rkey, next
// address) joins its request, extending the last scatter entry when it also
// continues it locally (same lkey) and adding one otherwise, up to maxSGE
// entries (the queue pair's Options().MaxSGE) and MaxReadBytes a request. A
// piece longer than MaxReadBytes is split. Pieces with zero length, or whose
// ranges wrap, are refused with an error naming them.
func Coalesce(pieces []Piece, maxSGE int) ([]ReadOp, error) {
	if maxSGE < 1 {
		return nil, fmt.Errorf("rdma: coalesce: max scatter entries %d, want at least 1: %w", maxSGE, ErrInvalidArgument)
	}
	var ops []ReadOp
	var sizes []uint64 // bytes of each op so far
	for i, p := range pieces {
		if p.Length == 0 {
			return nil, fmt.Errorf("rdma: coalesce: piece %d has length 0: %w", i, ErrInvalidArgument)
		}
		if p.RemoteAddr+p.Length < p.RemoteAddr || p.LocalAddr+p.Length < p.LocalAddr {
			return nil, fmt.Errorf("rdma: coalesce: piece %d (remote %#x, local %#x, %d bytes) wraps: %w", i, p.RemoteAddr, p.LocalAddr, p.Length, ErrInvalidArgument)
		}
		for p.Length > 0 {
			n := uint64(0)
			if k := len(ops) - 1; k >= 0 && ops[k].RKey == p.RKey && ops[k].RemoteAddr+sizes[k] == p.RemoteAddr && sizes[k] < MaxReadBytes {
				n = min(p.Length, MaxReadBytes-sizes[k])
				op := &ops[k]
				last := &op.Local[len(op.Local)-1]
				switch {
				case last.LKey == p.LKey && last.Addr+uint64(last.Length) == p.LocalAddr:
					last.Length += uint32(n)
				case len(op.Local) < maxSGE:
					op.Local = append(op.Local, SGE{Addr: p.LocalAddr, Length: uint32(n), LKey: p.LKey})
				default:
					n = 0
				}
				sizes[k] += n
			}
			if n == 0 {
				n = min(p.Length, MaxReadBytes)
				ops = append(ops, ReadOp{RemoteAddr: p.RemoteAddr, RKey: p.RKey, Local: []SGE{{Addr: p.LocalAddr, Length: uint32(n), LKey: p.LKey}}})
				sizes = append(sizes, n)
			}
			p.RemoteAddr += n
			p.LocalAddr += n
			p.Length -= n
		}
	}
	return ops, nil
}
