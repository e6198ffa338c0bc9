package testbed

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// ScenarioRecord is what one scenario run measured, written as one JSON
// object (WriteFile) for reports to plot. Times are milliseconds since
// Started. The shape:
//
//	{"scenario": "partition-heal", "variant": "short", "nodes": 4,
//	 "started": "2026-11-23T17:00:00Z", "passed": true,
//	 "params":  {"partition_s": 5, ...},          // what the run was asked to do
//	 "figures": {"heal_s": 3.2, ...},             // what it measured; unit in the name
//	 "steps":   [{"t_ms": 120, "step": "partition", "nodes": [0,1], "detail": "from [2,3]"}],
//	 "members": [{"t_ms": 130, "node": "gpu-01", "alive": 4, "blocks": 32}],
//	 "imports": [{"t_ms": 150, "node": "gpu-02", "blocks": 8, "bytes": 1048576,
//	              "ms": 12.5, "error": ""}]}
//
// Members is each node's view over time (alive members it sees, blocks
// of the cluster it indexes), sampled by the scenario; Imports is one
// entry per import call. All methods are safe for concurrent use.
type ScenarioRecord struct {
	Scenario string             `json:"scenario"`
	Variant  string             `json:"variant"` // "short" (make test) or "long" (-kvfabric.long)
	Nodes    int                `json:"nodes"`
	Started  time.Time          `json:"started"`
	Passed   bool               `json:"passed"`
	Params   map[string]float64 `json:"params"`
	Figures  map[string]float64 `json:"figures"`
	Steps    []StepSample       `json:"steps"`
	Members  []MemberSample     `json:"members"`
	Imports  []ImportSample     `json:"imports"`

	mu sync.Mutex
}

// StepSample is one fault step applied (or undone).
type StepSample struct {
	TMs    int64  `json:"t_ms"`
	Step   string `json:"step"` // partition, heal, kill, restart, pause, resume, shape, blackhole-udp, restore-udp
	Nodes  []int  `json:"nodes"`
	Detail string `json:"detail,omitempty"`
}

// MemberSample is what one node saw at one time.
type MemberSample struct {
	TMs    int64  `json:"t_ms"`
	Node   string `json:"node"`
	Alive  int    `json:"alive"`  // members it sees alive, itself included
	Blocks uint64 `json:"blocks"` // blocks it indexes across alive members
}

// ImportSample is one import call.
type ImportSample struct {
	TMs    int64   `json:"t_ms"` // when it started
	Node   string  `json:"node"`
	Blocks int     `json:"blocks"` // blocks it returned
	Bytes  uint64  `json:"bytes"`
	Ms     float64 `json:"ms"`
	Error  string  `json:"error,omitempty"`
}

// NewScenarioRecord starts a record now.
func NewScenarioRecord(scenario, variant string, nodes int) *ScenarioRecord {
	return &ScenarioRecord{Scenario: scenario, Variant: variant, Nodes: nodes, Started: time.Now().UTC(),
		Params: map[string]float64{}, Figures: map[string]float64{}}
}

func (r *ScenarioRecord) since() int64 { return time.Since(r.Started).Milliseconds() }

// Param records a parameter of the run.
func (r *ScenarioRecord) Param(k string, v float64) { r.mu.Lock(); r.Params[k] = v; r.mu.Unlock() }

// Figure records a measurement.
func (r *ScenarioRecord) Figure(k string, v float64) { r.mu.Lock(); r.Figures[k] = v; r.mu.Unlock() }

// Step records a fault step done now.
func (r *ScenarioRecord) Step(step string, nodes []int, detail string) {
	r.mu.Lock()
	r.Steps = append(r.Steps, StepSample{r.since(), step, nodes, detail})
	r.mu.Unlock()
}

// Member records what node saw now.
func (r *ScenarioRecord) Member(node string, alive int, blocks uint64) {
	r.mu.Lock()
	r.Members = append(r.Members, MemberSample{r.since(), node, alive, blocks})
	r.mu.Unlock()
}

// Import records an import that started at start.
func (r *ScenarioRecord) Import(start time.Time, node string, blocks int, bytes uint64, err error) {
	s := ImportSample{TMs: start.Sub(r.Started).Milliseconds(), Node: node, Blocks: blocks, Bytes: bytes,
		Ms: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		s.Error = err.Error()
	}
	r.mu.Lock()
	r.Imports = append(r.Imports, s)
	r.mu.Unlock()
}

// WriteFile writes the record as dir/SCENARIO-VARIANT.json and returns
// the path.
func (r *ScenarioRecord) WriteFile(dir string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", fmt.Errorf("testbed: record: %w", err)
	}
	p := filepath.Join(dir, r.Scenario+"-"+r.Variant+".json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return "", fmt.Errorf("testbed: record: %w", err)
	}
	return p, nil
}
