package rdma

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

var (
	v4mapped  = [16]byte{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 0, 15: 7}
	linkLocal = [16]byte{0: 0xfe, 1: 0x80, 15: 1}
	global6   = [16]byte{0: 0x20, 1: 0x01, 2: 0x0d, 3: 0xb8, 15: 1}
)

func TestChooseGID(t *testing.T) {
	for _, tc := range []struct {
		desc      string
		port      PortInfo
		wantIndex int
		ok        bool
	}{
		{"IPv4-mapped RoCE v2 first", PortInfo{LinkLayer: LinkLayerEthernet, GIDs: []GID{
			{0, linkLocal, GIDTypeRoCEv1}, {1, linkLocal, GIDTypeRoCEv2}, {2, global6, GIDTypeRoCEv2},
			{3, v4mapped, GIDTypeRoCEv1}, {4, v4mapped, GIDTypeRoCEv2}}}, 4, true},
		{"then global IPv6 RoCE v2", PortInfo{LinkLayer: LinkLayerEthernet, GIDs: []GID{
			{0, linkLocal, GIDTypeRoCEv2}, {1, global6, GIDTypeRoCEv2}, {2, v4mapped, GIDTypeRoCEv1}}}, 1, true},
		{"then link-local RoCE v2", PortInfo{LinkLayer: LinkLayerEthernet, GIDs: []GID{
			{0, linkLocal, GIDTypeRoCEv1}, {1, linkLocal, GIDTypeRoCEv2}}}, 1, true},
		{"RoCE v1 only: none", PortInfo{LinkLayer: LinkLayerEthernet, GIDs: []GID{{0, linkLocal, GIDTypeRoCEv1}}}, 0, false},
		{"no GIDs: none", PortInfo{LinkLayer: LinkLayerEthernet}, 0, false},
		{"InfiniBand: index 0, addressed by LID", PortInfo{LinkLayer: LinkLayerInfiniBand, LID: 5, GIDs: []GID{{0, linkLocal, GIDTypeIB}}}, 0, true},
	} {
		g, ok := chooseGID(tc.port)
		if ok != tc.ok || (ok && g.Index != tc.wantIndex) {
			t.Errorf("%s: got index %d ok %v, want %d ok %v", tc.desc, g.Index, ok, tc.wantIndex, tc.ok)
		}
	}
}

func TestGIDTypes(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "class", "infiniband", "mlx5_0", "ports", "1", "gid_attrs", "types")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, "0"), []byte("IB/RoCE v1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "1"), []byte("RoCE v2\n"), 0o644)
	for _, tc := range []struct {
		index int
		ll    LinkLayer
		want  GIDType
	}{
		{0, LinkLayerEthernet, GIDTypeRoCEv1},
		{0, LinkLayerInfiniBand, GIDTypeIB},
		{1, LinkLayerEthernet, GIDTypeRoCEv2},
		{2, LinkLayerEthernet, GIDTypeUnknown},
	} {
		if got := gidTypeFromSysfs(root, "mlx5_0", 1, tc.index, tc.ll); got != tc.want {
			t.Errorf("sysfs type of index %d on %s: %s, want %s", tc.index, tc.ll, got, tc.want)
		}
	}
	for _, tc := range []struct {
		raw  [16]byte
		ll   LinkLayer
		want GIDType
	}{
		{v4mapped, LinkLayerEthernet, GIDTypeRoCEv2},
		{linkLocal, LinkLayerEthernet, GIDTypeRoCEv1},
		{global6, LinkLayerEthernet, GIDTypeUnknown},
		{linkLocal, LinkLayerInfiniBand, GIDTypeIB},
	} {
		if got := gidTypeFromForm(GID{Raw: tc.raw}, tc.ll); got != tc.want {
			t.Errorf("type of %s on %s from its form: %s, want %s", formatGID(tc.raw), tc.ll, got, tc.want)
		}
	}
	if s := (GID{Raw: v4mapped}).String(); s != "0000:0000:0000:0000:0000:ffff:0a00:0007" {
		t.Errorf("GID string %s", s)
	}
}

func TestEndpointValidate(t *testing.T) {
	good := Endpoint{QPN: 0xffffff, PSN: 0xffffff, GID: v4mapped, MTU: 4096, LinkLayer: LinkLayerEthernet, ReadDepth: 255}
	if err := good.Validate(); err != nil {
		t.Fatalf("endpoint at every limit: %v", err)
	}
	ib := Endpoint{QPN: 1, LID: 0xbfff, MTU: 256, LinkLayer: LinkLayerInfiniBand, ReadDepth: 1}
	if err := ib.Validate(); err != nil {
		t.Fatalf("infiniband endpoint at its limits: %v", err)
	}
	for _, tc := range []struct {
		desc string
		mod  func(e *Endpoint)
	}{
		{"qpn 0", func(e *Endpoint) { e.QPN = 0 }},
		{"qpn past 24 bits", func(e *Endpoint) { e.QPN = 1 << 24 }},
		{"psn past 24 bits", func(e *Endpoint) { e.PSN = 1 << 24 }},
		{"mtu 8192", func(e *Endpoint) { e.MTU = 8192 }},
		{"mtu 1500", func(e *Endpoint) { e.MTU = 1500 }},
		{"read depth 0", func(e *Endpoint) { e.ReadDepth = 0 }},
		{"read depth 256", func(e *Endpoint) { e.ReadDepth = 256 }},
		{"ethernet without gid", func(e *Endpoint) { e.GID = [16]byte{} }},
		{"unknown link layer", func(e *Endpoint) { e.LinkLayer = 7 }},
		{"infiniband lid 0", func(e *Endpoint) { e.LinkLayer = LinkLayerInfiniBand; e.LID = 0 }},
		{"infiniband multicast lid", func(e *Endpoint) { e.LinkLayer = LinkLayerInfiniBand; e.LID = 0xc000 }},
	} {
		e := good
		tc.mod(&e)
		if err := e.Validate(); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", tc.desc, err)
		}
	}
}

func TestQPOptionsDefaultsAndClamps(t *testing.T) {
	dev := DeviceInfo{Name: "d", MaxQPWR: 128, MaxSGE: 4, MaxCQE: 64, MaxQPRdAtom: 8, MaxQPInitRdAtom: 16}
	o, err := QPOptions{}.populate(dev)
	if err != nil {
		t.Fatal(err)
	}
	if o.SendDepth != 64 || o.MaxSGE != 4 || o.ReadDepth != 8 || o.SignalEvery != 16 ||
		o.Timeout != 14 || o.RetryCount != 7 || o.RNRRetry != 7 || o.MinRNRTimer != 12 {
		t.Fatalf("defaults clamped to the device: %+v", o)
	}
	o, err = QPOptions{SendDepth: 8, SignalEvery: 100}.populate(DeviceInfo{})
	if err != nil || o.SendDepth != 8 || o.SignalEvery != 8 || o.MaxSGE != 16 {
		t.Fatalf("signal interval above the depth: %+v, %v", o, err)
	}
	for _, tc := range []struct {
		desc string
		o    QPOptions
		ok   bool
	}{
		{"retry 7", QPOptions{RetryCount: 7}, true},
		{"retry 8", QPOptions{RetryCount: 8}, false},
		{"rnr retry 8", QPOptions{RNRRetry: 8}, false},
		{"timeout 31", QPOptions{Timeout: 31}, true},
		{"timeout 32", QPOptions{Timeout: 32}, false},
		{"negative depth", QPOptions{SendDepth: -1}, false},
	} {
		_, err := tc.o.populate(dev)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.desc, err, tc.ok)
		}
	}
}
