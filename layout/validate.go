package layout

import (
	"errors"
	"fmt"
	"math/bits"
)

// ErrInvalid is matched by every validation failure of a layout.
var ErrInvalid = errors.New("layout: invalid layout")

// Bounds on what a layout may claim. They are far above any model served
// today and far below what would overflow the derived sizes.
const (
	MaxLayers    = 1 << 12
	MaxKVHeads   = 1 << 12
	MaxHeadDim   = 1 << 16
	MaxPageSize  = 1 << 16
	MaxTPSize    = 1 << 10
	MaxSlots     = 1 << 26
	MaxAlignment = 1 << 30
)

// FieldError says which field of a layout is wrong and why. It matches
// [ErrInvalid] with errors.Is.
type FieldError struct {
	// Field is the protobuf name of the field, with a path: "model.kv_heads",
	// "regions[3].size".
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "layout: invalid " + e.Field + ": " + e.Reason }

// Is makes errors.Is(err, ErrInvalid) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks a layout, which may have come from a peer, and returns a
// *FieldError naming the first field that is wrong. Every other method of a
// Layout assumes it passed.
func (l *Layout) Validate() error {
	if err := l.validate(); err != nil {
		return err
	}
	return nil
}

func (l *Layout) validate() *FieldError {
	if err := l.Model.validate(); err != nil {
		return err
	}
	if err := inRange("page_size", l.PageSize, MaxPageSize); err != nil {
		return err
	}
	if err := inRange("tp_size", l.TPSize, MaxTPSize); err != nil {
		return err
	}
	if h := l.Model.KVHeads; !l.Model.MLA {
		if l.TPSize <= h && h%l.TPSize != 0 {
			return fieldErr("tp_size", "%d KV heads do not divide into %d ranks", h, l.TPSize)
		}
		if l.TPSize > h && l.TPSize%h != 0 {
			return fieldErr("tp_size", "%d ranks cannot replicate %d KV heads evenly", l.TPSize, h)
		}
	}
	if l.Order != NHD && l.Order != HND {
		return fieldErr("kv_order", "missing or unknown value %d", l.Order)
	}
	if l.Arrangement != FullyContiguous && l.Arrangement != LayerSeparate {
		return fieldErr("arrangement", "missing or unknown value %d", l.Arrangement)
	}
	if a := l.Alignment; a == 0 || a > MaxAlignment || a&(a-1) != 0 {
		return fieldErr("alignment", "%d is not a power of two in 1..%d", a, uint64(MaxAlignment))
	}
	if err := inRange("slots", l.Slots, MaxSlots); err != nil {
		return err
	}
	s, err := l.strides()
	if err != nil {
		return err
	}
	if len(l.Regions) != l.TPSize {
		return fieldErr("regions", "%d regions for %d TP ranks", len(l.Regions), l.TPSize)
	}
	for i, r := range l.Regions {
		field := fmt.Sprintf("regions[%d]", i)
		if r.Kind != Host && r.Kind != Pinned && r.Kind != Device {
			return fieldErr(field+".kind", "missing or unknown value %d", r.Kind)
		}
		if r.Size < s.Region {
			return fieldErr(field+".size", "%d bytes cannot hold %d slots of %d bytes (need %d)",
				r.Size, l.Slots, s.Block, s.Region)
		}
		if r.Base%l.Alignment != 0 {
			return fieldErr(field+".base", "%#x is not aligned to %d", r.Base, l.Alignment)
		}
		if r.Base+r.Size < r.Base {
			return fieldErr(field+".size", "base %#x + size %d wraps the address space", r.Base, r.Size)
		}
	}
	return nil
}

// Validate checks a model config.
func (m *ModelConfig) Validate() error {
	if err := m.validate(); err != nil {
		return err
	}
	return nil
}

func (m *ModelConfig) validate() *FieldError {
	if err := inRange("model.layers", m.Layers, MaxLayers); err != nil {
		return err
	}
	if err := inRange("model.kv_heads", m.KVHeads, MaxKVHeads); err != nil {
		return err
	}
	if err := inRange("model.head_dim", m.HeadDim, MaxHeadDim); err != nil {
		return err
	}
	if !m.DType.Valid() {
		return fieldErr("model.dtype", "missing or unknown value %d", m.DType)
	}
	return nil
}

func inRange(field string, v, max int) *FieldError {
	if v <= 0 || v > max {
		return fieldErr(field, "%d is not in 1..%d", v, max)
	}
	return nil
}

// mulAll multiplies with overflow detection.
func mulAll(vs ...uint64) (uint64, bool) {
	p := uint64(1)
	for _, v := range vs {
		hi, lo := bits.Mul64(p, v)
		if hi != 0 {
			return 0, false
		}
		p = lo
	}
	return p, true
}

// alignUp rounds v up to a power-of-two alignment.
func alignUp(v, align uint64) (uint64, bool) {
	r := (v + align - 1) &^ (align - 1)
	return r, r >= v
}
