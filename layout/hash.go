package layout

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// HashSeed is the seed of the block hash recipe, also used to chain
// sequence hashes.
const HashSeed = 1337

// ErrBlockSize is returned for a block size that is zero or too large.
var ErrBlockSize = errors.New("layout: invalid block size")

// MaxBlockSize bounds the tokens per block accepted by [NewHasher].
const MaxBlockSize = 1 << 16

// BlockHash is the identity of one full token block.
type BlockHash struct {
	// Local is the hash of the block's own tokens.
	Local uint64
	// Sequence is chained over every block up to and including this one:
	// equal sequence hashes mean equal prefixes.
	Sequence uint64
}

// HashOptions namespaces the hashes. Empty strings count as absent.
type HashOptions struct {
	// Salt is a cache namespace, such as a model fingerprint.
	Salt string
	// LoRA is the name of the adapter the tokens were run through.
	LoRA string
}

// Hasher computes block hashes with one block size and namespace. It is a
// value: safe for concurrent use, cheap to copy.
type Hasher struct {
	blockSize int
	seed      uint64
}

// NewHasher returns a Hasher for blocks of blockSize tokens.
func NewHasher(blockSize int, opts HashOptions) (Hasher, error) {
	if blockSize <= 0 || blockSize > MaxBlockSize {
		return Hasher{}, fmt.Errorf("%w: %d (want 1..%d)", ErrBlockSize, blockSize, MaxBlockSize)
	}
	seed := uint64(HashSeed)
	if opts.LoRA != "" {
		seed += xxh3.HashStringSeed(opts.LoRA, 0)
	}
	if opts.Salt != "" {
		seed += xxh3.HashStringSeed(opts.Salt, 1)
	}
	return Hasher{blockSize: blockSize, seed: seed}, nil
}

// BlockSize returns the number of tokens in one block.
func (h Hasher) BlockSize() int { return h.blockSize }

// LocalHash hashes one token block, which must hold exactly BlockSize tokens.
func (h Hasher) LocalHash(tokens []uint32) (uint64, error) {
	if len(tokens) != h.blockSize {
		return 0, fmt.Errorf("layout: token block has %d tokens, want %d", len(tokens), h.blockSize)
	}
	return h.localHash(tokens), nil
}

func (h Hasher) localHash(tokens []uint32) uint64 {
	if littleEndian && len(tokens) > 0 {
		// The recipe hashes the ids as u32 little-endian, which is how
		// they already sit in memory here: hash them in place.
		return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)), h.seed)
	}
	return h.localHashPortable(tokens)
}

func (h Hasher) localHashPortable(tokens []uint32) uint64 {
	// 16 tokens is the common block; keep it on the stack.
	var stack [64]byte
	var buf []byte
	if n := 4 * len(tokens); n <= len(stack) {
		buf = stack[:n]
	} else {
		buf = make([]byte, n)
	}
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(buf[4*i:], t)
	}
	return xxh3.HashSeed(buf, h.seed)
}

var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// ChainHash returns the sequence hash of a block whose parent has sequence
// hash parent and whose own local hash is local. It does not apply to the
// first block of a sequence, whose sequence hash is its local hash.
func ChainHash(parent, local uint64) uint64 {
	var buf [16]byte
	binary.LittleEndian.PutUint64(buf[:8], parent)
	binary.LittleEndian.PutUint64(buf[8:], local)
	return xxh3.HashSeed(buf[:], HashSeed)
}

// Next hashes the block of tokens that follows parent; parent is nil for the
// first block of a sequence. An engine that appends a block calls Next with
// the previous block's hash instead of rehashing the prefix.
func (h Hasher) Next(parent *BlockHash, tokens []uint32) (BlockHash, error) {
	local, err := h.LocalHash(tokens)
	if err != nil {
		return BlockHash{}, err
	}
	if parent == nil {
		return BlockHash{Local: local, Sequence: local}, nil
	}
	return BlockHash{Local: local, Sequence: ChainHash(parent.Sequence, local)}, nil
}

// Sequence hashes every full block of tokens; a trailing partial block is
// not hashed.
func (h Hasher) Sequence(tokens []uint32) []BlockHash {
	n := len(tokens) / h.blockSize
	out := make([]BlockHash, n)
	for i := range n {
		local := h.localHash(tokens[i*h.blockSize : (i+1)*h.blockSize])
		seq := local
		if i > 0 {
			seq = ChainHash(out[i-1].Sequence, local)
		}
		out[i] = BlockHash{Local: local, Sequence: seq}
	}
	return out
}
