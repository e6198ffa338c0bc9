//go:build cgo && linux

package rdma

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kvf_verbs.h"

// kvf_lib holds the libibverbs entry points, looked up once by kvf_load.
struct kvf_lib {
	void *handle;
	struct kvf_ibv_device **(*get_device_list)(int *);
	void (*free_device_list)(struct kvf_ibv_device **);
	const char *(*get_device_name)(struct kvf_ibv_device *);
	uint64_t (*get_device_guid)(struct kvf_ibv_device *);
	struct kvf_ibv_context *(*open_device)(struct kvf_ibv_device *);
	int (*close_device)(struct kvf_ibv_context *);
	int (*query_device)(struct kvf_ibv_context *, struct kvf_ibv_device_attr *);
	int (*query_port)(struct kvf_ibv_context *, uint8_t, struct kvf_ibv_port_attr *);
	int (*query_gid_ex)(struct kvf_ibv_context *, uint32_t, uint32_t, struct kvf_ibv_gid_entry *, uint32_t, size_t);
	int (*query_gid)(struct kvf_ibv_context *, uint8_t, int, union kvf_ibv_gid *);
	struct kvf_ibv_pd *(*alloc_pd)(struct kvf_ibv_context *);
	int (*dealloc_pd)(struct kvf_ibv_pd *);
	struct kvf_ibv_mr *(*reg_mr)(struct kvf_ibv_pd *, void *, size_t, int);
	struct kvf_ibv_mr *(*reg_dmabuf_mr)(struct kvf_ibv_pd *, uint64_t, size_t, uint64_t, int, int);
	int (*dereg_mr)(struct kvf_ibv_mr *);
	struct kvf_ibv_cq *(*create_cq)(struct kvf_ibv_context *, int, void *, void *, int);
	int (*destroy_cq)(struct kvf_ibv_cq *);
	struct kvf_ibv_qp *(*create_qp)(struct kvf_ibv_pd *, struct kvf_ibv_qp_init_attr *);
	int (*modify_qp)(struct kvf_ibv_qp *, struct kvf_ibv_qp_attr *, int);
	int (*query_qp)(struct kvf_ibv_qp *, struct kvf_ibv_qp_attr *, int, struct kvf_ibv_qp_init_attr *);
	int (*destroy_qp)(struct kvf_ibv_qp *);
	const char *(*wc_status_str)(int);
};

// kvf_load opens path and looks up every symbol. It returns 0, or 1 when
// dlopen failed, or 2 when a required symbol is missing; err then holds
// dlerror's text. The caller holds its OS thread so that dlerror reports
// this thread's failure.
static int kvf_load(struct kvf_lib *l, const char *path, char *err, size_t errlen) {
	memset(l, 0, sizeof(*l));
	dlerror();
	l->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!l->handle) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return 1;
	}
	struct { const char *name; void **slot; int optional; } syms[] = {
		{"ibv_get_device_list", (void **)&l->get_device_list, 0},
		{"ibv_free_device_list", (void **)&l->free_device_list, 0},
		{"ibv_get_device_name", (void **)&l->get_device_name, 0},
		{"ibv_get_device_guid", (void **)&l->get_device_guid, 0},
		{"ibv_open_device", (void **)&l->open_device, 0},
		{"ibv_close_device", (void **)&l->close_device, 0},
		{"ibv_query_device", (void **)&l->query_device, 0},
		{"ibv_query_port", (void **)&l->query_port, 0},
		{"_ibv_query_gid_ex", (void **)&l->query_gid_ex, 1},
		{"ibv_query_gid", (void **)&l->query_gid, 0},
		{"ibv_alloc_pd", (void **)&l->alloc_pd, 0},
		{"ibv_dealloc_pd", (void **)&l->dealloc_pd, 0},
		{"ibv_reg_mr", (void **)&l->reg_mr, 0},
		{"ibv_reg_dmabuf_mr", (void **)&l->reg_dmabuf_mr, 1},
		{"ibv_dereg_mr", (void **)&l->dereg_mr, 0},
		{"ibv_create_cq", (void **)&l->create_cq, 0},
		{"ibv_destroy_cq", (void **)&l->destroy_cq, 0},
		{"ibv_create_qp", (void **)&l->create_qp, 0},
		{"ibv_modify_qp", (void **)&l->modify_qp, 0},
		{"ibv_query_qp", (void **)&l->query_qp, 0},
		{"ibv_destroy_qp", (void **)&l->destroy_qp, 0},
		{"ibv_wc_status_str", (void **)&l->wc_status_str, 0},
	};
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		dlerror();
		void *p = dlsym(l->handle, syms[i].name);
		const char *e = dlerror();
		if (e != NULL || p == NULL) {
			if (syms[i].optional) {
				*syms[i].slot = NULL;
				continue;
			}
			snprintf(err, errlen, "%s: %s", syms[i].name, e ? e : "resolves to NULL");
			dlclose(l->handle);
			l->handle = NULL;
			return 2;
		}
		*syms[i].slot = p;
	}
	return 0;
}

static void kvf_unload(struct kvf_lib *l) {
	if (l->handle) dlclose(l->handle);
	l->handle = NULL;
}

