//go:build cgo && linux

package cuda_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/pool/cuda"
)

// stridedParts cuts count pieces of length bytes, stride apart in device
// memory, into parts of at most chunk bytes packed in the buffer: for an
// upload the device is the destination, for a download the source.
func stridedParts(count, length, stride, chunk uint64, download bool) []cuda.Part {
	var parts []cuda.Part
	per := chunk / length
	for i := uint64(0); i < count; i += per {
		k := min(per, count-i)
		sg := layout.Segment{Length: length, Count: k}
		if download {
			sg.SrcOffset, sg.SrcStride, sg.DstStride = i*stride, stride, length
		} else {
			sg.DstOffset, sg.DstStride, sg.SrcStride = i*stride, stride, length
		}
		parts = append(parts, cuda.Part{Bytes: k * length, Plan: &layout.Plan{Ranks: [][]layout.Segment{{sg}}}})
	}
	return parts
}

// Strided pieces go up and come back through parts of several segments'
// pieces each, every byte in its place, with strides at MaxPitch (one 2-D
// copy a part) and past it (piece by piece).
func TestStagerPlansAtAndPastMaxPitch(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_MEMORY=12G")
	bufs, err := d.NewStagingBuffers(4096, 2)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, bufs)
	const count, length = 5, 1000
	for _, stride := range []uint64{2000, cuda.MaxPitch, cuda.MaxPitch + 1} {
		t.Run(fmt.Sprint(stride), func(t *testing.T) {
			size := (count-1)*stride + length
			dev, err := d.AllocDevice(0, size)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			st, err := bufs.NewStager(0)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			want := pattern(count*length, byte(stride))
			up := stridedParts(count, length, stride, st.Chunk(), false)
			if len(up) < 2 {
				t.Fatalf("%d parts: the test needs several", len(up))
			}
			var off int
			err = st.Upload(context.Background(), up, []cuda.Region{{Addr: dev.Addr(), Size: size}}, func(k int, p []byte) error {
				off += copy(p, want[off:])
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			// Each piece landed at its stride.
			for i := uint64(0); i < count; i++ {
				got := make([]byte, length)
				s, err := d.NewStream(0)
				if err != nil {
					t.Fatal(err)
				}
				if err := s.CopyDtoH(got, dev.Addr()+i*stride); err != nil {
					t.Fatal(err)
				}
				s.Close()
				if !bytes.Equal(got, want[i*length:(i+1)*length]) {
					t.Fatalf("piece %d not at offset %d", i, i*stride)
				}
			}
			var back []byte
			err = st.Download(context.Background(), stridedParts(count, length, stride, st.Chunk(), true),
				[]cuda.Region{{Addr: dev.Addr(), Size: size}}, func(p []byte) error {
					back = append(back, p...)
					return nil
				})
			if err != nil || !bytes.Equal(back, want) {
				t.Fatalf("download: %v, %d bytes, equal %v", err, len(back), bytes.Equal(back, want))
			}
		})
	}
}

// A part larger than the buffers, or without a plan, is refused before
// anything moves.
func TestStagerRefusesBadParts(t *testing.T) {
	d, _ := openSoft(t)
	st, err := d.NewStager(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, st)
	dev, err := d.AllocDevice(0, 8192)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	plan := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 4097, Count: 1, SrcStride: 4097, DstStride: 4097}}}}
	calls := 0
	for _, parts := range [][]cuda.Part{{{Bytes: 4097, Plan: plan}}, {{Bytes: 10}}} {
		err := st.Upload(context.Background(), parts, []cuda.Region{{Addr: dev.Addr(), Size: 8192}}, func(int, []byte) error { calls++; return nil })
		if !errors.Is(err, cuda.ErrInvalidValue) {
			t.Errorf("%+v: %v, want ErrInvalidValue", parts[0], err)
		}
	}
	if calls != 0 {
		t.Errorf("fill called %d times for refused parts", calls)
	}
	// At the limit it moves.
	at := &layout.Plan{Ranks: [][]layout.Segment{{{Length: 4096, Count: 1, SrcStride: 4096, DstStride: 4096}}}}
	if err := st.Upload(context.Background(), []cuda.Part{{Bytes: 4096, Plan: at}}, []cuda.Region{{Addr: dev.Addr(), Size: 8192}},
		func(int, []byte) error { return nil }); err != nil {
		t.Errorf("a part of exactly the buffer size: %v", err)
	}
}

// Buffers go back for reuse after a stager that finished, and are freed,
// never reused, after one whose copies could not be waited for.
func TestStagingBuffersFreedAfterFailedSynchronize(t *testing.T) {
	d, _ := openSoft(t, "SOFTCUDA_FAIL=cuStreamSynchronize=999@2")
	bufs, err := d.NewStagingBuffers(4096, 4)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, bufs)
	dev, err := d.AllocDevice(0, 3*4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, dev)
	run := func() error {
		st, err := bufs.NewStager(0)
		if err != nil {
			t.Fatal(err)
		}
		err = st.ToDevice(context.Background(), dev.Addr(), 3*4096, func([]byte) error { return nil })
		if err != nil {
			t.Errorf("transfer: %v", err)
		}
		err = st.Close()
		if (err != nil) != errors.Is(err, cuda.ErrUnsynced) {
			t.Errorf("Close returned %v: a failure that does not match ErrUnsynced, or ErrUnsynced without one", err)
		}
		return err
	}
	// The first stream synchronisation (the end of ToDevice) succeeds, the
	// second (Close's) fails.
	if err := run(); err == nil {
		t.Fatal("the injected synchronisation failure was not reported")
	}
	if n := bufs.Kept(); n != 0 {
		t.Errorf("%d buffers kept for reuse after a failed synchronisation, want 0", n)
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	if n := bufs.Kept(); n != 2 {
		t.Errorf("%d buffers kept after a good run, want 2", n)
	}
	if err := bufs.Close(); err != nil {
		t.Fatal(err)
	}
	if n := bufs.Kept(); n != 0 {
		t.Errorf("%d buffers kept after Close", n)
	}
}

