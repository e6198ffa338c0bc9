package fabric

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvfabric/kvfabric/fabric/fabricpb"
	"github.com/kvfabric/kvfabric/fabric/index"
	"github.com/kvfabric/kvfabric/layout"
	"github.com/kvfabric/kvfabric/membership"
	"github.com/kvfabric/kvfabric/pool"
	"github.com/kvfabric/kvfabric/pool/cuda"
	"github.com/kvfabric/kvfabric/rdma"
	"github.com/kvfabric/kvfabric/rdma/ofi"
	"github.com/kvfabric/kvfabric/transfer"
	"github.com/kvfabric/kvfabric/transfer/certs"
)

// Agent is the kvfabric node agent. Start makes one; Close stops it.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	baseLog *slog.Logger
	// eventLog writes every record, unfolded (see repeatFolder).
	eventLog *slog.Logger
	started  time.Time

	// storages are the engine pool's memory: one host (or pinned)
	// storage, or one device pool per GPU, storage i on GPU gpus[i]. host
	// is the host storage (shared with engines by descriptor or file), nil
	// for device pools.
	storages []pool.Storage
	host     *pool.HostStorage
	poolKind string // host, pinned or device
	pool     *pool.Pool
	// cuda is open while a device or pinned pool uses it; gpus is nil
	// without device pools. rdmaReg[i] says how the NIC reaches storage
	// i's device pool ("dmabuf", "peer-memory" or "").
	cuda    *cuda.Driver
	gpus    []int
	rdmaReg []string
	staging *cuda.StagingBuffers // pinned buffers for QUIC to and from the GPU; nil without a driver

	index     *index.Index
	owned     *ownedIndex  // with index_mode owned; index is then this node's slice
	service   *peerService // serves peers' calls
	sink      *indexSink   // set before membership starts; nil until then
	transport *transfer.Node
	members   *membership.Membership
	// joined is members from the moment it has started until Close: the
	// transport serves (and asks who is a member) before that, and pool
	// events before that have no one to go to.
	joined   atomic.Pointer[membership.Membership]
	layouts  layoutCache
	peers    peers
	flights  flights
	turn     atomic.Uint64 // rotates imports over equally good holders
	suspects suspects
	links    links // what imports measured of each holder
	// rdmaLib and rdmaDevs are open while RDMA is on; storage i is
	// registered with rdmaDevs[poolNIC[i]].
	rdmaLib  *rdma.Library
	rdmaDevs []*rdma.Device
	poolNIC  []int
	// ofiLib and ofiEp are open while RDMA goes over libfabric (every
	// storage registered with ofiEp).
	ofiLib *ofi.Library
	ofiEp  *ofi.Endpoint
	// poolDevice[i] names the device storage i is registered with, "" for
	// none.
	poolDevice []string
	publish    publishState // the pool goroutine's, in onPoolEvents
	metaPoke   chan struct{}
	done       chan struct{}
	// ctx is the agent's root context, cancelled by Close: work the agent
	// starts on its own (releases, gossip, staged reads it serves) derives
	// its contexts from it, so that none outlives Close.
	ctx    context.Context
	cancel context.CancelFunc

	mu   sync.Mutex // before an engineSet's, a session's and the pool's
	sets map[pool.SetID]*engineSet
	// relocks counts the times a free for room let go of mu to wait for a
	// set's read-ahead and took it again (freeIdleLocked): which sets there
	// are (a.sets, engineSet.freed: freed only under mu), read under mu
	// before, may be stale after. Which sets are in use is not guarded by
	// mu: engine calls take sets up and drop them under the session's and
	// the set's locks alone (attach, detach), so what follows from it
	// (which sets are idle, the shares, the quota without engine_quota)
	// may change while mu is held too. A free checks a set idle under its
	// own lock, so no set in use is freed; a Register reads the rest again
	// after a relock, where the wait gave such changes time, and else acts
	// on what it read, as if the change came just after it. Guarded by mu.
	relocks uint64

	sessMu   sync.Mutex // guards sessions; taken alone
	sessions map[uint64]*session
	// unowned is the implicit session of engine calls that name none: it
	// never ends.
	unowned *session

	engineLn  net.Listener
	engineSrv *grpc.Server
	fdSrv     *fdServer
	memToken  string // what engines send on the descriptor socket without isolation
	httpLn    net.Listener
	httpSrv   *http.Server

	stats counters
	// identity is the node's checked certificate and its CA.
	identity atomic.Pointer[certs.Checked]
	reloadMu sync.Mutex // one Reload at a time

	// isolated: block sets get memory of their own (engine_memory.go);
	// memTokens names it on the descriptor socket, by tokenKey.
	isolated  bool
	hostRDMA  bool       // isolated sets' memory is registered for RDMA set by set
	memMu     sync.Mutex // after an engineSet's, never before
	memTokens map[[32]byte]memoryRef

	closeOnce sync.Once
	closeErr  error
	// stopErr is why the agent stopped by itself, if it did.
	stopErr atomic.Pointer[error]
	wg      sync.WaitGroup

	// reqBudget bounds the engine requests in flight (engine_budget.go).
	reqBudget *requestBudget
	// sessCount bounds the engine sessions open (engine_session_bound.go).
	sessCount *sessionCount
	// health is every peer dial's outcome, per member (peer_health.go).
	health peerHealth

	// pinned is the host pool pinned through the CUDA driver set by set
	// (each isolated set's memory is registered when it is made); nil
	// otherwise.
	pinned *cuda.PinnedStorage
	// tiers are the disk tiers under the pool (tier.go); nil without.
	tiers *tiers
	// tierHeld counts the holders' disk-held copies (tier_holders.go).
	tierHeld index.DiskCopies
	// modeReports are the members reported for keeping the index in
	// another mode (cluster_index_mode.go).
	modeReports modeReports
	// indexBoundWarned is the smallest block size warnIndexBound warned
	// of; 0 before it has.
	indexBoundWarned atomic.Uint64

	// registerMu orders the block sets' making and joining
	// (blockSetForSession): taken before mu, which freeing an idle set
	// for room lets go while it waits for the set's read-ahead
	// (freeIdleLocked), so that no other Register acts meanwhile on what
	// the first saw.
	registerMu sync.Mutex
}

