package transfer

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/transfer/transferpb"
)

// A holder's answer on a lane decides what lands in the reader's pieces,
// never where or how much: an answer that announces other than what was
// asked is refused before a byte is read into the destination; one that
// ends early fails with the bytes outside the plan's pieces untouched; one
// that sends more than it announced fills the pieces and no more. Over a
// TCP connection (pieces read with readv on Linux, after the frame
// buffer's read-ahead) and over a connection of another kind (one read per
// piece), with more pieces than one readv takes, strided on both sides.
func TestLaneLyingHolder(t *testing.T) {
	_, _, p, _ := laneSetup(t, 1<<20, true)
	const (
		rows   = 2100 // more than two readv batches of 1024 pieces
		row    = 300
		stride = 1000
		tail   = 100 << 10
	)
	segs := []layout.Segment{
		{SrcRank: 0, DstRank: 0, SrcOffset: 0, DstOffset: 100, Length: row, Count: rows, SrcStride: row, DstStride: stride},
		{SrcRank: 0, DstRank: 1, SrcOffset: rows * row, DstOffset: 5, Length: tail, Count: 1},
	}
	const want = rows*row + tail
	data := make([]byte, want)
	fill(data, 3)
	const guard = 0xEE
	newDst := func() [][]byte {
		dst := [][]byte{bytes.Repeat([]byte{guard}, 100+rows*stride+50), bytes.Repeat([]byte{guard}, 5+tail+50)}
		if _, err := validateReadPlan(segs, dst); err != nil {
			t.Fatal(err)
		}
		return dst
	}
	// expected is dst after an honest answer, and which bytes are pieces.
	expected, inPiece := newDst(), [][]bool{make([]bool, len(newDst()[0])), make([]bool, len(newDst()[1]))}
	src := [][]byte{data}
	execLocal([]layout.Segment{
		{SrcRank: 0, DstRank: 0, SrcOffset: 0, DstOffset: 100, Length: row, Count: rows, SrcStride: row, DstStride: stride},
		{SrcRank: 0, DstRank: 1, SrcOffset: rows * row, DstOffset: 5, Length: tail, Count: 1},
	}, src, expected)
	for _, sg := range segs {
		for i := uint64(0); i < sg.Count; i++ {
			_, off := sg.Piece(i)
			for k := off; k < off+sg.Length; k++ {
				inPiece[sg.DstRank][k] = true
			}
		}
	}
	frame := func(kind byte, total uint64) []byte {
		var b bytes.Buffer
		if err := writeFrame(&b, kind, &transferpb.ReadResponse{TotalBytes: total}, 1<<20); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	extra := append(append([]byte{}, data...), bytes.Repeat([]byte{0x55}, 4096)...)
	for _, tc := range []struct {
		name    string
		answer  []byte
		ok      bool  // the read succeeds
		errIs   error // else the error it matches
		touched bool  // pieces may hold holder bytes
	}{
		{"honest", append(frame(statusOK, want), data...), true, nil, true},
		{"more bytes than announced", append(frame(statusOK, want), extra...), true, nil, true},
		{"announces fewer bytes", append(frame(statusOK, want-1), data...), false, ErrFrame, false},
		{"announces more bytes", append(frame(statusOK, want+1), extra...), false, ErrFrame, false},
		{"announces none", frame(statusOK, 0), false, ErrFrame, false},
		{"ends early", append(frame(statusOK, want), data[:want/2+3]...), false, ErrFrame, true},
		{"ends in the frame", frame(statusOK, want)[:3], false, ErrFrame, false},
		{"unknown status", append(frame(7, want), data...), false, ErrFrame, false},
		{"frame over the cap", []byte{statusOK, 0xff, 0xff, 0xff, 0xff}, false, ErrTooLarge, false},
	} {
		for _, kind := range []string{"tcp", "pipe"} {
			t.Run(tc.name+" over "+kind, func(t *testing.T) {
				c, holder := laneLiarConn(t, kind)
				go func() {
					// The request, then the answer in uneven writes, so that
					// reads end mid-piece; then the connection closes.
					if _, _, err := readFrame(holder, 1<<20); err != nil {
						return
					}
					for a := tc.answer; len(a) > 0; {
						k := min(len(a), 7777)
						if _, err := holder.Write(a[:k]); err != nil {
							return
						}
						a = a[k:]
					}
					holder.Close()
				}()
				lc := &laneConn{c: c, r: bufio.NewReaderSize(c, laneFrameBuf)}
				dst := newDst()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				_, err := p.readLanePart(ctx, lc, 5, 9, segs, dst)
				switch {
				case tc.ok && err != nil:
					t.Fatalf("read failed: %v", err)
				case !tc.ok && !errors.Is(err, tc.errIs):
					t.Fatalf("err %v, want %v", err, tc.errIs)
				}
				for r := range dst {
					for i, b := range dst[r] {
						switch {
						case !inPiece[r][i] && b != guard:
							t.Fatalf("rank %d byte %d, outside every piece, was written (%#x)", r, i, b)
						case inPiece[r][i] && tc.ok && b != expected[r][i]:
							t.Fatalf("rank %d byte %d is %#x, want %#x", r, i, b, expected[r][i])
						case inPiece[r][i] && !tc.touched && b != guard:
							t.Fatalf("rank %d byte %d was written before the answer was checked", r, i)
						}
					}
				}
			})
		}
	}
}

// laneLiarConn is a connection to a fake holder of kind tcp (a loopback
// TCP connection) or pipe (net.Pipe), and the holder's end.
func laneLiarConn(t *testing.T, kind string) (reader, holder net.Conn) {
	t.Helper()
	if kind == "pipe" {
		reader, holder = net.Pipe()
	} else {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if reader, err = net.Dial("tcp", ln.Addr().String()); err != nil {
			t.Fatal(err)
		}
		if holder, err = ln.Accept(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		reader.Close()
		holder.Close()
	})
	return reader, holder
}

// A holder's refusal is kept to MaxErrorMessage bytes of valid UTF-8,
// with its length noted: it reaches logs and engines' errors.
func TestLaneHolderRefusalTextIsBounded(t *testing.T) {
	_, _, p, _ := laneSetup(t, 1<<20, true)
	long := strings.Repeat("é", 100<<10) // 200 KiB, cut mid-rune
	var b bytes.Buffer
	if err := writeFrame(&b, statusError, &transferpb.Error{Code: uint32(CodeLeaseRefused), Message: long}, 1<<20); err != nil {
		t.Fatal(err)
	}
	c, holder := laneLiarConn(t, "pipe")
	go func() {
		if _, _, err := readFrame(holder, 1<<20); err == nil {
			holder.Write(b.Bytes())
		}
		holder.Close()
	}()
	lc := &laneConn{c: c, r: bufio.NewReaderSize(c, laneFrameBuf)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := p.readLanePart(ctx, lc, 5, 9, []layout.Segment{{Length: 100, Count: 1}}, [][]byte{make([]byte, 100)})
	var re *RemoteError
	if !errors.As(err, &re) || !errors.Is(err, ErrLeaseRefused) {
		t.Fatalf("a refusal: %v, want a RemoteError of a refused lease", err)
	}
	if len(re.Message) > MaxErrorMessage || !utf8.ValidString(re.Message) || !strings.HasSuffix(re.Message, fmt.Sprintf("(%d bytes)", len(long))) {
		t.Fatalf("the refusal's text kept: %d bytes, valid UTF-8 %v, ends %q", len(re.Message), utf8.ValidString(re.Message), re.Message[max(0, len(re.Message)-40):])
	}
	for _, n := range []int{MaxErrorMessage, MaxErrorMessage + 1} {
		msg := strings.Repeat("x", n)
		got := errorMessage(msg)
		if n <= MaxErrorMessage && got != msg || len(got) > MaxErrorMessage || errorMessage(got) != got {
			t.Errorf("errorMessage of %d bytes: %d bytes %q...", n, len(got), got[:min(len(got), 20)])
		}
	}
}