static struct kvf_ibv_device **kvf_get_device_list(struct kvf_lib *l, int *n) { return l->get_device_list(n); }
static void kvf_free_device_list(struct kvf_lib *l, struct kvf_ibv_device **d) { l->free_device_list(d); }
static struct kvf_ibv_device *kvf_device_at(struct kvf_ibv_device **d, int i) { return d[i]; }
static const char *kvf_get_device_name(struct kvf_lib *l, struct kvf_ibv_device *d) { return l->get_device_name(d); }
static uint64_t kvf_get_device_guid(struct kvf_lib *l, struct kvf_ibv_device *d) { return l->get_device_guid(d); }
static struct kvf_ibv_context *kvf_open_device(struct kvf_lib *l, struct kvf_ibv_device *d) { return l->open_device(d); }
static int kvf_close_device(struct kvf_lib *l, struct kvf_ibv_context *c) { return l->close_device(c); }
static int kvf_query_device(struct kvf_lib *l, struct kvf_ibv_context *c, struct kvf_ibv_device_attr *a) {
	memset(a, 0, sizeof(*a));
	return l->query_device(c, a);
}
// As verbs.h's ___ibv_query_port does when it falls back to the exported
// symbol: zero the structure, then let the library fill what it knows.
static int kvf_query_port(struct kvf_lib *l, struct kvf_ibv_context *c, uint8_t port, struct kvf_ibv_port_attr *a) {
	memset(a, 0, sizeof(*a));
	return l->query_port(c, port, a);
}
static int kvf_has_query_gid_ex(struct kvf_lib *l) { return l->query_gid_ex != NULL; }
static int kvf_query_gid_ex(struct kvf_lib *l, struct kvf_ibv_context *c, uint32_t port, uint32_t idx, struct kvf_ibv_gid_entry *e) {
	memset(e, 0, sizeof(*e));
	return l->query_gid_ex(c, port, idx, e, 0, sizeof(*e));
}
static int kvf_query_gid(struct kvf_lib *l, struct kvf_ibv_context *c, uint8_t port, int idx, union kvf_ibv_gid *g) {
	memset(g, 0, sizeof(*g));
	return l->query_gid(c, port, idx, g);
}
static struct kvf_ibv_pd *kvf_alloc_pd(struct kvf_lib *l, struct kvf_ibv_context *c) { return l->alloc_pd(c); }
static int kvf_dealloc_pd(struct kvf_lib *l, struct kvf_ibv_pd *p) { return l->dealloc_pd(p); }
static struct kvf_ibv_mr *kvf_reg_mr(struct kvf_lib *l, struct kvf_ibv_pd *p, uintptr_t addr, size_t len, int access) {
	return l->reg_mr(p, (void *)addr, len, access);
}
static int kvf_has_reg_dmabuf_mr(struct kvf_lib *l) { return l->reg_dmabuf_mr != NULL; }
static struct kvf_ibv_mr *kvf_reg_dmabuf_mr(struct kvf_lib *l, struct kvf_ibv_pd *p, uint64_t off, size_t len, uint64_t iova, int fd, int access) {
	return l->reg_dmabuf_mr(p, off, len, iova, fd, access);
}
static int kvf_dereg_mr(struct kvf_lib *l, struct kvf_ibv_mr *m) { return l->dereg_mr(m); }
static struct kvf_ibv_cq *kvf_create_cq(struct kvf_lib *l, struct kvf_ibv_context *c, int cqe) {
	return l->create_cq(c, cqe, NULL, NULL, 0);
}
static int kvf_destroy_cq(struct kvf_lib *l, struct kvf_ibv_cq *cq) { return l->destroy_cq(cq); }
static struct kvf_ibv_qp *kvf_create_qp(struct kvf_lib *l, struct kvf_ibv_pd *p, struct kvf_ibv_qp_init_attr *a) { return l->create_qp(p, a); }
static int kvf_modify_qp(struct kvf_lib *l, struct kvf_ibv_qp *qp, struct kvf_ibv_qp_attr *a, int mask) { return l->modify_qp(qp, a, mask); }
static int kvf_query_qp_state(struct kvf_lib *l, struct kvf_ibv_qp *qp, int *state) {
	struct kvf_ibv_qp_attr a;
	struct kvf_ibv_qp_init_attr ia;
	memset(&a, 0, sizeof(a));
	memset(&ia, 0, sizeof(ia));
	int rc = l->query_qp(qp, &a, KVF_IBV_QP_STATE, &ia);
	*state = a.qp_state;
	return rc;
}
static int kvf_destroy_qp(struct kvf_lib *l, struct kvf_ibv_qp *qp) { return l->destroy_qp(qp); }
static const char *kvf_wc_status_str(struct kvf_lib *l, int s) { return l->wc_status_str(s); }

// The data path, as verbs.h's static inline ibv_post_send and ibv_poll_cq.
// On failure *posted says how many of the chain went in before bad_wr.
static int kvf_post_send(struct kvf_ibv_qp *qp, struct kvf_ibv_send_wr *wr, int n, int *posted) {
	struct kvf_ibv_send_wr *bad = NULL;
	int rc = qp->context->ops.post_send(qp, wr, &bad);
	*posted = rc == 0 ? n : (bad ? (int)(bad - wr) : 0);
	if (*posted < 0 || *posted > n) *posted = 0;
	return rc;
}
static int kvf_poll_cq(struct kvf_ibv_cq *cq, int n, struct kvf_ibv_wc *wc) {
	return cq->context->ops.poll_cq(cq, n, wc);
}
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// Library is an opened libibverbs. Its methods may be called concurrently.
type Library struct {
	cfg Config
	lib *C.struct_kvf_lib // C memory: the ops table is read by every call

	mu      sync.Mutex
	closed  bool
	devices map[*Device]struct{}
}

// Open loads libibverbs. A missing library returns an error wrapping
// ErrUnavailable, a library without a required symbol one wrapping
// ErrNotSupported; either says which and why.
func Open(cfg Config) (*Library, error) {
	cfg = cfg.populate()
	l := (*C.struct_kvf_lib)(C.calloc(1, C.size_t(unsafe.Sizeof(C.struct_kvf_lib{}))))
	path := C.CString(cfg.Library)
	defer C.free(unsafe.Pointer(path))
	var msg [512]C.char
	// dlerror's text is per thread: read it on the thread that failed.
	runtime.LockOSThread()
	rc := C.kvf_load(l, path, &msg[0], C.size_t(len(msg)))
	runtime.UnlockOSThread()
	switch rc {
	case 1:
		C.free(unsafe.Pointer(l))
		return nil, fmt.Errorf("rdma: RDMA is off: cannot load %s (%s): %w", cfg.Library, C.GoString(&msg[0]), ErrUnavailable)
	case 2:
		C.free(unsafe.Pointer(l))
		return nil, fmt.Errorf("rdma: RDMA is off: %s lacks a required symbol (%s): %w", cfg.Library, C.GoString(&msg[0]), ErrNotSupported)
	}
	return &Library{cfg: cfg, lib: l, devices: map[*Device]struct{}{}}, nil
}