// Start makes an agent from cfg and starts serving. The context bounds the
// start only; Close stops the agent.
func Start(ctx context.Context, cfg Config) (_ *Agent, err error) {
	cfg.populate()
	specs, err := cfg.validate()
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, started: time.Now(), sets: map[pool.SetID]*engineSet{},
		sessions: map[uint64]*session{}, unowned: &session{opened: time.Now(), sets: map[pool.SetID]*engineSet{}},
		metaPoke: make(chan struct{}, 1), done: make(chan struct{})}
	a.ctx, a.cancel = context.WithCancel(context.Background())
	a.peers.report = a.health.record
	if a.log == nil {
		a.log = newLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel) // both validated
	}
	// Identical records in bursts (a peer retrying a refused handshake)
	// are folded into one every repeatWindow, with their count; changes of
	// membership and reloads are all written, through eventLog.
	a.eventLog = a.log.With("node", cfg.NodeName)
	a.log = slog.New(newRepeatFolder(a.log.Handler(), time.Now, afterFunc))
	// Membership names the node in its own records; the rest of the
	// agent's get the attribute here.
	a.baseLog = a.log
	a.log = a.log.With("node", cfg.NodeName)
	defer func() {
		if err != nil {
			a.Close()
		}
	}()
	if err := a.applyDumpable(); err != nil { // before any memory exists
		return nil, err
	}
	// Made so that the engine socket's group can search it where the
	// socket is in it (or below it) and its mode grants the group access.
	dirPerm, dirGid := cfg.dataDirAccess()
	if err := makeDirs(cfg.DataDir, dirPerm, dirGid); err != nil {
		return nil, fmt.Errorf("fabric: data dir: %w", err)
	}
	if cfg.IndexMode == IndexOwned {
		a.owned = newOwnedIndex(a) // before the pools: it keeps their events
	}
	if err := a.startPools(specs); err != nil {
		return nil, err
	}
	ixc := index.DefaultConfig()
	ixc.MaxNodeBlocks, ixc.Self = int64(cfg.IndexMaxNodeBlocks), cfg.NodeName
	if a.index, err = index.New(ixc); err != nil {
		return nil, fmt.Errorf("fabric: index: %w", err)
	}
	if a.tiers != nil {
		// Known now where configured or recorded in a tier's directory;
		// each block set's own size is checked as it is made.
		a.warnIndexBound(uint64(a.tiers.room.Load()), "the tiers' blocks")
	}
	a.service = newPeerService(a)
	if err := a.startTransport(); err != nil {
		return nil, err
	}
	if err := a.registerPools(); err != nil {
		return nil, err
	}
	if err := a.startMembership(ctx); err != nil {
		return nil, err
	}
	a.joined.Store(a.members)
	if a.owned != nil {
		a.owned.start()
	}
	if a.tiers != nil {
		a.tiers.announceAll()
	}
	a.wg.Add(3)
	go a.metaLoop()
	go a.memberLoop()
	go a.peerCheckLoop()
	if err := a.startEngineAPI(); err != nil {
		return nil, err
	}
	if err := a.startHTTP(); err != nil {
		return nil, err
	}
	joined, _ := a.members.Joined()
	a.log.Info("agent started", "gossip", a.members.Addr(), "peer", a.peerAdvertise(),
		"engine_socket", cfg.EngineSocket, "metrics", a.MetricsAddr(), "join", cfg.Join, "joined", joined)
	if !joined {
		a.log.Warn("not joined: no seed answered; retrying with backoff, and /healthz answers 503 until one does",
			"join", cfg.Join, "allow_alone", cfg.AllowAlone)
	}
	return a, nil
}

func (a *Agent) startPools(specs []PoolSpec) error {
	// Engines' block sets come from one pool: over the device pools when
	// there is a GPU for them, else over the host (or pinned) memory.
	st, err := a.makeStorage(specs)
	if err != nil {
		return err
	}
	a.storages = st
	a.rdmaReg, a.poolDevice = make([]string, len(st)), make([]string, len(st))
	pcfg := pool.DefaultConfig()
	pcfg.Logger = a.log
	pcfg.Events = a.onPoolEvents
	if f := a.cfg.hooks.poolEvents; f != nil {
		pcfg.Events = func(b pool.EventBatch) { f(b, a.onPoolEvents) }
	}
	pcfg.MaxLeaseBlocks = transfer.MaxLeaseBlocks
	a.poolRecycling(&pcfg)
	if len(a.cfg.Tiers) > 0 {
		if a.tiers, err = openTiers(a, a.cfg.tierSpecs()); err != nil {
			return err
		}
		pcfg.Offload, pcfg.OffloadWatermark, pcfg.OffloadInFlight = a.tiers.offer, a.cfg.TierWatermark, a.cfg.TierInFlight
		pcfg.OffloadGiveUp, pcfg.OffloadTake = true, a.tiers.take // an allocation never waits for the disk
		pcfg.OffloadSkips = a.tiers.refuses
		if pcfg.OffloadWatermark == 0 && a.poolKind == "device" {
			pcfg.OffloadWatermark = deviceOffloadWatermark
		}
	}
	p, err := pool.NewSpanning(st, pcfg)
	if err != nil {
		return fmt.Errorf("fabric: pool: %w", err)
	}
	a.pool = p
	return nil
}

