package fabric

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// repeatWindow is how long a log record, once written, keeps identical
// records from being written again.
const repeatWindow = 10 * time.Second

// maxRepeatKeys bounds the records remembered; past it the memory starts
// afresh (a flood of distinct records is not what this folds).
const maxRepeatKeys = 4096

// repeatFolder is a slog.Handler that writes a record at info or above
// once per repeatWindow: identical records (same level, message and
// attributes) in between are counted, and the next one written says how
// many were left out (repeated=N). A peer that retries a refused handshake
// ten times a second then costs one line every ten seconds. Debug records
// pass as they are.
type repeatFolder struct {
	inner  slog.Handler
	prefix string // the attributes and groups added with WithAttrs/WithGroup
	st     *repeatState
}

type repeatState struct {
	now  func() time.Time
	mu   sync.Mutex
	seen map[string]*repeat
}

type repeat struct {
	written time.Time
	skipped int
}

func newRepeatFolder(h slog.Handler, now func() time.Time) *repeatFolder {
	return &repeatFolder{inner: h, st: &repeatState{now: now, seen: map[string]*repeat{}}}
}

func (f *repeatFolder) Enabled(ctx context.Context, l slog.Level) bool {
	return f.inner.Enabled(ctx, l)
}

func (f *repeatFolder) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelInfo {
		return f.inner.Handle(ctx, r)
	}
	var key strings.Builder
	fmt.Fprintf(&key, "%s|%s|%s", r.Level, f.prefix, r.Message)
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&key, "|%s=%v", a.Key, a.Value)
		return true
	})
	st := f.st
	now := st.now()
	st.mu.Lock()
	rep := st.seen[key.String()]
	if rep != nil && now.Sub(rep.written) < repeatWindow {
		rep.skipped++
		st.mu.Unlock()
		return nil
	}
	skipped := 0
	if rep != nil {
		skipped = rep.skipped
	} else {
		if len(st.seen) >= maxRepeatKeys {
			st.seen = map[string]*repeat{}
		}
		rep = &repeat{}
		st.seen[key.String()] = rep
	}
	rep.written, rep.skipped = now, 0
	st.mu.Unlock()
	if skipped > 0 {
		r = r.Clone()
		r.AddAttrs(slog.Int("repeated", skipped))
	}
	return f.inner.Handle(ctx, r)
}

func (f *repeatFolder) WithAttrs(attrs []slog.Attr) slog.Handler {
	var b strings.Builder
	b.WriteString(f.prefix)
	for _, a := range attrs {
		fmt.Fprintf(&b, "|%s=%v", a.Key, a.Value)
	}
	return &repeatFolder{inner: f.inner.WithAttrs(attrs), prefix: b.String(), st: f.st}
}

func (f *repeatFolder) WithGroup(name string) slog.Handler {
	return &repeatFolder{inner: f.inner.WithGroup(name), prefix: f.prefix + "|" + name + ".", st: f.st}
}