// Path is the library that was opened.
func (l *Library) Path() string { return l.cfg.Library }

// Close closes every device still open, then the library. Safe twice. Call
// it once every other call on the library, its devices, regions and queue
// pairs has returned: it unloads the code they run.
func (l *Library) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	devs := make([]*Device, 0, len(l.devices))
	for d := range l.devices {
		devs = append(devs, d)
	}
	l.mu.Unlock()
	var errs []error
	for _, d := range devs {
		errs = append(errs, d.Close())
	}
	C.kvf_unload(l.lib)
	C.free(unsafe.Pointer(l.lib))
	return errors.Join(errs...)
}

func (l *Library) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return fmt.Errorf("rdma: library %s: %w", l.cfg.Library, ErrClosed)
	}
	return nil
}

// errnoOf turns a verbs return code into an error: verbs calls return either
// -1 with errno set, or the errno value itself.
func errnoOf(rc C.int, err error) error {
	if rc > 0 {
		return syscall.Errno(rc)
	}
	if err != nil {
		return err
	}
	if rc < 0 {
		return syscall.Errno(-rc)
	}
	return syscall.EIO
}

// deviceList runs fn over the library's device list.
func (l *Library) deviceList(fn func(name string, dev *C.struct_kvf_ibv_device) error) error {
	var n C.int
	list, err := C.kvf_get_device_list(l.lib, &n)
	if list == nil {
		return fmt.Errorf("rdma: RDMA is off: %s lists no devices (%v): %w", l.cfg.Library, errnoOf(-1, err), ErrUnavailable)
	}
	defer C.kvf_free_device_list(l.lib, list)
	if n == 0 {
		return fmt.Errorf("rdma: RDMA is off: %s finds no RDMA devices: %w", l.cfg.Library, ErrUnavailable)
	}
	for i := range int(n) {
		dev := C.kvf_device_at(list, C.int(i))
		if err := fn(C.GoString(C.kvf_get_device_name(l.lib, dev)), dev); err != nil {
			return err
		}
	}
	return nil
}

// Devices describes every device the library finds. No device is an error
// wrapping ErrUnavailable.
func (l *Library) Devices() ([]DeviceInfo, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	var out []DeviceInfo
	err := l.deviceList(func(name string, dev *C.struct_kvf_ibv_device) error {
		ctx, err := C.kvf_open_device(l.lib, dev)
		if ctx == nil {
			return fmt.Errorf("rdma: open device %s: %w", name, errnoOf(-1, err))
		}
		defer C.kvf_close_device(l.lib, ctx)
		info, err := l.describe(name, dev, ctx)
		if err != nil {
			return err
		}
		out = append(out, info)
		return nil
	})
	return out, err
}

// maxGIDs bounds how much of a GID table is read.
const maxGIDs = 1024

func (l *Library) describe(name string, dev *C.struct_kvf_ibv_device, ctx *C.struct_kvf_ibv_context) (DeviceInfo, error) {
	var attr C.struct_kvf_ibv_device_attr
	if rc, err := C.kvf_query_device(l.lib, ctx, &attr); rc != 0 {
		return DeviceInfo{}, fmt.Errorf("rdma: query device %s: %w", name, errnoOf(rc, err))
	}
	guid := uint64(C.kvf_get_device_guid(l.lib, dev))
	// The GUID is big endian in memory; print its bytes in order.
	var gb [8]byte
	*(*uint64)(unsafe.Pointer(&gb[0])) = guid
	info := DeviceInfo{
		Name:            name,
		GUID:            fmt.Sprintf("%02x%02x:%02x%02x:%02x%02x:%02x%02x", gb[0], gb[1], gb[2], gb[3], gb[4], gb[5], gb[6], gb[7]),
		Firmware:        C.GoString(&attr.fw_ver[0]),
		MaxQPWR:         int(attr.max_qp_wr),
		MaxSGE:          int(attr.max_sge),
		MaxCQE:          int(attr.max_cqe),
		MaxQPRdAtom:     int(attr.max_qp_rd_atom),
		MaxQPInitRdAtom: int(attr.max_qp_init_rd_atom),
		MaxMRSize:       uint64(attr.max_mr_size),
	}
	info.PCIAddress, info.NUMANode = devicePCI(l.cfg.SysfsRoot, name)
	for p := 1; p <= int(attr.phys_port_cnt); p++ {
		var pa C.struct_kvf_ibv_port_attr
		if rc, err := C.kvf_query_port(l.lib, ctx, C.uint8_t(p), &pa); rc != 0 {
			return DeviceInfo{}, fmt.Errorf("rdma: query port %s/%d: %w", name, p, errnoOf(rc, err))
		}
		port := PortInfo{
			Number:    p,
			State:     portStateName(int(pa.state)),
			Active:    pa.state == C.KVF_IBV_PORT_ACTIVE,
			LinkLayer: LinkLayer(pa.link_layer),
			MTU:       mtuBytes(int(pa.active_mtu)),
			Width:     uint8(pa.active_width),
			Speed:     uint8(pa.active_speed),
			LID:       uint16(pa.lid),
		}
		// An unspecified link layer is InfiniBand for old providers.
		if port.LinkLayer == LinkLayerUnspecified {
			port.LinkLayer = LinkLayerInfiniBand
		}
		port.Gbps = linkGbps(port.Width, port.Speed)
		var guessed []bool
		for i := 0; i < min(int(pa.gid_tbl_len), maxGIDs); i++ {
			g, fromForm, ok := l.queryGID(name, ctx, p, i, port.LinkLayer)
			if ok {
				port.GIDs = append(port.GIDs, g)
				guessed = append(guessed, fromForm)
			}
		}
		typesByRepeat(port.GIDs, guessed, port.LinkLayer)
		info.Ports = append(info.Ports, port)
	}
	return info, nil
}