// makeHostStorage makes the host pool spec asks for: pinned through the
// CUDA driver when it is open (a.cuda), else locked with mlock.
func (a *Agent) makeHostStorage(spec PoolSpec) (pool.Storage, error) {
	hc := pool.HostConfig{
		Size:   spec.Size,
		Name:   "kvfabric-" + a.cfg.NodeName,
		Lock:   spec.Kind == "pinned" && a.cuda == nil,
		Logger: a.log,
	}
	if a.cfg.MemoryDir != "" {
		// Engines that share the directory (a hostPath) open the file by
		// name; it must be traversable by them, hence not 0700, but not
		// listable: an engine opens the files it was told of.
		if err := os.MkdirAll(a.cfg.MemoryDir, 0o711); err != nil {
			return nil, fmt.Errorf("fabric: memory dir: %w", err)
		}
		hc.Backing, hc.Dir = pool.ShmFile, a.cfg.MemoryDir
	}
	if err := a.checkHostPoolFits(spec); err != nil {
		return nil, err
	}
	hs, err := pool.NewHostStorage(hc)
	if err != nil {
		return nil, fmt.Errorf("fabric: %s pool of %d bytes: %w", spec.Kind, spec.Size, err)
	}
	a.host, a.poolKind = hs, spec.Kind
	if a.cfg.MemoryDir != "" {
		// Same access as the engine socket: whoever may register may map.
		if err := a.applySocketAccess(hs.Path(), 0o666); err != nil {
			hs.Close()
			return nil, fmt.Errorf("fabric: memory file: %w", err)
		}
	}
	if spec.Kind != "pinned" || a.cuda == nil {
		if spec.Kind == "pinned" && hs.Kind() != layout.Pinned {
			a.poolKind = "host"
		}
		return hs, nil
	}
	// Range by range: block sets get pages of their own (engine_memory.go),
	// which a registration of the whole pool would not follow.
	ps, err := a.cuda.PinHostRanges(hs)
	if err != nil {
		// The memory is still good host memory; copies to a GPU are
		// slower from it.
		a.log.Warn("cannot pin the host pool through the CUDA driver: it stays pageable", "bytes", hs.Size(), "err", err)
		a.poolKind = "host"
		return hs, nil
	}
	a.log.Info("host pool pinned through the CUDA driver", "bytes", hs.Size(), "by", "block set")
	a.pinned = ps
	return ps, nil
}

func (a *Agent) startEngineAPI() error {
	path := a.cfg.EngineSocket
	if err := removeStaleSocket(path, "engine socket"); err != nil {
		return err
	}
	perm, gid := a.cfg.socketDirAccess()
	if err := makeDirs(filepath.Dir(path), perm, gid); err != nil {
		return fmt.Errorf("fabric: engine socket dir: %w", err)
	}
	a.warnSocketDirs()
	// Bind under a umask-independent mode: make the socket, then set its
	// mode and group before anyone is told where it is.
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("fabric: engine socket: %w", err)
	}
	if err := a.applySocketAccess(path, 0o777); err != nil {
		ln.Close()
		return fmt.Errorf("fabric: engine socket: %w", err)
	}
	a.engineLn = ln
	if a.host != nil {
		// Device memory reaches engines as IPC handles instead.
		if err := a.startFDSocket(); err != nil {
			return err
		}
	}
	// WaitForHandlers: Close must not unmap the pool under a call still
	// writing into it.
	a.reqBudget = newRequestBudget(a.cfg.EngineRequestMemory, a.cfg.EngineSessionRequestMemory)
	if b := a.cfg.hooks.requestBudget; b.total > 0 {
		a.reqBudget = newRequestBudget(b.total, b.perSession)
	}
	a.sessCount = newSessionCount(a.cfg.EngineSessions, a.cfg.EngineSessionsPerProcess)
	a.engineSrv = grpc.NewServer(grpc.MaxRecvMsgSize(MaxEngineMessage), grpc.WaitForHandlers(true), grpc.Creds(peerCreds{}),
		grpc.UnaryInterceptor(a.budgetInterceptor))
	fabricpb.RegisterEngineServer(a.engineSrv, &engineServer{a: a})
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.engineSrv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			a.log.Error("engine API stopped", "err", err)
		}
	}()
	return nil
}

// startFDSocket serves the pool memory's descriptor beside the engine
// socket (see engine_fd_socket.go), with the engine socket's mode and group.
func (a *Agent) startFDSocket() error {
	path := a.cfg.EngineSocket + FDSocketSuffix
	if err := removeStaleSocket(path, "descriptor socket"); err != nil {
		return err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("fabric: descriptor socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := a.applySocketAccess(path, 0o777); err != nil {
		ln.Close()
		return fmt.Errorf("fabric: descriptor socket: %w", err)
	}
	a.isolated = a.isolatable()
	if a.isolated && a.cfg.MemoryDir != "" {
		// Engines map the files of their own sets: the pool's own is the
		// agent's alone.
		if err := os.Chmod(a.host.Path(), 0o600); err != nil {
			ln.Close()
			return fmt.Errorf("fabric: memory file: %w", err)
		}
	}
	if !a.isolated {
		a.log.Warn("engines map the whole host pool: its memory cannot be given to block sets apart",
			"pool", a.poolKind)
		a.memToken = newMemoryToken()
	}
	a.memTokens = map[[32]byte]memoryRef{}
	a.fdSrv = startFDServer(ln, a.memToken, sharedMemory{fd: a.host.FD(), size: a.host.Size()}, a.memoryFor, a.log)
	return nil
}

// applySocketAccess gives path the configured mode (limited to bits in
// allowed) and group. Both were validated.
func (a *Agent) applySocketAccess(path string, allowed os.FileMode) error {
	mode, err := parseSocketMode(a.cfg.EngineSocketMode)
	if err != nil {
		return err
	}
	gid, err := lookupGroup(a.cfg.EngineSocketGroup)
	if err != nil {
		return err
	}
	if gid != os.Getegid() {
		if err := os.Chown(path, -1, gid); err != nil {
			return fmt.Errorf("group %s: %w", a.cfg.EngineSocketGroup, err)
		}
	}
	return os.Chmod(path, mode&allowed)
}

// removeStaleSocket removes a socket left by an agent that died, and
// refuses to start beside one that is alive; what names the socket in
// errors.
func removeStaleSocket(path, what string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fabric: %s: %w", what, err)
	}
	if fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("fabric: %s %s exists and is not a socket", what, path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("fabric: %s %s: another agent is serving it", what, path)
	}
	return os.Remove(path)
}

