package softverbs_test

import (
	"testing"
	"time"
)

// Devices and GIDs come from the environment: one address per device.
func TestDevicesFromEnvironment(t *testing.T) {
	w := newWorld(t)
	env := []string{"SOFTVERBS_DEVICES=mlx5_0,mlx5_1", "SOFTVERBS_GID_ADDR=10.1.2.3,10.1.2.4"}
	for dev, want := range []string{"00000000000000000000ffff0a010203", "00000000000000000000ffff0a010204"} {
		f := w.open("p", "dev="+itoa(dev), env...)
		if f.gid != want || f.ok("port")["link"] != "2" {
			t.Fatalf("device %d: gid %s, want %s", dev, f.gid, want)
		}
	}
	f := w.open("p", "", "SOFTVERBS_DEVICES=mlx5_0,mlx5_1")
	if f.gid != "00000000000000000000ffff7f000001" {
		t.Fatalf("default GID address: %s, want ::ffff:127.0.0.1", f.gid)
	}
	f.exit()
}

// On an InfiniBand link layer a QP is addressed by LID, without a GRH.
func TestInfinibandLID(t *testing.T) {
	w := newWorld(t)
	env := []string{"SOFTVERBS_LINK_LAYER=infiniband", "SOFTVERBS_GID_ADDR=10.0.0.7"}
	holder := w.open("holder", "", env...)
	reader := w.open("reader", "", env...)
	if holder.lid == "0" || reader.ok("port")["link"] != "1" {
		t.Fatalf("infiniband: lid %s", holder.lid)
	}
	holder.ok("connect %s lid=%s", reader.qpn, reader.lid)
	reader.ok("connect %s lid=%s", holder.qpn, holder.lid)
	src := holder.ok("buf src 4096 3")
	reader.ok("buf dst 4096 0")
	reader.ok("post wrid=1 sig=1 rkey=%s raddr=%s sge=dst:0:4096", src["rkey"], src["addr"])
	reader.expect(5*time.Second, completion{wrID: 1, status: wcSuccess})
	reader.ok("check dst 0 4096 3 0")
}

// SOFTVERBS_DEVICES set and empty: a machine without RDMA devices.
func TestNoDevices(t *testing.T) {
	w := newWorld(t)
	p := w.start("p", "SOFTVERBS_DEVICES=")
	if ans := p.do("open"); ans != "err no device (0)" {
		t.Fatalf("open with no devices: %q", ans)
	}
}