// queryGID reads one GID table entry and its type; fromForm says the type
// is a guess from the GID's form (no _ibv_query_gid_ex, no sysfs); ok is
// false for an empty or unreadable entry.
func (l *Library) queryGID(dev string, ctx *C.struct_kvf_ibv_context, port, index int, ll LinkLayer) (g GID, fromForm, ok bool) {
	g = GID{Index: index, Type: GIDTypeUnknown}
	if C.kvf_has_query_gid_ex(l.lib) != 0 {
		var e C.struct_kvf_ibv_gid_entry
		if C.kvf_query_gid_ex(l.lib, ctx, C.uint32_t(port), C.uint32_t(index), &e) == 0 {
			g.Raw = *(*[16]byte)(unsafe.Pointer(&e.gid))
			g.Type = GIDType(e.gid_type)
		}
	}
	if g.Raw == ([16]byte{}) {
		var raw C.union_kvf_ibv_gid
		if C.kvf_query_gid(l.lib, ctx, C.uint8_t(port), C.int(index), &raw) != 0 {
			return g, false, false
		}
		g.Raw = *(*[16]byte)(unsafe.Pointer(&raw))
		g.Type = GIDTypeUnknown
	}
	if g.Raw == ([16]byte{}) {
		return g, false, false
	}
	if g.Type == GIDTypeUnknown {
		g.Type = gidTypeFromSysfs(l.cfg.SysfsRoot, dev, port, index, ll)
	}
	if g.Type == GIDTypeUnknown {
		g.Type = gidTypeFromForm(g, ll)
		fromForm = true
	}
	return g, fromForm, true
}

// Device is one opened port of an RDMA device with its protection domain.
// Its methods may be called concurrently.
type Device struct {
	lib  *Library
	info DeviceInfo
	port PortInfo
	gid  GID
	ctx  *C.struct_kvf_ibv_context
	pd   *C.struct_kvf_ibv_pd

	mu     sync.Mutex
	closed bool
	mrs    map[*MemoryRegion]struct{}
	qps    map[*QueuePair]struct{}
}

// OpenDevice opens port (0 means 1) of the device called name, allocates a
// protection domain and chooses the GID its queue pairs send from. A port
// that is not active, or an Ethernet port without a RoCE v2 GID, is an error
// wrapping ErrUnavailable.
func (l *Library) OpenDevice(name string, port int) (*Device, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	if port == 0 {
		port = 1
	}
	var d *Device
	found := false
	err := l.deviceList(func(n string, dev *C.struct_kvf_ibv_device) error {
		if n != name || found {
			return nil
		}
		found = true
		ctx, err := C.kvf_open_device(l.lib, dev)
		if ctx == nil {
			return fmt.Errorf("rdma: open device %s: %w", name, errnoOf(-1, err))
		}
		d, err = l.setUp(name, port, dev, ctx)
		if err != nil {
			C.kvf_close_device(l.lib, ctx)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, fmt.Errorf("rdma: no RDMA device named %q: %w", name, ErrUnavailable)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		d.close()
		return nil, fmt.Errorf("rdma: library %s: %w", l.cfg.Library, ErrClosed)
	}
	l.devices[d] = struct{}{}
	return d, nil
}

func (l *Library) setUp(name string, port int, dev *C.struct_kvf_ibv_device, ctx *C.struct_kvf_ibv_context) (*Device, error) {
	info, err := l.describe(name, dev, ctx)
	if err != nil {
		return nil, err
	}
	if port < 1 || port > len(info.Ports) {
		return nil, fmt.Errorf("rdma: device %s has ports 1..%d, not %d: %w", name, len(info.Ports), port, ErrInvalidArgument)
	}
	p := info.Ports[port-1]
	if !p.Active {
		return nil, fmt.Errorf("rdma: device %s port %d is %s, not active: %w", name, port, p.State, ErrUnavailable)
	}
	gid, ok := chooseGID(p)
	if !ok {
		return nil, fmt.Errorf("rdma: device %s port %d (ethernet) has no RoCE v2 GID (%d GIDs): %w", name, port, len(p.GIDs), ErrUnavailable)
	}
	if p.LinkLayer == LinkLayerInfiniBand && p.LID == 0 {
		return nil, fmt.Errorf("rdma: device %s port %d (infiniband) has no LID yet (no subnet manager?): %w", name, port, ErrUnavailable)
	}
	pd, err := C.kvf_alloc_pd(l.lib, ctx)
	if pd == nil {
		return nil, fmt.Errorf("rdma: allocate protection domain on %s: %w", name, errnoOf(-1, err))
	}
	return &Device{lib: l, info: info, port: p, gid: gid, ctx: ctx, pd: pd,
		mrs: map[*MemoryRegion]struct{}{}, qps: map[*QueuePair]struct{}{}}, nil
}

// Info describes the device as it was when opened.
func (d *Device) Info() DeviceInfo { return d.info }

// Port describes the opened port.
func (d *Device) Port() PortInfo { return d.port }

// GID is the GID queue pairs send from (Ethernet), zero on InfiniBand.
func (d *Device) GID() GID { return d.gid }

// Close closes the device's queue pairs and memory regions, then the
// device. Safe twice.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	qps := make([]*QueuePair, 0, len(d.qps))
	for q := range d.qps {
		qps = append(qps, q)
	}
	mrs := make([]*MemoryRegion, 0, len(d.mrs))
	for m := range d.mrs {
		mrs = append(mrs, m)
	}
	d.mu.Unlock()
	var errs []error
	for _, q := range qps {
		errs = append(errs, q.Close())
	}
	for _, m := range mrs {
		errs = append(errs, m.Close())
	}
	errs = append(errs, d.close())
	d.lib.mu.Lock()
	delete(d.lib.devices, d)
	d.lib.mu.Unlock()
	return errors.Join(errs...)
}

func (d *Device) close() error {
	var errs []error
	if rc, err := C.kvf_dealloc_pd(d.lib.lib, d.pd); rc != 0 {
		errs = append(errs, fmt.Errorf("rdma: deallocate protection domain of %s: %w", d.info.Name, errnoOf(rc, err)))
	}
	if rc, err := C.kvf_close_device(d.lib.lib, d.ctx); rc != 0 {
		errs = append(errs, fmt.Errorf("rdma: close device %s: %w", d.info.Name, errnoOf(rc, err)))
	}
	return errors.Join(errs...)
}

func (d *Device) add(m *MemoryRegion, q *QueuePair) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return fmt.Errorf("rdma: device %s: %w", d.info.Name, ErrClosed)
	}
	if m != nil {
		d.mrs[m] = struct{}{}
	}
	if q != nil {
		d.qps[q] = struct{}{}
	}
	return nil
}