func (a *Agent) startHTTP() error {
	if a.cfg.MetricsAddr == "off" {
		return nil
	}
	ln, err := net.Listen("tcp", a.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("fabric: metrics address: %w", err)
	}
	a.httpLn = ln
	mux := http.NewServeMux()
	if h := a.cfg.MetricsHandler; h != nil {
		mux.Handle("/metrics", h)
	}
	mux.HandleFunc("/healthz", a.serveHealth)
	a.httpSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error("metrics server stopped", "err", err)
		}
	}()
	return nil
}

// MetricsAddr returns the address /metrics is served on, or "" when off.
func (a *Agent) MetricsAddr() string {
	if a.httpLn == nil {
		return ""
	}
	return a.httpLn.Addr().String()
}

// background runs f on a goroutine that Close waits for.
func (a *Agent) background(f func()) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f()
	}()
}

// GossipAddr returns the address other nodes join this one at.
func (a *Agent) GossipAddr() string { return a.members.Addr().String() }

// EngineSocket returns the path of the engine API socket.
func (a *Agent) EngineSocket() string { return a.cfg.EngineSocket }

// NodeName returns the agent's node name.
func (a *Agent) NodeName() string { return a.cfg.NodeName }

// Done is closed when the agent stops: Close, or by itself (then Err says
// why).
func (a *Agent) Done() <-chan struct{} { return a.done }

// Err returns why the agent stopped by itself: its node name is taken by
// another member (matching membership.ErrNameConflict). Nil otherwise.
func (a *Agent) Err() error {
	if p := a.stopErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Close leaves the cluster and releases everything. It is safe to call
// more than once and returns when every goroutine has stopped.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		var errs []error
		close(a.done)
		a.cancel()
		if a.engineSrv != nil {
			stopped := make(chan struct{})
			go func() { a.engineSrv.GracefulStop(); close(stopped) }()
			select {
			case <-stopped:
			case <-time.After(2 * time.Second):
				// Stop cancels the calls' contexts (imports end within a
				// peer timeout) and waits for them to return.
				a.engineSrv.Stop()
				<-stopped
			}
		}
		if a.fdSrv != nil {
			// Before the memory goes: descriptors in flight stay valid.
			a.fdSrv.close()
		}
		if a.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			errs = append(errs, a.httpSrv.Shutdown(ctx))
			cancel()
		}
		a.joined.Store(nil)
		if a.members != nil {
			// Leave gracefully: others drop our blocks at once instead
			// of after failure detection.
			errs = append(errs, a.members.Close())
		}
		a.peers.closeAll()
		if a.transport != nil {
			errs = append(errs, a.transport.Close())
		}
		errs = append(errs, a.closeRDMA())
		a.mu.Lock()
		for _, es := range a.sets {
			es.mu.Lock()
			for _, m := range es.mem {
				m.rdma = nil // the transport ended every registration
			}
			a.dropSetMemoryLocked(es)
			es.mu.Unlock()
		}
		a.mu.Unlock()
		if a.tiers != nil {
			// Before the pool's memory goes: its workers read from it.
			errs = append(errs, a.tiers.close())
		}
		if a.pool != nil {
			errs = append(errs, a.pool.Close())
		}
		for _, st := range a.storages {
			errs = append(errs, st.Close())
		}
		if a.storages == nil && a.host != nil {
			errs = append(errs, a.host.Close())
		}
		if a.cuda != nil {
			errs = append(errs, a.staging.Close(), a.cuda.Close())
		}
		if a.engineLn != nil {
			os.Remove(a.cfg.EngineSocket)
		}
		a.wg.Wait()
		a.closeErr = errors.Join(errs...)
		a.log.Info("agent stopped")
	})
	return a.closeErr
}

// blockSetFor returns the block set an engine with this layout uses, under
// the implicit session.
func (a *Agent) blockSetFor(engine string, tmpl *layout.Layout) (*engineSet, error) {
	s, err := a.blockSetForSession(a.unowned, engine, tmpl, nil, 0)
	if err != nil {
		return nil, err
	}
	return s.engineSet, nil
}

