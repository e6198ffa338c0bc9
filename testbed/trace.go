package testbed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
)

// Trace format (Mooncake, FAST'25 release): JSON lines, one request each.
//
//	field          type       meaning
//	timestamp      int (ms)   arrival time from the start of the trace
//	input_length   int        prompt tokens
//	output_length  int        generated tokens
//	hash_ids       []int      ids of the prompt's consecutive 512-token blocks;
//	                          requests that share leading ids share that prefix
//
// Unknown fields are ignored, as later releases add some.

// TraceBlockTokens is the number of tokens one hash id stands for.
const TraceBlockTokens = 512

// Limits on one trace line, so that a bad file gets an error naming the
// line rather than a replay that runs out of memory.
const (
	// MaxTraceLine is the longest line read, in bytes.
	MaxTraceLine = 4 << 20
	// MaxTraceBlocks is the most hash ids one request may have (a
	// 16M-token prompt).
	MaxTraceBlocks = 1 << 15
)

// ErrTrace is wrapped by every error about a trace's content.
var ErrTrace = errors.New("testbed: bad trace")

// TraceRequest is one line of a trace.
type TraceRequest struct {
	Timestamp    int64   `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ReadTrace reads at most limit requests (all if limit is zero) from a
// JSONL trace. Blank lines are skipped; anything else that is not a valid
// request is an error naming its line and field.
func ReadTrace(r io.Reader, limit int) ([]TraceRequest, error) {
	sc := bufio.NewScanner(r)
	// One byte more than a line, for its newline.
	sc.Buffer(make([]byte, 0, 64<<10), MaxTraceLine+1)
	var out []TraceRequest
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var req TraceRequest
		if err := json.Unmarshal([]byte(text), &req); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		if err := req.validate(); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrTrace, line, err)
		}
		out = append(out, req)
		if limit > 0 && len(out) == limit {
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrTrace, line+1, MaxTraceLine)
		}
		return nil, fmt.Errorf("testbed: read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	return out, nil
}

func (r TraceRequest) validate() error {
	switch {
	case r.Timestamp < 0:
		return fmt.Errorf("timestamp: %d is negative", r.Timestamp)
	case r.InputLength < 0:
		return fmt.Errorf("input_length: %d is negative", r.InputLength)
	case r.OutputLength < 0:
		return fmt.Errorf("output_length: %d is negative", r.OutputLength)
	case len(r.HashIDs) == 0:
		return errors.New("hash_ids: empty")
	case len(r.HashIDs) > MaxTraceBlocks:
		return fmt.Errorf("hash_ids: %d ids (at most %d)", len(r.HashIDs), MaxTraceBlocks)
	}
	for i, id := range r.HashIDs {
		if id < 0 {
			return fmt.Errorf("hash_ids[%d]: %d is negative", i, id)
		}
	}
	return nil
}

// WriteTrace writes requests as JSON lines.
func WriteTrace(w io.Writer, reqs []TraceRequest) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, r := range reqs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("testbed: write trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("testbed: write trace: %w", err)
	}
	return nil
}

// TraceGen describes a synthetic trace: multi-turn conversations, each
// opening with one of a few system prompts, so that requests share
// prefixes as chat traffic does (a system prompt across conversations, the
// whole history across one conversation's turns).
type TraceGen struct {
	// Requests is the number of requests. If zero, 1,500.
	Requests int
	// SystemPrompts is the number of distinct system prompts. If zero, 8.
	SystemPrompts int
	// SystemBlocks is each system prompt's length in 512-token blocks. If
	// zero, 4.
	SystemBlocks int
	// Turns is the most turns in a conversation (each has 1..Turns). If
	// zero, 6.
	Turns int
	// UserBlocks is the most new blocks a turn's user message adds (each
	// adds 1..UserBlocks). If zero, 2.
	UserBlocks int
	// OutputBlocks is the blocks a reply adds to the history. If zero, 1.
	OutputBlocks int
	// Active is the number of conversations interleaved at a time. If zero,
	// 32.
	Active int
	// RatePerSec is the mean arrival rate (Poisson). If zero, 20.
	RatePerSec float64
	// Seed makes the trace reproducible; zero is a valid seed.
	Seed uint64
}

func (g *TraceGen) defaults() error {
	fill := func(p *int, def int, name string) error {
		if *p < 0 {
			return fmt.Errorf("testbed: trace generator: %s: %d is negative", name, *p)
		}
		if *p == 0 {
			*p = def
		}
		return nil
	}
	for _, f := range []struct {
		p    *int
		def  int
		name string
	}{
		{&g.Requests, 1500, "Requests"}, {&g.SystemPrompts, 8, "SystemPrompts"}, {&g.SystemBlocks, 4, "SystemBlocks"},
		{&g.Turns, 6, "Turns"}, {&g.UserBlocks, 2, "UserBlocks"}, {&g.OutputBlocks, 1, "OutputBlocks"}, {&g.Active, 32, "Active"},
	} {
		if err := fill(f.p, f.def, f.name); err != nil {
			return err
		}
	}
	if g.RatePerSec < 0 || math.IsNaN(g.RatePerSec) {
		return fmt.Errorf("testbed: trace generator: RatePerSec: %v is not positive", g.RatePerSec)
	}
	if g.RatePerSec == 0 {
		g.RatePerSec = 20
	}
	if longest := g.SystemBlocks + g.Turns*(g.UserBlocks+g.OutputBlocks); longest > MaxTraceBlocks {
		return fmt.Errorf("testbed: trace generator: conversations reach %d blocks (at most %d)", longest, MaxTraceBlocks)
	}
	return nil
}

// Generate makes a synthetic trace.
func (g TraceGen) Generate() ([]TraceRequest, error) {
	if err := g.defaults(); err != nil {
		return nil, err
	}
	rng := rand.New(rand.NewPCG(g.Seed, 0x7ace))
	next := int64(0)
	ids := func(n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = next
			next++
		}
		return out
	}
	system := make([][]int64, g.SystemPrompts)
	for i := range system {
		system[i] = ids(g.SystemBlocks)
	}
	type conv struct {
		history []int64
		left    int
	}
	newConv := func() *conv {
		// Popular prompts more often: a skew like real deployments'.
		s := min(int(rng.ExpFloat64()*float64(g.SystemPrompts)/3), g.SystemPrompts-1)
		return &conv{history: append([]int64(nil), system[s]...), left: 1 + rng.IntN(g.Turns)}
	}
	active := make([]*conv, g.Active)
	for i := range active {
		active[i] = newConv()
	}
	out := make([]TraceRequest, 0, g.Requests)
	t := 0.0
	for range g.Requests {
		t += rng.ExpFloat64() / g.RatePerSec * 1000
		i := rng.IntN(len(active))
		c := active[i]
		c.history = append(c.history, ids(1+rng.IntN(g.UserBlocks))...)
		in := len(c.history)*TraceBlockTokens - rng.IntN(TraceBlockTokens/2)
		outTok := g.OutputBlocks*TraceBlockTokens - rng.IntN(TraceBlockTokens/2)
		out = append(out, TraceRequest{Timestamp: int64(t), InputLength: in, OutputLength: outTok,
			HashIDs: append([]int64(nil), c.history...)})
		c.history = append(c.history, ids(g.OutputBlocks)...)
		if c.left--; c.left == 0 {
			active[i] = newConv()
		}
	}
	return out, nil
}