// accessRead is the only access memory is ever registered with: the device
// may write it locally (READ responses land in it) and peers may read it.
const accessRead = C.KVF_IBV_ACCESS_LOCAL_WRITE | C.KVF_IBV_ACCESS_REMOTE_READ

// MemoryRegion is registered memory. Its methods may be called concurrently.
type MemoryRegion struct {
	dev   *Device
	mr    *C.struct_kvf_ibv_mr
	buf   []byte         // keeps Go memory reachable while registered
	pin   runtime.Pinner // and where it is Go's heap, in place
	addr  uint64
	n     uint64
	lkey  uint32
	rkey  uint32
	stats RegistrationStats

	mu     sync.Mutex
	closed bool
}

// RegisterMemory registers buf (usually a pool's mapped memory) for local
// write and remote read. The region keeps buf reachable and, where it is Go
// memory, pinned (runtime.Pinner) until Close; peers
// may read it, and READ responses may land in it, until then. The time the
// registration took is returned by Stats and logged: registering hundreds of
// GiB takes seconds on real NICs, so do it at start, in parallel (the method
// may be called concurrently), never on the import path.
func (d *Device) RegisterMemory(buf []byte) (*MemoryRegion, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("rdma: register memory on %s: empty buffer: %w", d.info.Name, ErrInvalidArgument)
	}
	if d.info.MaxMRSize > 0 && uint64(len(buf)) > d.info.MaxMRSize {
		return nil, fmt.Errorf("rdma: register %d bytes on %s: more than its max_mr_size %d: %w", len(buf), d.info.Name, d.info.MaxMRSize, ErrInvalidArgument)
	}
	var pin runtime.Pinner
	// The device reads and writes the memory behind Go's back: it must not
	// move while registered (a no-op for memory Go did not allocate).
	pin.Pin(unsafe.SliceData(buf))
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	start := time.Now()
	mr, err := C.kvf_reg_mr(d.lib.lib, d.pd, C.uintptr_t(addr), C.size_t(len(buf)), accessRead)
	if mr == nil {
		pin.Unpin()
		return nil, fmt.Errorf("rdma: register %d bytes at %#x on %s: %w", len(buf), addr, d.info.Name, errnoOf(-1, err))
	}
	m, err := d.finishRegistration(mr, buf, time.Since(start), "memory")
	if err != nil {
		pin.Unpin()
		return nil, err
	}
	m.pin = pin
	return m, nil
}

// RegisterAddr registers length bytes at addr, memory this process may be
// unable to dereference: a GPU's device pointer, which a NIC reaches through
// the kernel's peer-memory client (nvidia-peermem) where dma-buf is missing,
// as NCCL does. Host memory should use RegisterMemory, which keeps the
// slice reachable.
func (d *Device) RegisterAddr(addr, length uint64) (*MemoryRegion, error) {
	if addr == 0 || length == 0 || addr+length < addr {
		return nil, fmt.Errorf("rdma: register %d bytes at %#x on %s: %w", length, addr, d.info.Name, ErrInvalidArgument)
	}
	if d.info.MaxMRSize > 0 && length > d.info.MaxMRSize {
		return nil, fmt.Errorf("rdma: register %d bytes on %s: more than its max_mr_size %d: %w", length, d.info.Name, d.info.MaxMRSize, ErrInvalidArgument)
	}
	start := time.Now()
	mr, err := C.kvf_reg_mr(d.lib.lib, d.pd, C.uintptr_t(addr), C.size_t(length), accessRead)
	if mr == nil {
		return nil, fmt.Errorf("rdma: register %d bytes at %#x on %s: %w", length, addr, d.info.Name, errnoOf(-1, err))
	}
	return d.finishRegistration(mr, nil, time.Since(start), "device pointer")
}

// RegisterDmabuf registers length bytes at offset of the dma-buf fd (GPU
// memory), addressed by peers from iova, for local write and remote read. A
// library without ibv_reg_dmabuf_mr returns an error wrapping
// ErrNotSupported: register a host pointer instead.
func (d *Device) RegisterDmabuf(fd int, offset, length, iova uint64) (*MemoryRegion, error) {
	if C.kvf_has_reg_dmabuf_mr(d.lib.lib) == 0 {
		return nil, fmt.Errorf("rdma: %s has no ibv_reg_dmabuf_mr: dma-buf registration: %w", d.lib.cfg.Library, ErrNotSupported)
	}
	if fd < 0 || length == 0 {
		return nil, fmt.Errorf("rdma: register dma-buf fd %d length %d: %w", fd, length, ErrInvalidArgument)
	}
	start := time.Now()
	mr, err := C.kvf_reg_dmabuf_mr(d.lib.lib, d.pd, C.uint64_t(offset), C.size_t(length), C.uint64_t(iova), C.int(fd), accessRead)
	if mr == nil {
		return nil, fmt.Errorf("rdma: register dma-buf fd %d (%d bytes at offset %d) on %s: %w", fd, length, offset, d.info.Name, errnoOf(-1, err))
	}
	return d.finishRegistration(mr, nil, time.Since(start), "dma-buf")
}

