package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvfabric/kvfabric/layout"
)

func runHash(e *env, args []string) error {
	fs := newFlags(e, "hash", "--block-size N [--salt S] [--lora L] [TOKEN ...]", `
Prints the block hashes of a token sequence, one line per full block:
INDEX LOCAL_HASH SEQUENCE_HASH, in decimal. Token ids (u32) come from the
arguments or, when there are none, from standard input, separated by spaces,
commas or newlines. A trailing partial block is not hashed. The hashes are
those of Dynamo's KV router: use this to check an engine's hashes.`)
	blockSize := fs.Int("block-size", 16, "tokens per block (the engine's page size)")
	salt := fs.String("salt", "", "cache namespace, e.g. a model fingerprint (empty: none)")
	lora := fs.String("lora", "", "LoRA adapter name (empty: none)")
	if err := parse(fs, args); err != nil {
		return err
	}
	h, err := layout.NewHasher(*blockSize, layout.HashOptions{Salt: *salt, LoRA: *lora})
	if err != nil {
		return usagef("--block-size %d: must be 1..%d", *blockSize, layout.MaxBlockSize)
	}
	var tokens []uint32
	if fs.NArg() > 0 {
		tokens, err = parseTokens(fs.Args())
	} else {
		tokens, err = readTokens(e.stdin)
	}
	if err != nil {
		return err
	}
	w := bufio.NewWriter(e.stdout)
	for i, b := range h.Sequence(tokens) {
		fmt.Fprintf(w, "%d %d %d\n", i, b.Local, b.Sequence)
	}
	return w.Flush()
}

// splitToken splits on spaces, commas and newlines.
func splitToken(r rune) bool {
	return r == ',' || r == ' ' || r == '\t' || r == '\n' || r == '\r'
}

func parseTokens(fields []string) ([]uint32, error) {
	var out []uint32
	for _, arg := range fields {
		for _, f := range strings.FieldsFunc(arg, splitToken) {
			v, err := strconv.ParseUint(f, 10, 32)
			if err != nil {
				return nil, usagef("token %d: %q is not a u32 token id", len(out), f)
			}
			out = append(out, uint32(v))
		}
	}
	return out, nil
}

func readTokens(r io.Reader) ([]uint32, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	sc.Split(scanTokens)
	var out []uint32
	for sc.Scan() {
		v, err := strconv.ParseUint(sc.Text(), 10, 32)
		if err != nil {
			return nil, usagef("token %d: %q is not a u32 token id", len(out), sc.Text())
		}
		out = append(out, uint32(v))
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, usagef("token %d: longer than 64 KiB, not a token id", len(out))
		}
		return nil, fmt.Errorf("read standard input: %w", err)
	}
	return out, nil
}

// scanTokens is a bufio.SplitFunc for tokens separated by splitToken runes.
func scanTokens(data []byte, atEOF bool) (int, []byte, error) {
	start := 0
	for start < len(data) && splitToken(rune(data[start])) {
		start++
	}
	for i := start; i < len(data); i++ {
		if splitToken(rune(data[i])) {
			return i + 1, data[start:i], nil
		}
	}
	if atEOF && start < len(data) {
		return len(data), data[start:], nil
	}
	return start, nil, nil
}