// blockSetForSession returns the block set an engine with this layout
// uses, one of sess's sets from now: an existing one of the same shape and
// placement (another engine's, or one no session uses any more; see
// reusableSet), or a new one. place is the storage of each rank (placement), nil for the default.
// When the pool has no room for a new one, sets no session uses are freed,
// longest idle first, until it has.
//
// A set is joined only by the process its memory was handed to, or once
// every such process has exited (pid, the caller's process; 0 where
// unknown): see engine_memory.go. pid is recorded as the set's receiver
// before a.mu is let go, in the same hold of the set's lock as the check
// that it may join the set (handOver).
func (a *Agent) blockSetForSession(sess *session, engine string, tmpl *layout.Layout, place []int, pid int32) (*sessionSet, error) {
	// One at a time, even where freeing an idle set for room lets a.mu go
	// while it waits (freeIdleLocked).
	a.registerMu.Lock()
	defer a.registerMu.Unlock()
	a.mu.Lock()
	defer a.mu.Unlock()
	if engine != "" && sess.id != 0 {
		// The engine's own name beats what it opened the session as.
		sess.mu.Lock()
		sess.engine = engine
		sess.mu.Unlock()
	}
	// Nothing may be sized by a request before it is checked.
	if tmpl.TPSize < 1 || tmpl.TPSize > layout.MaxTPSize {
		return nil, &layout.FieldError{Field: "tp_size", Reason: fmt.Sprintf("%d is not in 1..%d", tmpl.TPSize, layout.MaxTPSize)}
	}
	// Fill regions only so that the template validates; the pool places them.
	tmpl.Regions = make([]layout.Region, tmpl.TPSize)
	for r := range tmpl.Regions {
		tmpl.Regions[r] = layout.Region{Size: 1 << 62, Kind: a.storages[0].Kind(), Device: a.storages[0].Device()}
	}
	asked := tmpl.Slots
	if tmpl.Slots == 0 {
		probe := *tmpl
		probe.Slots = 1
		if err := probe.Validate(); err != nil {
			return nil, err
		}
		tmpl.Slots = a.defaultSlots(&probe, place)
	}
	// Chosen again where a set chosen was taken up meanwhile by another
	// process's call (handOver's errJoinedMeanwhile): reusableSet passes
	// over that set while that process runs, so this ends.
	// The tiers' staging sets and engines' sets are never each other's.
	staging := sess == a.unowned && engine == stagingEngine
	var s *engineSet
	for {
		best, own := a.reusableSet(sess, tmpl, asked, place, pid, staging)
		if best == nil || !own && best.set.Usable() < tmpl.Slots {
			// Checked before the quota, which sizes the set from it.
			if err := tmpl.Validate(); err != nil {
				return nil, err
			}
			made, fallback, err := a.newSetForSession(sess, engine, tmpl, asked, place, pid, best)
			if fallback == nil {
				if err != nil {
					return nil, err
				}
				s = made
				break
			}
			best = fallback
		}
		ss, err := a.handOver(sess, best, pid)
		if errors.Is(err, errJoinedMeanwhile) {
			continue
		}
		return ss, err
	}
	s.staging = staging
	set := s.set
	a.sets[set.ID()] = s
	a.pokeMeta()
	a.log.Info("block set made", "engine", engine, "set", set.ID(), "slots", set.Slots(), "tp", tmpl.TPSize,
		"page", tmpl.PageSize, "digest", set.Layout().Digest().Short())
	a.warnIndexBound(tmpl.Strides().Block*uint64(tmpl.TPSize), "a block set's blocks")
	ss, err := a.handOver(sess, s, pid)
	if err != nil {
		// The session ended meanwhile, or a call of another process
		// named the new set by its id and took it up (errJoinedMeanwhile):
		// a set no session uses is idle from now.
		s.mu.Lock()
		if len(s.users) == 0 && !s.freed {
			s.idleSince = time.Now()
			a.scheduleFree(s, a.cfg.BlockSetGrace)
		}
		s.mu.Unlock()
		if errors.Is(err, errJoinedMeanwhile) {
			return nil, status.Errorf(codes.Aborted, "block set %d: made for this Register, and taken up meanwhile by a call of another process that named it; register again", set.ID())
		}
		return nil, err
	}
	return ss, nil
}

// handOver attaches es to sess and records pid as a process es's memory
// is handed to, before a.mu is let go: no other live process's Register
// may join es from then on (reusableSet's mayJoin), though the engine has
// not been answered yet. The record is made in the same hold of es.mu as
// the check that pid may join es and the attach (attachJoining), so that
// no call sees sess use es before pid is checked: a call of another
// process, which takes no a.mu, may have taken es up since reusableSet
// looked at it (its process then recorded as a receiver); nothing is then
// attached or recorded, and errJoinedMeanwhile returned, for the Register
// to choose again. Where the attach fails (the session ended), nothing is
// recorded. A
// receiver recorded for a Register that fails after this (its answer not
// made) keeps other processes off es only while it lives: mayJoin
// forgets it once it has exited (its pidfd). a.mu is held.
func (a *Agent) handOver(sess *session, es *engineSet, pid int32) (*sessionSet, error) {
	if f := a.cfg.hooks.beforeHandOver; f != nil {
		f(es)
	}
	return a.attachJoining(sess, es, pid)
}

// errJoinedMeanwhile is handOver's answer where the set chosen for a
// Register was taken up, since it was chosen, by a call of another
// process that still runs: the Register chooses again.
var errJoinedMeanwhile = errors.New("block set taken up by another process since it was chosen")

// freeUnused frees set, just made and given to no engine, saying msg where
// it cannot be. a.mu is held.
func (a *Agent) freeUnused(set *pool.BlockSet, msg string) {
	if err := a.pool.FreeBlockSet(set.ID()); err != nil {
		a.log.Error(msg, "set", set.ID(), "err", err)
	}
}

// setMemoryError is a new set's memory for engines not made
// (giveSetMemory): the set is freed again, and the Register given its
// fallback where it has one (newSetForSession).
type setMemoryError struct{ err error }

func (e *setMemoryError) Error() string { return e.err.Error() }
func (e *setMemoryError) Unwrap() error { return e.err }

// setMaker makes a Register's new sets: each with its memory for engines
// given (giveSetMemory) before it is handed on, so that a set whose
// memory cannot be made is a set not made, freed again at once
// (setMemoryError), before anything that counts on it (the quota's swap
// freeing the fallback) is done. Where the set is to be made only once
// the fallback is freed (in its room), the memory's files are made first
// (prepare), so that all that can fail then is their placing. a.mu is
// held.
type setMaker struct {
	a      *Agent
	engine string
	tmpl   *layout.Layout
	place  []int
	// made is the last set made, with its memory.
	made *engineSet
	// ready is memory made for the next set (prepare), nil for none.
	ready []*setMemory
}

// prepare makes the files of the next set's memory for engines
// (prepareSetMemory), if not made yet; the error is a setMemoryError.
func (m *setMaker) prepare() error {
	if m.ready != nil {
		return nil
	}
	mem, err := m.a.prepareSetMemory(m.tmpl, 0)
	if err != nil {
		return &setMemoryError{err}
	}
	m.ready = mem
	return nil
}