func (d *Device) finishRegistration(mr *C.struct_kvf_ibv_mr, buf []byte, took time.Duration, kind string) (*MemoryRegion, error) {
	m := &MemoryRegion{dev: d, mr: mr, buf: buf,
		addr: uint64(uintptr(mr.addr)), n: uint64(mr.length), lkey: uint32(mr.lkey), rkey: uint32(mr.rkey),
		stats: RegistrationStats{Bytes: uint64(mr.length), Duration: took}}
	if err := d.add(m, nil); err != nil {
		C.kvf_dereg_mr(d.lib.lib, mr)
		return nil, err
	}
	d.lib.cfg.Logger.Info("rdma: registered "+kind, "device", d.info.Name, "bytes", m.n, "duration", took)
	return m, nil
}

// Addr is the address peers read from (the registered address or iova).
func (m *MemoryRegion) Addr() uint64 { return m.addr }

// Len is the registered length in bytes.
func (m *MemoryRegion) Len() uint64 { return m.n }

// LKey is the key local scatter entries name.
func (m *MemoryRegion) LKey() uint32 { return m.lkey }

// RKey is the key peers read with; hand it out only over the authenticated
// control channel.
func (m *MemoryRegion) RKey() uint32 { return m.rkey }

// Stats says what the registration cost.
func (m *MemoryRegion) Stats() RegistrationStats { return m.stats }

// Close deregisters the memory. Safe twice.
func (m *MemoryRegion) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	d := m.dev
	d.mu.Lock()
	delete(d.mrs, m)
	d.mu.Unlock()
	rc, err := C.kvf_dereg_mr(d.lib.lib, m.mr)
	runtime.KeepAlive(m.buf)
	m.pin.Unpin()
	m.buf = nil
	if rc != 0 {
		return fmt.Errorf("rdma: deregister %d bytes on %s: %w", m.n, d.info.Name, errnoOf(rc, err))
	}
	return nil
}

type qpState int

const (
	qpReset qpState = iota
	qpReady
	qpFailed
	qpClosed
)

// wcBatch is how many completions one poll takes.
const wcBatch = 32

// QueuePair is an RC queue pair with its own completion queue. Read, Connect,
// Reset and Close may be called from any goroutine; they run one at a time
// (a second Read waits for the first).
type QueuePair struct {
	dev  *Device
	opts QPOptions

	mu     sync.Mutex
	state  qpState
	qp     *C.struct_kvf_ibv_qp
	cq     *C.struct_kvf_ibv_cq
	wrs    []C.struct_kvf_ibv_send_wr // C memory, SendDepth entries
	sges   []C.struct_kvf_ibv_sge     // C memory, SendDepth*MaxSGE entries
	wcs    []C.struct_kvf_ibv_wc      // C memory, wcBatch entries
	psn    uint32
	seq    uint64
	remote Endpoint
	cpu    time.Duration // ReadCPU
}

// NewQueuePair creates an RC queue pair and its completion queue, its depths
// clamped to the device's limits (Options says what they became).
func (d *Device) NewQueuePair(o QPOptions) (*QueuePair, error) {
	o, err := o.populate(d.info)
	if err != nil {
		return nil, err
	}
	q := &QueuePair{dev: d, opts: o, psn: newPSN()}
	cq, err := C.kvf_create_cq(d.lib.lib, d.ctx, C.int(o.SendDepth))
	if cq == nil {
		return nil, fmt.Errorf("rdma: create completion queue of %d on %s: %w", o.SendDepth, d.info.Name, errnoOf(-1, err))
	}
	q.cq = cq
	var ia C.struct_kvf_ibv_qp_init_attr
	ia.send_cq = cq
	ia.recv_cq = cq
	ia.cap.max_send_wr = C.uint32_t(o.SendDepth)
	ia.cap.max_send_sge = C.uint32_t(o.MaxSGE)
	ia.cap.max_recv_wr = 1
	ia.cap.max_recv_sge = 1
	ia.qp_type = C.KVF_IBV_QPT_RC
	ia.sq_sig_all = 0
	qp, err := C.kvf_create_qp(d.lib.lib, d.pd, &ia)
	if qp == nil {
		C.kvf_destroy_cq(d.lib.lib, cq)
		return nil, fmt.Errorf("rdma: create queue pair (send depth %d, %d sge) on %s: %w", o.SendDepth, o.MaxSGE, d.info.Name, errnoOf(-1, err))
	}
	q.qp = qp
	q.wrs = cArray[C.struct_kvf_ibv_send_wr](o.SendDepth)
	q.sges = cArray[C.struct_kvf_ibv_sge](o.SendDepth * o.MaxSGE)
	q.wcs = cArray[C.struct_kvf_ibv_wc](wcBatch)
	if err := d.add(nil, q); err != nil {
		q.destroy()
		return nil, err
	}
	return q, nil
}

// cArray allocates n zeroed T in C memory.
func cArray[T any](n int) []T {
	var zero T
	p := C.calloc(C.size_t(n), C.size_t(unsafe.Sizeof(zero)))
	if p == nil {
		panic("rdma: out of C memory")
	}
	return unsafe.Slice((*T)(p), n)
}

func cFree[T any](s []T) {
	if len(s) > 0 {
		C.free(unsafe.Pointer(unsafe.SliceData(s)))
	}
}

// Options are the queue pair's options after defaults and clamping.
func (q *QueuePair) Options() QPOptions { return q.opts }

// Endpoint is what the peer needs to connect to this queue pair.
func (q *QueuePair) Endpoint() Endpoint {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.endpoint()
}

func (q *QueuePair) endpoint() Endpoint {
	e := Endpoint{
		QPN:       uint32(q.qp.qp_num),
		PSN:       q.psn,
		MTU:       q.dev.port.MTU,
		LinkLayer: q.dev.port.LinkLayer,
		LID:       q.dev.port.LID,
		ReadDepth: q.opts.ReadDepth,
	}
	if e.LinkLayer == LinkLayerEthernet {
		e.GID = q.dev.gid.Raw
		e.GIDIndex = q.dev.gid.Index
	}
	return e
}

