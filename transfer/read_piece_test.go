package transfer

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// countingReader counts the reads that reach it and the bytes they move.
type countingReader struct {
	r            io.Reader
	calls, bytes int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.calls++
	c.bytes += n
	return n, err
}

// TestReadPiece reads a stream as runs of pieces of mixed sizes through
// readPiece: every byte lands where it belongs, and pieces of directPiece
// and more are read from under the buffer, so that the buffer fills with
// no more than the small pieces (and what one read of it took beyond).
func TestReadPiece(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pieces []int
		// maxBuffered bounds the bytes that went through br's buffer.
		maxBuffered int
	}{
		{"large only", []int{8 << 10, 8 << 10, 2 << 20, directPiece}, 0},
		{"small only", []int{256, 256, 100, 1}, 64 << 10},
		{"small then large", []int{256, 8 << 10, 256, 8 << 10, 1 << 20}, 2 * (64 << 10)},
		{"at the limit and under it", []int{directPiece, directPiece - 1, directPiece, directPiece + 1}, 2 * (64 << 10)},
		{"empty", []int{0, 8 << 10, 0}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			total := 0
			for _, n := range tc.pieces {
				total += n
			}
			src := make([]byte, total)
			for i := range src {
				src[i] = byte(i*7 + i>>8)
			}
			under := &countingReader{r: bytes.NewReader(src)}
			br := bufio.NewReaderSize(nil, 64<<10)
			buffered := &countingReader{r: under}
			br.Reset(buffered)
			var got []byte
			for i, n := range tc.pieces {
				p := make([]byte, n)
				if err := readPiece(br, under, p); err != nil {
					t.Fatalf("piece %d of %d bytes: %v", i, n, err)
				}
				got = append(got, p...)
			}
			if !bytes.Equal(got, src) {
				t.Fatal("the pieces differ from the stream")
			}
			if buffered.bytes > tc.maxBuffered {
				t.Errorf("%d bytes went through the buffer, want at most %d", buffered.bytes, tc.maxBuffered)
			}
			if tc.maxBuffered == 0 && under.bytes != total {
				t.Errorf("%d of %d bytes read from under the buffer", under.bytes, total)
			}
		})
	}
}

// TestReadPieceShort: a stream that ends inside a piece is an error, large
// or small.
func TestReadPieceShort(t *testing.T) {
	for _, n := range []int{100, 8 << 10} {
		r := bytes.NewReader(make([]byte, n-1))
		br := bufio.NewReaderSize(r, 64<<10)
		if err := readPiece(br, r, make([]byte, n)); err != io.ErrUnexpectedEOF {
			t.Errorf("piece of %d bytes from %d: %v, want io.ErrUnexpectedEOF", n, n-1, err)
		}
	}
}