// make makes a set of tmpl placed as place, with its memory: the files
// prepare made, or made now, placed under it.
func (m *setMaker) make() (*pool.BlockSet, error) {
	a := m.a
	set, err := a.pool.NewBlockSetOn(m.tmpl, m.place)
	if err != nil {
		return nil, err
	}
	es := &engineSet{set: set, engine: m.engine, users: map[uint64]*setUse{}, sums: !a.cfg.NoChecksums, joinToken: newJoinToken()}
	if m.ready != nil {
		err = a.placeSetMemory(es, m.ready) // closed where it fails
		m.ready = nil
	} else {
		err = a.giveSetMemory(es)
	}
	if err != nil {
		a.freeUnused(set, "block set without memory for engines not freed")
		return nil, &setMemoryError{err}
	}
	m.made = es
	return set, nil
}

// unmake frees set, made by make and given to no engine, and its memory,
// saying msg where the pool does not free it.
func (m *setMaker) unmake(set *pool.BlockSet, msg string) {
	m.a.freeUnused(set, msg)
	if es := m.made; es != nil && es.set == set {
		es.mu.Lock()
		es.freed = true
		m.a.dropSetMemoryLocked(es)
		es.mu.Unlock()
		m.made = nil
	}
}

// release closes the memory prepare made for a set not made.
func (m *setMaker) release() {
	m.a.closeSetMemory(m.ready)
	m.ready = nil
}

// newSetForSession makes the block set of blockSetForSession, with its
// memory for engines (setMaker), or returns the set to attach instead:
// best (reusableSet's, nil for none), where the engine's quota or the
// pool has no room for a new one, or where the new set's memory for
// engines cannot be made (giveSetMemory: a section's memory file, its
// mapping or its access; setMemoryError). Where freeing idle sets for
// room let go of a.mu (freeIdleLocked), best may have been freed
// meanwhile (its grace timer): then the choice is made anew, a freed set
// never handed back. Where it let go of a.mu, and no set was made (the
// quota or the pool without room, best kept by the swap, or the new set's
// memory not made), the choice is made anew likewise, with no best too (a
// quota's refusal is the answer only where nothing changed since it was
// looked at): sess may have taken up a set of the layout meanwhile, which
// is given; best may have been taken up by another process's session, and
// is no longer one pid may join (engineSet.mayJoin); sets may have gone
// idle, and the shares and the quota changed (freeIdleSets stops there).
// Where a set was made, sess may have taken up a set of the layout
// meanwhile (its engine's other rank registered it): that set is given,
// the new one freed again; and the quota may have shrunk meanwhile
// (without engine_quota, another engine taking up a set): a new set past
// the quota then is freed again, and the choice made anew with the quota
// as it is; but not where the quota's swap freed best for it
// (swapFallback checks the quota before it frees best, and the engine is
// never left with neither). A set whose memory cannot be made is freed
// again as it is made, before the swap frees best: best is given, as
// where the pool has no room. Where the pool has room for the new set
// only once best is freed, best is freed before the set is made (its
// memory is the room), so only the files of the set's memory are made
// before (setMaker.prepare: their failure gives best likewise); a failure
// to place them under the new set then finds best gone: the choice is
// made anew (the new set tried once more in the room, its memory made
// whole), and where no set is made then either, best's set is made again
// in its room, empty (its cached blocks went with it), and given
// (giveLostFallback), as it is where a later round makes no set either,
// refused by the quota or out of memory (changed meanwhile); only where
// that set is past the quota, does not fit, or its memory fails too is
// the engine told the round's error, which names best as freed, and left
// with neither set, nothing of either held. Each time round a set is gone
// from a.sets, or a.mu was let go for an idle set's read-ahead, after
// which that set is freed, or, not freed (taken up, or busy still: a
// read-ahead that outlived the wait for it), goes into tried, never tried
// again in this Register (best too: the quota's swap is not offered
// again, and best is given unless a set is made without it); and no set
// is made meanwhile (a.registerMu): so it ends. a.mu is held.
func (a *Agent) newSetForSession(sess *session, engine string, tmpl *layout.Layout, asked int, place []int, pid int32, best *engineSet) (*engineSet, *engineSet, error) {
	// What the set's regions will take (setBytes): a region holds every
	// layer of every slot, which Block alone does not where layers are
	// kept apart (LayerSeparate: Block is a slot's stride within a layer).
	// Each region is at most 2^62 bytes (Validate), but 1,024 of them may
	// be more than a uint64 holds: wrapped, the need would pass the quota
	// and idle sets be freed for a set the pool cannot hold.
	region := tmpl.Strides().Region
	hi, need := bits.Mul64(region, uint64(tmpl.TPSize))
	if hi != 0 {
		slots := fmt.Sprintf("%d slots take", tmpl.Slots)
		if asked == 0 {
			slots = fmt.Sprintf("the default slot count, %d, takes", tmpl.Slots)
		}
		return nil, nil, &layout.FieldError{Field: "slots",
			Reason: fmt.Sprintf("%s %d bytes on each of %d ranks, more than 2^64 in all", slots, region, tmpl.TPSize)}
	}
	tried := triedSets{}
	var lost *engineSet // best, freed by the swap for a new set whose memory then failed
	m := &setMaker{a: a, engine: engine, tmpl: tmpl, place: place}
	defer m.release()
	for again := false; ; again = true {
		if f := a.cfg.hooks.registerRound; f != nil {
			f()
		}
		if again {
			var own bool
			best, own = a.reusableSet(sess, tmpl, asked, place, pid, sess == a.unowned && engine == stagingEngine)
			if best != nil && (own || best.set.Usable() >= tmpl.Slots) {
				return nil, best, nil
			}
		}
		relocks := a.relocks
		may, swap, err := a.makeRoomInQuota(engine, need, best, tried)
		if err != nil {
			if relocks != a.relocks || best != nil && setFreed(best) {
				// The sets sess uses and may join, and what is idle,
				// looked at anew (with no fallback too), or best freed.
				continue
			}
			if best != nil {
				return nil, best, nil // the layout's set with the most usable slots is the best there is
			}
			if lost != nil {
				return a.giveLostFallback(engine, lost, place, err)
			}
			return nil, nil, err
		}
		// best stays: it is what this Register falls back to.
		var set *pool.BlockSet
		if swap {
			set, err = a.swapFallback(engine, need, tmpl, place, m.make, m.unmake, m.prepare, may, best, tried) // within the quota once best is freed
		} else {
			set, err = a.freeIdleSets(m.make, may, best, tried)
		}
		if err == nil && relocks != a.relocks {
			if mine, own := a.reusableSet(sess, tmpl, asked, place, pid, sess == a.unowned && engine == stagingEngine); own {
				m.unmake(set, "block set made while its session took up another of the layout not freed")
				return nil, mine, nil
			}
			if !swap && !a.withinQuota(engine, need) { // a swap's best is gone
				m.unmake(set, "block set made past its engine's quota not freed")
				continue
			}
		}
		if err == nil {
			return m.made, nil, nil
		}
		if swap && best != nil && setFreed(best) && errors.As(err, new(*setMemoryError)) {
			lost = best // freed for the new set's room, in which its memory then failed
		}
		if best != nil && setFreed(best) {
			continue
		}
		var merr *setMemoryError
		if relocks != a.relocks && (errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, errFallbackKept) || errors.As(err, &merr)) {
			continue // what is idle, the shares and the quota, looked at anew
		}
		if best != nil && (errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, errFallbackKept)) {
			// No room for a set of the size asked (or the default): the
			// layout's set with the most usable slots is the best there
			// is.
			return nil, best, nil
		}
		if best != nil && errors.As(err, &merr) {
			// The new set freed again, best kept (the swap frees it only
			// once the new set has its memory): the engine keeps its
			// cache, as if the swap had not been tried.
			a.log.Warn("block set not made: its memory for engines failed; the engine is given the set it has",
				"engine", engine, "set", best.set.ID(), "err", merr.err)
			return nil, best, nil
		}
		if lost != nil {
			return a.giveLostFallback(engine, lost, place, err)
		}
		return nil, nil, err
	}
}

