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

// BenchmarkDirectMemory measures what the memory an O_DIRECT transfer
// reads from or writes into costs on this file system, the rest the same:
// 256 blocks of 260 KiB (a 256 KiB block and its trailer page, as the
// disk tier writes them) written from 8 goroutines then synced once, or
// read back, (a) through one buffer per goroutine used again for every
// block (as the tier benchmarks' bare O_DIRECT baselines do), against (b)
// each block's own memory, 68 MB of distinct bytes (as any copy of
// distinct blocks does: a tier's slots). x-own is (b)'s rate over (a)'s:
// where the disk is a virtual one whose writes and reads are memory
// copies on the host, one buffer used again stays in the caches and (b)
// pays for memory, a bound on a tier measured against (a).
func BenchmarkDirectMemory(b *testing.B) {
	const block, blocks, workers = 260 << 10, 256, 8
	for _, tc := range []struct {
		name    string
		write   bool
		readers int // reads under way at once; 1 reads in order, one at a time
	}{
		{"write", true, workers},
		{"read", false, 1},
		{"read8", false, workers},
	} {
		b.Run(tc.name, func(b *testing.B) {
			f, err := os.OpenFile(filepath.Join(b.TempDir(), "f"), os.O_RDWR|os.O_CREATE|unix.O_DIRECT, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			if err := unix.Fallocate(int(f.Fd()), 0, 0, block*blocks); err != nil {
				b.Fatal(err)
			}
			own, err := unix.Mmap(-1, 0, block*blocks, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
			if err != nil {
				b.Fatal(err)
			}
			defer unix.Munmap(own)
			for i := range own {
				own[i] = byte(i*7 + i>>12)
			}
			bufs := make([][]byte, workers)
			for w := range bufs {
				if bufs[w], err = unix.Mmap(-1, 0, block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE); err != nil {
					b.Fatal(err)
				}
				defer unix.Munmap(bufs[w])
				copy(bufs[w], own[w*block:])
			}
			pass := func(write, reused bool) time.Duration {
				n := workers
				if !write {
					n = tc.readers
				}
				start := time.Now()
				next := make(chan int)
				var wg sync.WaitGroup
				for w := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range next {
							mem := own[i*block : (i+1)*block]
							if reused {
								mem = bufs[w]
							}
							var err error
							if write {
								_, err = unix.Pwrite(int(f.Fd()), mem, int64(i*block))
							} else {
								_, err = unix.Pread(int(f.Fd()), mem, int64(i*block))
							}
							if err != nil {
								b.Error(err)
							}
						}
					}()
				}
				for i := range blocks {
					next <- i
				}
				close(next)
				wg.Wait()
				if write {
					if err := unix.Fdatasync(int(f.Fd())); err != nil {
						b.Fatal(err)
					}
				}
				return time.Since(start)
			}
			// Written once before timing, for every case: a write pass
			// would otherwise pay alone for turning the fallocated
			// extents into written ones. The two passes take turns at
			// going first.
			pass(true, false)
			var reused, distinct time.Duration
			b.SetBytes(2 * block * blocks)
			first := true
			for b.Loop() {
				if first {
					reused += pass(tc.write, true)
					distinct += pass(tc.write, false)
				} else {
					distinct += pass(tc.write, false)
					reused += pass(tc.write, true)
				}
				first = !first
			}
			gb := float64(b.N*block*blocks) / 1e9
			b.ReportMetric(gb/reused.Seconds(), "reused-GB/s")
			b.ReportMetric(gb/distinct.Seconds(), "own-GB/s")
			b.ReportMetric(reused.Seconds()/distinct.Seconds(), "x-own")
		})
	}
}

// BenchmarkBatchCommit splits a batch's time between its writes and its
// commit: batches of 126 blocks of 260 KiB (the disk tier's batch of
// 256 KiB blocks), each written from 8 workers straight from page-aligned
// memory and waited for (writes-ms), then committed (commit-ms: one data
// sync, one journal write and one journal sync). Between iterations the
// blocks are deleted, outside the timing; their records count towards the
// journal's compaction (compactAfter records), so about one commit in 16
// also rewrites the journal, and commit-ms carries that share.
func BenchmarkBatchCommit(b *testing.B) {
	const block, blocks = 260 << 10, 126
	dir := b.TempDir()
	s, err := Open(Config{Dir: filepath.Join(dir, "store"), Bytes: 4 * blocks * block, SlotBytes: block, Workers: 8})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	mem, err := unix.Mmap(-1, 0, blocks*block, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	for i := range mem {
		mem[i] = byte(i*7 + i>>12)
	}
	ctx := context.Background()
	var writes, commits time.Duration
	b.SetBytes(blocks * block)
	for b.Loop() {
		start := time.Now()
		batch := s.NewBatch()
		for i := range blocks {
			batch.Add(ctx, Key{Hash: uint64(i + 1)}, mem[i*block:(i+1)*block])
		}
		for i := range blocks {
			if err := batch.Wait(i); err != nil {
				b.Fatal(err)
			}
		}
		mid := time.Now()
		for i, err := range batch.Commit() {
			if err != nil {
				b.Fatalf("block %d: %v", i, err)
			}
		}
		writes += mid.Sub(start)
		commits += time.Since(mid)
		b.StopTimer()
		for i := range blocks {
			if err := s.Delete(Key{Hash: uint64(i + 1)}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(writes.Microseconds())/1e3/float64(b.N), "writes-ms")
	b.ReportMetric(float64(commits.Microseconds())/1e3/float64(b.N), "commit-ms")
	b.ReportMetric(commits.Seconds()/(writes+commits).Seconds(), "commit/batch")
}
