package membership

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrMalformed is matched by every decoding error: a peer sent bytes that are
// not a valid message.
var ErrMalformed = errors.New("membership: malformed message")

// wireVersion is the first byte of every message this package encodes. A
// decoder refuses versions it does not know rather than guessing.
const wireVersion = 1

// Message types, the second byte of a message.
const (
	msgBatch byte = 1 // event batch, gossiped
	msgState byte = 2 // push/pull state: each origin's latest number
	msgMeta  byte = 3 // node metadata
	msgBye   byte = 4 // a node leaving gracefully, sent just before memberlist's leave
)

// MaxNameLen bounds node names, addresses and other strings on the wire.
const MaxNameLen = 255

func malformed(what string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(what, args...))
}

// reader decodes the primitives of the wire format, remembering the first
// error so that a decoder checks once at the end of each record.
type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string, args ...any) {
	if r.err == nil {
		r.err = malformed(what, args...)
	}
}

func (r *reader) byte(field string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.fail("%s: truncated", field)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint(field string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n == 0 {
		r.fail("%s: truncated", field)
		return 0
	}
	if n < 0 {
		r.fail("%s: varint overflows 64 bits", field)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) u32(field string) uint32 {
	v := r.uvarint(field)
	if v > math.MaxUint32 {
		r.fail("%s: %d overflows 32 bits", field, v)
		return 0
	}
	return uint32(v)
}

func (r *reader) u64le(field string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("%s: truncated", field)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

func (r *reader) u16le(field string) uint16 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 2 {
		r.fail("%s: truncated", field)
		return 0
	}
	v := binary.LittleEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) str(field string) string {
	n := r.uvarint(field + " length")
	if r.err != nil {
		return ""
	}
	if n > MaxNameLen {
		r.fail("%s: length %d exceeds %d", field, n, MaxNameLen)
		return ""
	}
	if uint64(len(r.b)) < n {
		r.fail("%s: truncated", field)
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

// header checks the version and type bytes.
func (r *reader) header(typ byte, what string) {
	v := r.byte(what + " version")
	t := r.byte(what + " type")
	if r.err != nil {
		return
	}
	if v != wireVersion {
		r.fail("%s: unknown version %d", what, v)
	} else if t != typ {
		r.fail("%s: message type %d, want %d", what, t, typ)
	}
}

func (r *reader) end(what string) {
	if r.err == nil && len(r.b) != 0 {
		r.fail("%s: %d trailing bytes", what, len(r.b))
	}
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// A bye names the node that is leaving:
//
//	+---------+------+-------------+-------------+
//	| version | type |    name     | incarnation |
//	|   u8=1  | u8=4 | uvarint+str |   uvarint   |
//	+---------+------+-------------+-------------+

func appendBye(dst []byte, name string, inc uint64) []byte {
	dst = append(dst, wireVersion, msgBye)
	dst = appendStr(dst, name)
	return binary.AppendUvarint(dst, inc)
}

func decodeBye(b []byte) (name string, inc uint64, err error) {
	r := reader{b: b}
	r.header(msgBye, "bye")
	name = r.str("bye name")
	inc = r.uvarint("bye incarnation")
	r.end("bye")
	if r.err == nil && name == "" {
		r.fail("bye: empty name")
	}
	return name, inc, r.err
}