// giveLostFallback is newSetForSession's answer where no set is made and
// nothing is given after the quota's swap freed lost, the set the engine
// would have fallen back to, for the new set's room, in which the new
// set's memory then failed: in that round, or in a later one, refused by
// the quota or out of memory (the shares, the quota or the pool changed
// meanwhile, or the failed set's room did not come back). lost's set is
// made again, empty, and given (remakeFallback), rather than the engine
// left with neither; where it cannot be, the engine is told err, which
// names lost as freed. a.mu is held.
func (a *Agent) giveLostFallback(engine string, lost *engineSet, place []int, err error) (*engineSet, *engineSet, error) {
	es, rerr := a.remakeFallback(engine, lost, place)
	if es != nil {
		a.log.Warn("block set not made, where the set the engine would have fallen back to was freed for its room; that set is made again, empty, and given",
			"engine", engine, "freed", lost.set.ID(), "set", es.set.ID(), "err", err)
		return es, nil, nil
	}
	a.log.Warn("block set not made, where the set the engine would have fallen back to was freed for its room, and that set could not be made again; the engine is told the error and has neither set",
		"engine", engine, "freed", lost.set.ID(), "err", err, "again", rerr)
	return nil, nil, fmt.Errorf("%w (the engine's idle block set %d of the layout, freed for the new set's room, is gone with its cached blocks, and could not be made again: %v)",
		err, lost.set.ID(), rerr)
}

// remakeFallback makes lost's set again, empty (its cached blocks went
// with it), of its layout and slots, placed as place, with its memory for
// engines, where the quota's swap freed lost for the new set's room and
// no set was made after (giveLostFallback): the engine is given a set of
// the layout, as it would have been given lost had the failure come
// before lost was freed, rather than neither. It is nil, with why, where
// it is past the engine's quota as it is now (the quota had room for the
// new set, bigger than lost, as the swap's round began, but may have
// shrunk since, where a.mu was let go), where the pool has no room for it,
// or where its memory fails too. a.mu is held.
func (a *Agent) remakeFallback(engine string, lost *engineSet, place []int) (*engineSet, error) {
	quota, _, carved := a.engineShare(engine)
	if need := setBytes(lost.set); !fitsQuota(carved[engine], need, quota) {
		return nil, fmt.Errorf("engine %q: its block sets take %d bytes and this one needs %d, past its quota of %d",
			engine, carved[engine], need, quota)
	}
	m := &setMaker{a: a, engine: engine, tmpl: lost.set.Layout().Clone(), place: place}
	if _, err := m.make(); err != nil {
		return nil, err
	}
	return m.made, nil
}