// Connect takes the queue pair from RESET through INIT and RTR to RTS,
// towards remote. The path MTU is the smaller of the two sides'.
func (q *QueuePair) Connect(remote Endpoint) error {
	if err := remote.Validate(); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.state {
	case qpClosed:
		return fmt.Errorf("rdma: connect: queue pair: %w", ErrClosed)
	case qpReady, qpFailed:
		return fmt.Errorf("rdma: connect queue pair %d: it is not in RESET (Reset it first): %w", q.qp.qp_num, ErrInvalidArgument)
	}
	local := q.endpoint()
	if remote.LinkLayer != local.LinkLayer {
		return fmt.Errorf("rdma: connect queue pair %d: local link layer %s, peer's %s: %w", local.QPN, local.LinkLayer, remote.LinkLayer, ErrInvalidArgument)
	}
	l := q.dev.lib.lib
	step := func(name string, a *C.struct_kvf_ibv_qp_attr, mask C.int) error {
		if rc, err := C.kvf_modify_qp(l, q.qp, a, mask); rc != 0 {
			q.state = qpFailed
			return fmt.Errorf("rdma: queue pair %d to %s (peer qpn %d): %w", local.QPN, name, remote.QPN, errnoOf(rc, err))
		}
		return nil
	}

	var a C.struct_kvf_ibv_qp_attr
	a.qp_state = C.KVF_IBV_QPS_INIT
	a.pkey_index = 0
	a.port_num = C.uint8_t(q.dev.port.Number)
	a.qp_access_flags = C.KVF_IBV_ACCESS_REMOTE_READ
	if err := step("INIT", &a, C.KVF_IBV_QP_STATE|C.KVF_IBV_QP_PKEY_INDEX|C.KVF_IBV_QP_PORT|C.KVF_IBV_QP_ACCESS_FLAGS); err != nil {
		return err
	}

	a = C.struct_kvf_ibv_qp_attr{}
	a.qp_state = C.KVF_IBV_QPS_RTR
	mtu := remote.MTU
	if local.MTU > 0 {
		mtu = min(local.MTU, remote.MTU)
	}
	a.path_mtu = C.int(mtuEnum(mtu))
	a.dest_qp_num = C.uint32_t(remote.QPN)
	a.rq_psn = C.uint32_t(remote.PSN)
	a.max_dest_rd_atomic = C.uint8_t(q.opts.ReadDepth)
	a.min_rnr_timer = C.uint8_t(q.opts.MinRNRTimer)
	a.ah_attr.port_num = C.uint8_t(q.dev.port.Number)
	if local.LinkLayer == LinkLayerEthernet {
		a.ah_attr.is_global = 1
		a.ah_attr.grh.dgid = *(*C.union_kvf_ibv_gid)(unsafe.Pointer(&remote.GID))
		a.ah_attr.grh.sgid_index = C.uint8_t(local.GIDIndex)
		a.ah_attr.grh.hop_limit = 64
	} else {
		a.ah_attr.dlid = C.uint16_t(remote.LID)
	}
	if err := step("RTR", &a, C.KVF_IBV_QP_STATE|C.KVF_IBV_QP_AV|C.KVF_IBV_QP_PATH_MTU|C.KVF_IBV_QP_DEST_QPN|
		C.KVF_IBV_QP_RQ_PSN|C.KVF_IBV_QP_MAX_DEST_RD_ATOMIC|C.KVF_IBV_QP_MIN_RNR_TIMER); err != nil {
		return err
	}

	a = C.struct_kvf_ibv_qp_attr{}
	a.qp_state = C.KVF_IBV_QPS_RTS
	a.timeout = C.uint8_t(q.opts.Timeout)
	a.retry_cnt = C.uint8_t(q.opts.RetryCount)
	a.rnr_retry = C.uint8_t(q.opts.RNRRetry)
	a.sq_psn = C.uint32_t(q.psn)
	// Our READs in flight are bounded by what the peer serves at once.
	a.max_rd_atomic = C.uint8_t(min(q.opts.ReadDepth, remote.ReadDepth))
	if err := step("RTS", &a, C.KVF_IBV_QP_STATE|C.KVF_IBV_QP_TIMEOUT|C.KVF_IBV_QP_RETRY_CNT|
		C.KVF_IBV_QP_RNR_RETRY|C.KVF_IBV_QP_SQ_PSN|C.KVF_IBV_QP_MAX_QP_RD_ATOMIC); err != nil {
		return err
	}
	q.remote = remote
	q.state = qpReady
	return nil
}

// Reset moves the queue pair back to RESET (after an error, or to connect it
// to another peer), discards its completions and picks a new PSN.
func (q *QueuePair) Reset() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == qpClosed {
		return fmt.Errorf("rdma: reset: queue pair: %w", ErrClosed)
	}
	var a C.struct_kvf_ibv_qp_attr
	a.qp_state = C.KVF_IBV_QPS_RESET
	if rc, err := C.kvf_modify_qp(q.dev.lib.lib, q.qp, &a, C.KVF_IBV_QP_STATE); rc != 0 {
		q.state = qpFailed
		return fmt.Errorf("rdma: queue pair %d to RESET: %w", q.qp.qp_num, errnoOf(rc, err))
	}
	for C.kvf_poll_cq(q.cq, wcBatch, &q.wcs[0]) > 0 {
	}
	q.psn = newPSN()
	q.remote = Endpoint{}
	q.state = qpReset
	return nil
}

// State is the queue pair's state as the library reports it (ibv_query_qp):
// "RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR".
func (q *QueuePair) State() (string, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == qpClosed {
		return "", fmt.Errorf("rdma: state: queue pair: %w", ErrClosed)
	}
	var s C.int
	if rc, err := C.kvf_query_qp_state(q.dev.lib.lib, q.qp, &s); rc != 0 {
		return "", fmt.Errorf("rdma: query queue pair %d: %w", q.qp.qp_num, errnoOf(rc, err))
	}
	names := []string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}
	if int(s) < len(names) {
		return names[s], nil
	}
	return fmt.Sprintf("state-%d", int(s)), nil
}