// Downloading, the next part is copied out while the consumer sends the
// last, whichever segment each comes from. Each copy sleeps 40 ms
// (SOFTCUDA_COPY_DELAY_US) and so does the consumer: a stager that copied
// a part only after the consumer returned would leave at least 40 ms
// between one consumer call's end and the next one's start, every time,
// however loaded the machine. With the copies overlapped, the next part
// is ready when the consumer returns, so some of those gaps are near zero
// (all of them on an idle machine; a loaded one may delay a few).
func TestStagerDownloadOverlapsAcrossSegments(t *testing.T) {
	const step = 40 * time.Millisecond
	d, _ := openSoft(t, fmt.Sprintf("SOFTCUDA_COPY_DELAY_US=%d", step.Microseconds()))
	st, err := d.NewStager(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeT(t, st)
	// Two regions; segment k reads rank k%2.
	var src []cuda.Region
	for range 2 {
		dev, err := d.AllocDevice(0, 8*4096)
		if err != nil {
			t.Fatal(err)
		}
		closeT(t, dev)
		src = append(src, cuda.Region{Addr: dev.Addr(), Size: 8 * 4096})
	}
	var parts []cuda.Part
	for k := range 8 {
		sg := layout.Segment{SrcRank: k % 2, SrcOffset: uint64(k) * 4096, Length: 4096, Count: 1, SrcStride: 4096, DstStride: 4096}
		parts = append(parts, cuda.Part{Bytes: 4096, Plan: &layout.Plan{Ranks: [][]layout.Segment{{sg}}}})
	}
	var gaps []time.Duration
	var returned time.Time
	err = st.Download(context.Background(), parts, src, func(p []byte) error {
		if !returned.IsZero() {
			gaps = append(gaps, time.Since(returned))
		}
		time.Sleep(step)
		returned = time.Now()
		return nil
	})
	if err != nil || len(gaps) != 7 {
		t.Fatalf("download: %v after %d parts", err, len(gaps)+1)
	}
	t.Logf("between the consumer's calls: %v", gaps)
	if slices.Min(gaps) >= step/2 {
		t.Errorf("every part waited %v or more for its copy after the consumer returned (%v): copies do not overlap the consumer", slices.Min(gaps), gaps)
	}
}

// A transfer or a Close whose stream could not be synchronised returns an
// error that matches ErrUnsynced (and the driver's error); any other
// failure, before or after copies were queued, does not.
func TestStagerUnsyncedError(t *testing.T) {
	fillErr := errors.New("fill failed")
	for _, tc := range []struct {
		name    string
		env     []string
		fill    error   // fill's error for the second part
		bad     bool    // a part larger than the buffers
		upload  error   // matched by Upload's error; nil: none
		close   error   // matched by Close's error; nil: none
		notWant []error // matched by neither
	}{
		{name: "transfer's synchronisation fails", env: []string{"SOFTCUDA_FAIL=cuStreamSynchronize=999@1"},
			upload: cuda.ErrUnsynced},
		{name: "Close's synchronisation fails", env: []string{"SOFTCUDA_FAIL=cuStreamSynchronize=999@2"},
			close: cuda.ErrUnsynced},
		{name: "fill fails, synchronised", fill: fillErr, upload: fillErr,
			notWant: []error{cuda.ErrUnsynced}},
		{name: "fill fails, not synchronised", env: []string{"SOFTCUDA_FAIL=cuStreamSynchronize=999@1"}, fill: fillErr,
			upload: cuda.ErrUnsynced},
		{name: "the second copy fails", env: []string{"SOFTCUDA_FAIL=cuMemcpyHtoDAsync_v2=1@2,cuMemcpy2DAsync_v2=1@2"}, upload: cuda.ErrInvalidValue,
			notWant: []error{cuda.ErrUnsynced}},
		{name: "a part too large", bad: true, upload: cuda.ErrInvalidValue,
			notWant: []error{cuda.ErrUnsynced}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := openSoft(t, tc.env...)
			st, err := d.NewStager(0, 4096)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() }) // its error is the test's
			dev, err := d.AllocDevice(0, 3*4096)
			if err != nil {
				t.Fatal(err)
			}
			closeT(t, dev)
			n := uint64(3 * 4096)
			if tc.bad {
				n = 4097
			}
			var parts []cuda.Part
			for off := uint64(0); off < n; off += 4096 {
				m := uint64(4096)
				if tc.bad {
					m = n
				}
				sg := layout.Segment{DstOffset: off, Length: m, Count: 1, SrcStride: m, DstStride: m}
				parts = append(parts, cuda.Part{Bytes: m, Plan: &layout.Plan{Ranks: [][]layout.Segment{{sg}}}})
			}
			up := st.Upload(context.Background(), parts, []cuda.Region{{Addr: dev.Addr(), Size: 3 * 4096}}, func(k int, p []byte) error {
				if k == 1 {
					return tc.fill
				}
				return nil
			})
			cl := st.Close()
			for _, c := range []struct {
				what string
				err  error
				want error
			}{{"Upload", up, tc.upload}, {"Close", cl, tc.close}} {
				if c.want == nil && c.err != nil || c.want != nil && !errors.Is(c.err, c.want) {
					t.Errorf("%s returned %v, want %v", c.what, c.err, c.want)
				}
				for _, nw := range tc.notWant {
					if errors.Is(c.err, nw) {
						t.Errorf("%s returned %v, which matches %v", c.what, c.err, nw)
					}
				}
			}
		})
	}
}
