package softverbs_test

import (
	"testing"
	"time"
)

// A memfd registered with ibv_reg_dmabuf_mr at an iova, from an offset that
// is not page-aligned, is read by a peer at iova addresses, byte-exact; a
// range past its end is a remote access error.
func TestDmabufMemfd(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	const iova = 0x10000000
	src := holder.ok("buf src 20000 11 dmabuf=1 off=5000 iova=%d", iova)
	if src["addr"] != itoa(iova) {
		t.Fatalf("dma-buf MR addr %s, want the iova %d", src["addr"], iova)
	}
	reader.ok("buf dst 20000 0")
	reader.ok("post wrid=1 sig=1 rkey=%s raddr=%d sge=dst:0:10000,dst:12000:8000", src["rkey"], iova+100)
	reader.expect(5*time.Second, completion{wrID: 1, status: wcSuccess})
	reader.ok("check dst 0 10000 11 100")
	reader.ok("check dst 12000 7900 11 10100")
	reader.ok("post wrid=2 sig=1 rkey=%s raddr=%d sge=dst:0:2", src["rkey"], iova+19999)
	reader.expect(5*time.Second, completion{wrID: 2, status: wcRemAccess})
}

// A descriptor that is not a memfd is refused with EOPNOTSUPP.
func TestDmabufRefusesOtherDescriptors(t *testing.T) {
	w := newWorld(t)
	p := w.open("p", "")
	if ans := p.do("buf x 4096 1 dmabuf=2"); ans != "err reg errno=95" {
		t.Fatalf("dma-buf of /dev/zero: %q, want err reg errno=95", ans)
	}
}

// Memory freed by the GPU driver that exported it (softcuda truncates the
// memfd) reads nothing more through a dma-buf registration: the READ is a
// remote access error, never stale or zero bytes reported as success.
func TestDmabufOfFreedMemory(t *testing.T) {
	w := newWorld(t)
	holder, reader := w.pair(pairOpts{})
	src := holder.ok("buf src 8192 11 dmabuf=1")
	reader.ok("buf dst 8192 0")
	reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:8192", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 1, status: wcSuccess})
	holder.ok("trunc src")
	reader.ok("post wrid=2 sig=1 rkey=%s raddr=%s sge=dst:0:8192", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 2, status: wcRemAccess})
}