// reusableSet returns the block set of tmpl's layout and placement that a
// Register asking for asked slots may join: of those with exactly that
// many (any count when it asked for none), the one with the most usable
// slots (pool.BlockSet.Retire takes slots out of use; the oldest of
// equals). own says whether sess already uses it (an engine's other ranks
// registered it). The caller attaches another session's set at once only
// if it has the slots asked for (the default count when none was asked)
// usable, so that an engine is not handed a tiny set some other engine
// asked for, nor a kept set with retired slots while a new set fits; else
// the set is the fallback when the quota or the memory has no room for a
// new one. Only sets pid may join are candidates (see engineSet.mayJoin).
// a.mu is held.
func (a *Agent) reusableSet(sess *session, tmpl *layout.Layout, asked int, place []int, pid int32, staging bool) (best *engineSet, own bool) {
	var fits []*engineSet
	usable := map[*engineSet]int{}
	for _, s := range a.sets {
		if s.staging != staging {
			continue
		}
		if field, _, _ := a.layoutDiff(s, tmpl, asked, place); field != "" {
			continue
		}
		// Before sess.mu: mayJoin and Usable take the set's lock.
		if s.mayJoin(pid) {
			fits = append(fits, s)
			usable[s] = s.set.Usable()
		}
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	better := func(s, than *engineSet) bool {
		return than == nil || usable[s] > usable[than] || (usable[s] == usable[than] && s.set.ID() < than.set.ID())
	}
	var mine *engineSet
	for _, s := range fits {
		_, used := sess.sets[s.set.ID()]
		if used && better(s, mine) {
			mine = s
		}
		if better(s, best) {
			best = s
		}
	}
	if mine != nil {
		return mine, true
	}
	return best, false
}

// defaultSlots is the configured slot count, else what a quarter of the
// pool holds: of each storage the set's ranks are placed on (place, nil
// for the default), the one that runs out first. probe is a valid layout.
func (a *Agent) defaultSlots(probe *layout.Layout, place []int) int {
	if a.cfg.BlockSetSlots > 0 {
		return a.cfg.BlockSetSlots
	}
	ranks := make([]uint64, len(a.storages))
	for r := range probe.TPSize {
		if place != nil {
			ranks[place[r]]++
		} else {
			ranks[r%len(a.storages)]++
		}
	}
	block := max(probe.Strides().Block, 1)
	slots := layout.MaxSlots
	for i, st := range a.storages {
		if ranks[i] > 0 {
			// Divided in turn: block × ranks, each rank holding a whole
			// block (MLA), may pass 2^64 and wrap (to 0: a division by
			// zero).
			slots = min(slots, int(st.Size()/4/block/ranks[i]))
		}
	}
	return max(1, slots)
}

func (a *Agent) engineSet(id uint64) (*engineSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.sets[pool.SetID(id)]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "block set %d: not registered on this agent", id)
	}
	return s, nil
}

// enginesSet is engineSet for an engine's call: the tiers' staging sets
// are the agent's own, as if not there.
func (a *Agent) enginesSet(id uint64) (*engineSet, error) {
	s, err := a.engineSet(id)
	if err == nil && s.staging {
		return nil, status.Errorf(codes.NotFound, "block set %d: not an engine's (the agent's own staging for peers)", id)
	}
	return s, err
}

// describe returns what an engine needs to use a block set.
func (a *Agent) describe(s *engineSet) (*fabricpb.RegisterResponse, error) {
	l := s.set.Layout()
	s.mu.Lock()
	token := s.joinToken // renewed under s.mu as the set passes on (mayJoin)
	s.mu.Unlock()
	out := &fabricpb.RegisterResponse{BlockSet: uint64(s.set.ID()), Layout: l.Proto(), Retains: uint32(s.set.Retains()), JoinToken: token}
	ipcs := map[int][]byte{} // by storage
	for r := range l.TPSize {
		off, err := s.set.RegionOffset(r)
		if err != nil {
			return nil, toStatus(err)
		}
		if a.host == nil {
			i, err := s.set.RegionStorage(r)
			if err != nil {
				return nil, toStatus(err)
			}
			st, gpu := a.storages[i], a.gpus[i]
			if ipcs[i] == nil {
				h, err := a.cuda.IPCHandle(gpu, st.Addr())
				if err != nil {
					return nil, status.Errorf(codes.Unavailable, "fabric: IPC handle of GPU %d's device pool: %v", gpu, err)
				}
				ipcs[i] = h[:]
			}
			out.Memory = append(out.Memory, &fabricpb.Memory{Offset: off, Size: l.Regions[r].Size, FileSize: st.Size(),
				CudaIpcHandle: ipcs[i], CudaDevice: int32(gpu), PciBusId: a.cuda.Devices()[gpu].PCIBusID})
			out.Ranks = append(out.Ranks, rankLayout(l, r, off))
			continue
		}
		m := &fabricpb.Memory{Path: a.host.Path(), Offset: off, Size: l.Regions[r].Size, FileSize: a.host.Size()}
		if a.fdSrv != nil {
			m.Token, m.FdSocket = a.memToken, a.cfg.EngineSocket+FDSocketSuffix
		}
		if s.mem != nil {
			// The rank's own memory file: its region starts at 0.
			sec := s.mem[r].sec
			off = 0
			a.memMu.Lock() // renewed as the set passes on (renewSetMemory)
			m.Path, m.Offset, m.FileSize, m.Token = sec.Path(), 0, sec.Size(), s.mem[r].token
			a.memMu.Unlock()
		}
		if a.cfg.MemoryDir != "" {
			m.File = m.Path
		}
		out.Memory = append(out.Memory, m)
		out.Ranks = append(out.Ranks, rankLayout(l, r, off))
	}
	return out, nil
}

// rankLayout describes rank r of l, whose region starts at off in the
// mapped memory: the formulas are engine.proto's RankLayout.
func rankLayout(l *layout.Layout, r int, off uint64) *fabricpb.RankLayout {
	st := l.Strides()
	planes := uint32(2)
	if l.Model.MLA {
		planes = 1
	}
	rl := &fabricpb.RankLayout{
		Offset: off, BlockStride: st.Block, LayerStride: st.Layer, KvStride: st.KV,
		Planes: planes, ElementBytes: uint32(l.Model.DType.Size()), ChunkBytes: st.Chunk,
		Replicas: 1,
	}
	heads, tokens, dim := uint32(st.HeadsPerRank), uint32(l.PageSize), uint32(l.Model.HeadDim)
	if l.Order == layout.NHD {
		rl.ChunkShape = []uint32{tokens, heads, dim}
	} else {
		rl.ChunkShape = []uint32{heads, tokens, dim}
	}
	first := l.FirstHead(r)
	for h := range st.HeadsPerRank {
		rl.HeadIds = append(rl.HeadIds, uint32(first+h))
	}
	switch {
	case l.Model.MLA:
		rl.Replicas = uint32(l.TPSize)
	case l.TPSize > l.Model.KVHeads:
		rl.Replicas = uint32(l.TPSize / l.Model.KVHeads)
	}
	return rl
}
