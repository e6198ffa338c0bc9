// Package netbench holds the baselines kvfabric's transfer benchmarks run
// beside their own path: bare quic-go streams, TLS 1.3 over TCP and raw
// TCP, each moving the same contiguous blocks from a source buffer into a
// destination buffer, one request per block; and the driver that runs
// every transport in turn within one benchmark iteration, so that a noisy
// machine slows them alike, and tallies their throughput and per-block
// latency.
//
// It is benchmark support code: listeners bind loopback addresses, serve
// any block index asked for within the source, and trust their clients.
// Nothing here is used by the agent.
package netbench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Transport moves blocks by index. A benchmark's own path is a Transport
// too, so that the driver treats it and the baselines alike.
type Transport struct {
	// Name labels the transport's metrics ("quic", "tls", "tcp", ...).
	Name string
	// Parallel is how many Fetch calls run at once. If zero, 1.
	Parallel int
	// Batch is how many consecutive blocks one Fetch call moves; each
	// block of a call is given the call's latency. If zero, 1.
	Batch int
	// Fetch moves blocks [first, first+n) on behalf of worker (in
	// [0, Parallel)).
	Fetch func(ctx context.Context, worker int, first, n uint64) error
	// Whole, when set, moves every block in one call instead of Fetch;
	// per-block latency is then not measured.
	Whole func(ctx context.Context, nblocks uint64) error
	// Closer releases what the transport holds; Close calls it once.
	Closer func() error

	closeOnce sync.Once
	closeErr  error
}

// Close releases the transport's connections and listeners. It is safe
// to call more than once.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		if t.Closer != nil {
			t.closeErr = t.Closer()
		}
	})
	return t.closeErr
}

// Run moves blocks [0, nblocks) and returns the elapsed time and, unless
// the transport moves everything in one call, each block's latency by
// block index. The first error stops the dispatch of further calls.
func (t *Transport) Run(ctx context.Context, nblocks uint64) (time.Duration, []time.Duration, error) {
	if t.Whole != nil {
		start := time.Now()
		err := t.Whole(ctx, nblocks)
		return time.Since(start), nil, err
	}
	if t.Fetch == nil {
		return 0, nil, fmt.Errorf("netbench: transport %q has neither Fetch nor Whole", t.Name)
	}
	batch := uint64(max(1, t.Batch))
	lat := make([]time.Duration, nblocks)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan uint64)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := time.Now()
	for w := range max(1, t.Parallel) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range next {
				n := min(batch, nblocks-b)
				t0 := time.Now()
				if err := t.Fetch(ctx, w, b, n); err != nil {
					once.Do(func() { first = fmt.Errorf("blocks %d..%d: %w", b, b+n-1, err); cancel() })
					continue
				}
				d := time.Since(t0)
				for i := b; i < b+n; i++ {
					lat[i] = d
				}
			}
		}()
	}
dispatch:
	for b := uint64(0); b < nblocks; b += batch {
		select {
		case next <- b:
		case <-ctx.Done():
			break dispatch
		}
	}
	close(next)
	wg.Wait()
	elapsed := time.Since(start)
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return elapsed, lat, first
}

// Result is one transport's tally over a benchmark's iterations.
type Result struct {
	Name    string
	Bytes   uint64        // moved, over every run added
	Elapsed time.Duration // summed over every run added
	// Latencies are per block, over every run added, unsorted.
	Latencies []time.Duration
}

// Add adds one run of bytes that took elapsed, with its block latencies.
func (r *Result) Add(bytes uint64, elapsed time.Duration, lat []time.Duration) {
	r.Bytes += bytes
	r.Elapsed += elapsed
	r.Latencies = append(r.Latencies, lat...)
}

// GBps is the throughput in 10⁹ bytes per second, 0 before any run.
func (r *Result) GBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds() / 1e9
}

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of the block
// latencies, nearest rank, and false when there are none.
func (r *Result) Percentile(p float64) (time.Duration, bool) {
	return Percentile(r.Latencies, p)
}

