package disk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkStore puts then gets 1 MiB blocks through the store (workers
// doing O_DIRECT pwrite and pread, a data sync and a journal record per
// put, a checksum per get), against the same bytes written and read with
// O_DIRECT by the same number of goroutines on a file of the same file
// system, without a store: x-direct is the store's rate over that baseline.
func BenchmarkStore(b *testing.B) {
	const block, blocks, workers = 1 << 20, 128, 4
	for _, op := range []string{"put", "get"} {
		b.Run(op, func(b *testing.B) {
			dir := b.TempDir()
			base := directBaseline(b, filepath.Join(dir, "baseline"), op, block, blocks, workers)
			// Room for each put to land beside the block it replaces.
			s, err := Open(Config{Dir: filepath.Join(dir, "store"), Bytes: 2 * blocks * block, SlotBytes: block, Workers: workers,
				FileBytes: 64 * block})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			data := make([]byte, block)
			for i := range data {
				data[i] = byte(i * 7)
			}
			ctx := context.Background()
			run := func(put bool) {
				var wg sync.WaitGroup
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						// Page aligned, as pool memory is.
						dst, _ := unix.Mmap(-1, 0, block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
						defer unix.Munmap(dst)
						for h := w; h < blocks; h += workers {
							var err error
							if put {
								err = s.Put(ctx, Key{Hash: uint64(h)}, data)
							} else {
								_, err = s.Get(ctx, Key{Hash: uint64(h)}, dst)
							}
							if err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			}
			if op == "get" {
				run(true)
			}
			b.SetBytes(blocks * block)
			start := time.Now()
			for b.Loop() {
				run(op == "put")
			}
			gbs := float64(b.N) * blocks * block / float64(time.Since(start).Nanoseconds())
			b.ReportMetric(gbs, "GB/s")
			b.ReportMetric(base, "direct-GB/s")
			b.ReportMetric(gbs/base, "x-direct")
		})
	}
}

// directBaseline writes (and for "get", then reads) blocks of block bytes
// with O_DIRECT from workers goroutines, and returns GB/s of the op.
func directBaseline(b *testing.B, path, op string, block, blocks, workers int) float64 {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(block*blocks)); err != nil {
		b.Fatal(err)
	}
	pass := func(write bool) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf, _ := unix.Mmap(-1, 0, block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
				defer unix.Munmap(buf)
				for i := w; i < blocks; i += workers {
					var err error
					if write {
						_, err = unix.Pwrite(int(f.Fd()), buf, int64(i*block))
					} else {
						_, err = unix.Pread(int(f.Fd()), buf, int64(i*block))
					}
					if err != nil {
						panic(fmt.Sprint(err))
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	d := pass(true)
	if op == "get" {
		d = pass(false)
	}
	return float64(block*blocks) / float64(d.Nanoseconds())
}
