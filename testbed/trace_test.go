package testbed

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func TestReadTraceMooncakeLines(t *testing.T) {
	in := `{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2353, 2354]}

{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 2366], "extra": true}
`
	reqs, err := ReadTrace(strings.NewReader(in), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].Timestamp != 27482 || reqs[0].InputLength != 6955 || reqs[0].OutputLength != 52 ||
		len(reqs[0].HashIDs) != 14 || reqs[1].HashIDs[12] != 2366 {
		t.Fatalf("read %+v", reqs)
	}
	one, err := ReadTrace(strings.NewReader(in), 1)
	if err != nil || len(one) != 1 {
		t.Fatalf("limit 1: %d requests, %v", len(one), err)
	}
}

func TestReadTraceRefusesBadLines(t *testing.T) {
	ids := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = fmt.Sprint(i)
		}
		return "[" + strings.Join(s, ",") + "]"
	}
	for _, c := range []struct {
		desc, in, want string
	}{
		{"not json", "{\"timestamp\": 1,", "line 1"},
		{"empty file", "\n\n", "no requests"},
		{"negative timestamp", `{"timestamp": -1, "hash_ids": [1]}`, "timestamp"},
		{"negative input", `{"input_length": -5, "hash_ids": [1]}`, "input_length"},
		{"negative output", `{"output_length": -5, "hash_ids": [1]}`, "output_length"},
		{"no ids", `{"timestamp": 1, "input_length": 5}`, "hash_ids: empty"},
		{"negative id", `{"hash_ids": [1, -2]}`, "hash_ids[1]"},
		{"wrong type", `{"hash_ids": "abc"}`, "line 1"},
		{"second line bad", "{\"hash_ids\": [1]}\n{\"hash_ids\": []}", "line 2"},
		{"past the id limit", `{"hash_ids": ` + ids(MaxTraceBlocks+1) + `}`, fmt.Sprintf("%d ids", MaxTraceBlocks+1)},
		{"past the line limit", `{"hash_ids": [1], "pad": "` + strings.Repeat("x", MaxTraceLine) + `"}`, "longer than"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(c.in), 0)
			if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want an ErrTrace naming %q", err, c.want)
			}
		})
	}
	// At the limits: accepted.
	at := `{"hash_ids": ` + ids(MaxTraceBlocks) + `}`
	if reqs, err := ReadTrace(strings.NewReader(at), 0); err != nil || len(reqs[0].HashIDs) != MaxTraceBlocks {
		t.Fatalf("%d ids: %v", MaxTraceBlocks, err)
	}
	pad := MaxTraceLine - len(`{"hash_ids": [1], "pad": ""}`)
	line := `{"hash_ids": [1], "pad": "` + strings.Repeat("x", pad) + `"}`
	if len(line) != MaxTraceLine {
		t.Fatalf("line is %d bytes", len(line))
	}
	if _, err := ReadTrace(strings.NewReader(line+"\n"), 0); err != nil {
		t.Fatalf("a line of exactly %d bytes: %v", MaxTraceLine, err)
	}
	longer := `{"hash_ids": [1], "pad": "x` + strings.Repeat("x", pad) + `"}` + "\n"
	if _, err := ReadTrace(strings.NewReader(longer), 0); !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("a line of %d bytes: %v", MaxTraceLine+1, err)
	}
}

func TestGeneratedTraceSharesPrefixes(t *testing.T) {
	g := TraceGen{Requests: 500, SystemPrompts: 4, SystemBlocks: 3, Seed: 7}
	reqs, err := g.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 500 {
		t.Fatalf("%d requests", len(reqs))
	}
	// Round trip through the file format.
	var buf bytes.Buffer
	if err := WriteTrace(&buf, reqs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadTrace(&buf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(reqs, back, func(a, b TraceRequest) bool {
		return a.Timestamp == b.Timestamp && a.InputLength == b.InputLength && a.OutputLength == b.OutputLength && slices.Equal(a.HashIDs, b.HashIDs)
	}) {
		t.Fatal("trace changed through WriteTrace and ReadTrace")
	}
	// Every request opens with one of the 4 system prompts; later turns
	// extend an earlier request's ids; timestamps never go back.
	prompts := map[string]bool{}
	extends := 0
	seen := map[string]bool{}
	for i, r := range reqs {
		if i > 0 && r.Timestamp < reqs[i-1].Timestamp {
			t.Fatalf("request %d goes back in time", i)
		}
		if r.InputLength > len(r.HashIDs)*TraceBlockTokens || r.InputLength <= (len(r.HashIDs)-1)*TraceBlockTokens {
			t.Fatalf("request %d: input_length %d for %d ids", i, r.InputLength, len(r.HashIDs))
		}
		prompts[fmt.Sprint(r.HashIDs[:3])] = true
		for n := len(r.HashIDs) - 1; n > 3; n-- {
			if seen[fmt.Sprint(r.HashIDs[:n])] {
				extends++
				break
			}
		}
		seen[fmt.Sprint(r.HashIDs)] = true
		// An earlier turn's full ids plus its reply's ids is a prefix.
		for n := 4; n <= len(r.HashIDs); n++ {
			seen[fmt.Sprint(r.HashIDs[:n])] = true
		}
	}
	if len(prompts) > 4 || len(prompts) < 2 {
		t.Fatalf("%d distinct system prompts, want 2..4", len(prompts))
	}
	if extends < 100 {
		t.Fatalf("only %d of 500 requests extend an earlier one's prefix past the system prompt", extends)
	}
	again, _ := g.Generate()
	if !slices.EqualFunc(reqs, again, func(a, b TraceRequest) bool { return slices.Equal(a.HashIDs, b.HashIDs) }) {
		t.Fatal("same seed, different trace")
	}
}

func TestTraceGenLimits(t *testing.T) {
	// The longest conversation: SystemBlocks + Turns*(UserBlocks+OutputBlocks).
	at := TraceGen{Requests: 1, Active: 1, SystemBlocks: MaxTraceBlocks - 2, Turns: 1, UserBlocks: 1, OutputBlocks: 1}
	if _, err := at.Generate(); err != nil {
		t.Fatalf("conversations of exactly %d blocks: %v", MaxTraceBlocks, err)
	}
	past := at
	past.SystemBlocks++
	if _, err := past.Generate(); err == nil || !strings.Contains(err.Error(), "at most") {
		t.Fatalf("conversations of %d blocks: %v", MaxTraceBlocks+1, err)
	}
	for _, g := range []TraceGen{{Requests: -1}, {Turns: -1}, {RatePerSec: -1}} {
		if _, err := g.Generate(); err == nil {
			t.Fatalf("%+v: no error", g)
		}
	}
}
