package membership

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"
)

// logWriter turns memberlist's log lines into slog records and logs each
// distinct warning or error once per window. memberlist logs per packet, so a
// node with the wrong key or cluster label knocking every second would
// otherwise fill the log; the first line says what is wrong, the repeats say
// nothing new.
type logWriter struct {
	log    *slog.Logger
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	seen map[string]*logSeen
}

type logSeen struct {
	at         time.Time
	suppressed int
}

// maxLogKeys bounds the dedupe table; past it the oldest half is forgotten.
const maxLogKeys = 1024

var (
	// Peer addresses vary per packet; they are not part of what went wrong.
	logAddrRE = regexp.MustCompile(`(from=)?(\[[0-9a-fA-F:.]+\]|[0-9]+(\.[0-9]+){3}):[0-9]+`)
)

func newLogWriter(l *slog.Logger, window time.Duration) *logWriter {
	return &logWriter{log: l, window: window, now: time.Now, seen: make(map[string]*logSeen)}
}

func (w *logWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for _, l := range []struct {
		tag   string
		level slog.Level
	}{{"[DEBUG]", slog.LevelDebug}, {"[INFO]", slog.LevelInfo}, {"[WARN]", slog.LevelWarn}, {"[ERR]", slog.LevelError}} {
		if i := strings.Index(line, l.tag); i >= 0 {
			level = l.level
			line = strings.TrimSpace(line[i+len(l.tag):])
			break
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	ctx := context.Background()
	if level < slog.LevelWarn {
		w.log.Log(ctx, level, line, "component", "memberlist")
		return len(p), nil
	}
	key := level.String() + " " + logAddrRE.ReplaceAllString(line, "ADDR")
	now := w.now()
	w.mu.Lock()
	s := w.seen[key]
	if s != nil && now.Sub(s.at) < w.window {
		s.suppressed++
		w.mu.Unlock()
		return len(p), nil
	}
	suppressed := 0
	if s != nil {
		suppressed = s.suppressed
	}
	if len(w.seen) >= maxLogKeys {
		w.forgetOldest()
	}
	w.seen[key] = &logSeen{at: now}
	w.mu.Unlock()
	if suppressed > 0 {
		w.log.Log(ctx, level, line, "component", "memberlist", "repeated", suppressed, "within", w.window)
	} else {
		w.log.Log(ctx, level, line, "component", "memberlist")
	}
	return len(p), nil
}

func (w *logWriter) forgetOldest() {
	var cutoff time.Time
	ts := make([]time.Time, 0, len(w.seen))
	for _, s := range w.seen {
		ts = append(ts, s.at)
	}
	// The median: forget the older half.
	slicesSortTimes(ts)
	cutoff = ts[len(ts)/2]
	for k, s := range w.seen {
		if !s.at.After(cutoff) {
			delete(w.seen, k)
		}
	}
}

func slicesSortTimes(ts []time.Time) {
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
}
