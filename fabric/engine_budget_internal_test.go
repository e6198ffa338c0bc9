package fabric

import (
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The budget takes requests up to each bound and refuses one byte past,
// per session and in total; what is given back can be taken again.
func TestRequestBudget(t *testing.T) {
	b := newRequestBudget(100, 60)
	steps := []struct {
		desc    string
		session uint64
		n       int64
		ok      bool
	}{
		{"session 1 at its bound", 1, 60, true},
		{"session 1 one byte past its bound", 1, 1, false},
		{"session 2 up to the total", 2, 40, true},
		{"session 3 one byte past the total", 3, 1, false},
	}
	for _, s := range steps {
		err := b.take(s.session, s.n)
		if (err == nil) != s.ok {
			t.Fatalf("%s: %v, want ok=%v", s.desc, err, s.ok)
		}
		if err != nil && status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("%s: code %v, want ResourceExhausted", s.desc, status.Code(err))
		}
	}
	if used, refused := b.snapshot(); used != 100 || refused != 2 {
		t.Fatalf("used %d refused %d, want 100 and 2", used, refused)
	}
	b.give(1, 60)
	if err := b.take(3, 60); err != nil {
		t.Fatalf("after session 1 gave back: %v", err)
	}
	b.give(2, 40)
	b.give(3, 60)
	if used, _ := b.snapshot(); used != 0 || len(b.bySession) != 0 {
		t.Fatalf("all given back: used %d, sessions %v", used, b.bySession)
	}
}