// Percentile returns the p-th percentile (0 ≤ p ≤ 100, clamped) of lat by
// nearest rank: the smallest value at least p percent of lat are not above.
// It sorts a copy; false when lat is empty.
func Percentile(lat []time.Duration, p float64) (time.Duration, bool) {
	if len(lat) == 0 {
		return 0, false
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	p = min(max(p, 0), 100)
	// Nearest rank: ceil(p/100 × n), 1-based.
	k := int(p / 100 * float64(len(s)))
	if float64(k) < p/100*float64(len(s)) {
		k++
	}
	return s[max(k, 1)-1], true
}

// Reporter receives metrics; *testing.B is one.
type Reporter interface {
	ReportMetric(n float64, unit string)
}

// Report reports the result's GB/s and, when latencies were measured,
// per-block p50 and p99 in milliseconds, each unit prefixed by the name.
func (r *Result) Report(rep Reporter) {
	rep.ReportMetric(r.GBps(), r.Name+"-GB/s")
	if p50, ok := r.Percentile(50); ok {
		p99, _ := r.Percentile(99)
		rep.ReportMetric(float64(p50.Microseconds())/1e3, r.Name+"-p50-ms")
		rep.ReportMetric(float64(p99.Microseconds())/1e3, r.Name+"-p99-ms")
	}
}

// Runner runs transports interleaved: each Round runs every transport
// once, in order, over the same blocks.
type Runner struct {
	Transports []*Transport
	// BlockBytes is the bytes one block counts for in GB/s.
	BlockBytes uint64
	// Before, if set, runs before each transport's run (e.g. to clear the
	// destination) and is not timed.
	Before func(t *Transport) error
	// After, if set, runs after each transport's run (e.g. to verify what
	// arrived) and is not timed.
	After func(t *Transport) error

	results map[string]*Result
}

// Round runs every transport once over blocks [0, nblocks) and adds each
// run to its transport's Result.
func (r *Runner) Round(ctx context.Context, nblocks uint64) error {
	if r.results == nil {
		r.results = map[string]*Result{}
	}
	for _, t := range r.Transports {
		if r.Before != nil {
			if err := r.Before(t); err != nil {
				return fmt.Errorf("%s: before: %w", t.Name, err)
			}
		}
		d, lat, err := t.Run(ctx, nblocks)
		if err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
		res := r.Result(t.Name)
		res.Add(nblocks*r.BlockBytes, d, lat)
		if r.After != nil {
			if err := r.After(t); err != nil {
				return fmt.Errorf("%s: after: %w", t.Name, err)
			}
		}
	}
	return nil
}

// Result returns the tally of the named transport, empty before its
// first run.
func (r *Runner) Result(name string) *Result {
	if r.results == nil {
		r.results = map[string]*Result{}
	}
	res, ok := r.results[name]
	if !ok {
		res = &Result{Name: name}
		r.results[name] = res
	}
	return res
}

// Report reports every transport's Result.
func (r *Runner) Report(rep Reporter) {
	for _, t := range r.Transports {
		r.Result(t.Name).Report(rep)
	}
}

// Ratio is ours' throughput over base's: the figure the benchmarks' goals
// are stated in. It fails when either has not run.
func (r *Runner) Ratio(ours, base string) (float64, error) {
	o, b := r.Result(ours).GBps(), r.Result(base).GBps()
	if o == 0 || b == 0 {
		return 0, fmt.Errorf("netbench: ratio %s/%s: no throughput measured (%g, %g GB/s)", ours, base, o, b)
	}
	return o / b, nil
}

// Close closes every transport.
func (r *Runner) Close() error {
	var errs []error
	for _, t := range r.Transports {
		errs = append(errs, t.Close())
	}
	return errors.Join(errs...)
}
