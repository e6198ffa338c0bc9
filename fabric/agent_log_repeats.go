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
// attributes) in between are counted, and when the window ends the last of
// them is written with how many were left out (repeated=N). A peer that
// retries a refused handshake ten times a second then costs one line every
// ten seconds. Debug records pass as they are. Records that must all be
// seen (changes of membership, reloads) go through the handler it wraps.
type repeatFolder struct {
	inner  slog.Handler
	prefix string // the attributes and groups added with WithAttrs/WithGroup
	st     *repeatState
}

type repeatState struct {
	now   func() time.Time
	after func(time.Duration, func()) // time.AfterFunc, or a test's
	mu    sync.Mutex
	seen  map[string]*repeat
}

type repeat struct {
	written time.Time
	skipped int
	// last is the latest record left out, and h the handler it was for:
	// written with the count when the window ends.
	last    slog.Record
	h       slog.Handler
	pending bool // a flush is scheduled
}

func newRepeatFolder(h slog.Handler, now func() time.Time, after func(time.Duration, func())) *repeatFolder {
	return &repeatFolder{inner: h, st: &repeatState{now: now, after: after, seen: map[string]*repeat{}}}
}

// afterFunc schedules f after d on a timer of its own.
func afterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

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
	k := key.String()
	st.mu.Lock()
	rep := st.seen[k]
	if rep != nil && now.Sub(rep.written) < repeatWindow {
		rep.skipped++
		rep.last, rep.h = r.Clone(), f.inner
		if !rep.pending {
			rep.pending = true
			st.after(repeatWindow-now.Sub(rep.written), func() { st.flush(k) })
		}
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

// flush writes the record left out last under key with how many were,
// when its window has ended and no identical record has said so since.
func (st *repeatState) flush(key string) {
	st.mu.Lock()
	rep := st.seen[key]
	if rep == nil || rep.skipped == 0 {
		if rep != nil {
			rep.pending = false
		}
		st.mu.Unlock()
		return
	}
	r, h, n := rep.last, rep.h, rep.skipped
	rep.skipped, rep.pending, rep.written = 0, false, st.now()
	st.mu.Unlock()
	r.AddAttrs(slog.Int("repeated", n))
	h.Handle(context.Background(), r)
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

// logSpacing spaces the log lines of events too many to log each (a
// refusal a flood repeats, a failure that recurs): the first is logged,
// then the first at least an interval after the one logged before, and
// those in between are counted for the next line to say. Unlike
// repeatFolder, it spaces lines that differ (each names its own block or
// peer). Safe for concurrent use; the zero value is ready.
type logSpacing struct {
	mu        sync.Mutex
	logged    time.Time // when a line was last logged; zero: never
	notLogged int       // events since then not logged
}

// due says whether the event at now is to be logged, as it is when no
// line was logged in the interval every before now, and if so how many
// events were not logged since the line before.
func (s *logSpacing) due(now time.Time, every time.Duration) (log bool, notLogged int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.logged.IsZero() && now.Sub(s.logged) < every {
		s.notLogged++
		return false, 0
	}
	notLogged = s.notLogged
	s.logged, s.notLogged = now, 0
	return true, notLogged
}