// Read performs ops as RDMA READs and returns when all have landed. At most
// SendDepth are in flight; the ops' scatter lists must each have 1..MaxSGE
// entries. An error completion returns an error matching ErrCompletion (a
// *CompletionError naming the status) and leaves the queue pair in the error
// state: Reset and Connect it before the next Read. So does ctx ending while
// requests are in flight; in both cases no request is still writing into
// ops' buffers when Read returns, unless the error says so.
func (q *QueuePair) Read(ctx context.Context, ops []ReadOp) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch q.state {
	case qpClosed:
		return fmt.Errorf("rdma: read: queue pair: %w", ErrClosed)
	case qpReset:
		return fmt.Errorf("rdma: read on queue pair %d: %w", q.qp.qp_num, ErrNotConnected)
	case qpFailed:
		return fmt.Errorf("rdma: read on queue pair %d: it failed earlier; Reset and Connect it: %w", q.qp.qp_num, ErrNotConnected)
	}
	if err := validateOps(ops, q.opts.MaxSGE); err != nil {
		return err
	}
	aborted, err := readAll(ctx, cQueue{q}, ops, readParams{
		depth:       q.opts.SendDepth,
		signalEvery: q.opts.SignalEvery,
		drain:       q.retryBound() + 2*time.Second,
		cpu:         &q.cpu,
	}, &q.seq)
	if aborted {
		q.state = qpFailed
		q.dev.lib.cfg.Logger.Warn("rdma: read failed; queue pair needs reset", "device", q.dev.info.Name, "qpn", uint32(q.qp.qp_num), "peer_qpn", q.remote.QPN, "err", err)
	}
	return err
}

// ReadCPU is the CPU time the threads that posted and polled this queue
// pair's reads have used in them: the host's cost of driving the NIC. With
// a software NIC that moves bytes in ibv_poll_cq (softverbs), its copies
// on that thread are included.
func (q *QueuePair) ReadCPU() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cpu
}

// retryBound is how long the device tries a dead peer before retry-exceeded:
// (retries+1) * 4.096 us * 2^timeout.
func (q *QueuePair) retryBound() time.Duration {
	per := time.Duration(4096<<q.opts.Timeout) * time.Nanosecond
	return time.Duration(int(q.opts.RetryCount)+1) * per
}

// cQueue adapts the queue pair to the read engine; only the goroutine in
// Read (holding q.mu) uses it.
type cQueue struct{ q *QueuePair }

func (c cQueue) post(batch []sendWR) (int, error) {
	q := c.q
	for i, w := range batch {
		wr := &q.wrs[i]
		sg := q.sges[i*q.opts.MaxSGE : i*q.opts.MaxSGE+len(w.op.Local)]
		for j, s := range w.op.Local {
			sg[j].addr = C.uint64_t(s.Addr)
			sg[j].length = C.uint32_t(s.Length)
			sg[j].lkey = C.uint32_t(s.LKey)
		}
		*wr = C.struct_kvf_ibv_send_wr{}
		wr.wr_id = C.uint64_t(w.id)
		wr.sg_list = &sg[0]
		wr.num_sge = C.int(len(sg))
		wr.opcode = C.KVF_IBV_WR_RDMA_READ
		if w.signaled {
			wr.send_flags = C.KVF_IBV_SEND_SIGNALED
		}
		rdma := (*struct {
			remoteAddr uint64
			rkey       uint32
		})(unsafe.Pointer(&wr.wr))
		rdma.remoteAddr = w.op.RemoteAddr
		rdma.rkey = w.op.RKey
		if i+1 < len(batch) {
			wr.next = &q.wrs[i+1]
		}
	}
	var posted C.int
	if rc, err := C.kvf_post_send(q.qp, &q.wrs[0], C.int(len(batch)), &posted); rc != 0 {
		return int(posted), errnoOf(rc, err)
	}
	return len(batch), nil
}

func (c cQueue) poll(out []workCompletion) (int, error) {
	q := c.q
	n := C.kvf_poll_cq(q.cq, C.int(min(len(out), len(q.wcs))), &q.wcs[0])
	if n < 0 {
		return 0, fmt.Errorf("poll_cq returned %d", int(n))
	}
	for i := range int(n) {
		wc := &q.wcs[i]
		out[i] = workCompletion{id: uint64(wc.wr_id), status: int(wc.status), vendorErr: uint32(wc.vendor_err)}
	}
	return int(n), nil
}

func (c cQueue) statusText(s int) string {
	if p := C.kvf_wc_status_str(c.q.dev.lib.lib, C.int(s)); p != nil {
		return C.GoString(p)
	}
	return fmt.Sprintf("status %d", s)
}

func (c cQueue) fail() error {
	var a C.struct_kvf_ibv_qp_attr
	a.qp_state = C.KVF_IBV_QPS_ERR
	if rc, err := C.kvf_modify_qp(c.q.dev.lib.lib, c.q.qp, &a, C.KVF_IBV_QP_STATE); rc != 0 {
		return fmt.Errorf("queue pair %d to ERR: %w", c.q.qp.qp_num, errnoOf(rc, err))
	}
	return nil
}

// Close destroys the queue pair and its completion queue; a Read in progress
// finishes first. Safe twice.
func (q *QueuePair) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.state == qpClosed {
		return nil
	}
	q.state = qpClosed
	d := q.dev
	d.mu.Lock()
	delete(d.qps, q)
	d.mu.Unlock()
	return q.destroy()
}

func (q *QueuePair) destroy() error {
	l := q.dev.lib.lib
	var errs []error
	if rc, err := C.kvf_destroy_qp(l, q.qp); rc != 0 {
		errs = append(errs, fmt.Errorf("rdma: destroy queue pair: %w", errnoOf(rc, err)))
	}
	if rc, err := C.kvf_destroy_cq(l, q.cq); rc != 0 {
		errs = append(errs, fmt.Errorf("rdma: destroy completion queue: %w", errnoOf(rc, err)))
	}
	cFree(q.wrs)
	cFree(q.sges)
	cFree(q.wcs)
	q.wrs, q.sges, q.wcs = nil, nil, nil
	return errors.Join(errs...)
}
