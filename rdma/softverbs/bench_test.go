package softverbs_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"
)

// BenchmarkRead: READs between two processes through softverbs (16
// outstanding, each signalled) against the stand-in's wire, one
// process_vm_readv of the same size, measured in the same run; the ratio is
// what softverbs' own costs leave of it.
func BenchmarkRead(b *testing.B) {
	for _, size := range []int{4 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			w := newWorld(b)
			holder, reader := w.pair(pairOpts{readerOpen: "wr=64 cqe=128"})
			src := holder.ok("buf src %d 5", size)
			reader.ok("buf dst %d 0", size)
			pid := holder.ok("pid")["pid"]
			const batch = 256
			us := func(ans map[string]string) time.Duration {
				n, err := strconv.Atoi(ans["us"])
				if err != nil {
					b.Fatalf("answer %v", ans)
				}
				return time.Duration(n) * time.Microsecond
			}
			var read, raw time.Duration
			reads := 0
			b.SetBytes(int64(size) * batch)
			b.ResetTimer()
			for b.Loop() {
				read += us(reader.ok("readloop %d %d %s %s 16", batch, size, src["rkey"], src["addr"]))
				raw += us(reader.ok("rawread %d %d %s %s", batch, size, pid, src["addr"]))
				reads += batch
			}
			b.ReportMetric(float64(size)*float64(reads)/read.Seconds()/1e9, "GB/s-read")
			b.ReportMetric(float64(size)*float64(reads)/raw.Seconds()/1e9, "GB/s-process_vm_readv")
			b.ReportMetric(raw.Seconds()/read.Seconds(), "x-process_vm_readv")
			b.ReportMetric(float64(read.Nanoseconds())/float64(reads), "ns/read")
		})
	}
}
