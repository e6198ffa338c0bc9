package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// indexEcho is a memHandler that serves index calls by answering the
// caller's name and payload.
type indexEcho struct{ *memHandler }

func (h indexEcho) IndexCall(ctx context.Context, peer string, payload []byte) ([]byte, error) {
	if payload[0] == 0xff {
		return nil, ErrNotFound
	}
	return append([]byte(peer+":"), payload...), nil
}

func TestIndexCall(t *testing.T) {
	ca := newTestCA(t)
	members := newMembers("a", "b", "c")
	a := newTestNode(t, ca, "a", members, newMemHandler())
	b := newTestNode(t, ca, "b", members, indexEcho{newMemHandler()})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	tests := []struct {
		desc    string
		to      *Node
		payload []byte
		want    []byte
		code    Code // of the refusal, 0 for none
	}{
		{desc: "answered", to: b, payload: []byte("hi"), want: []byte("a:hi")},
		{desc: "handler error carries its code", to: b, payload: []byte{0xff}, code: CodeNotFound},
		{desc: "no IndexHandler: unavailable", to: a, payload: []byte("hi"), code: CodeUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			from := a
			if tc.to == a {
				from = b
			}
			p := dialPeer(t, from, tc.to)
			got, err := p.IndexCall(ctx, tc.payload)
			if tc.code != 0 {
				var re *RemoteError
				if !errors.As(err, &re) || re.Code != tc.code || re.Method != "index" {
					t.Fatalf("IndexCall = %q, %v; want a refusal with code %v", got, err, tc.code)
				}
				return
			}
			if err != nil || !bytes.Equal(got, tc.want) {
				t.Fatalf("IndexCall = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	t.Run("empty payload refused before sending", func(t *testing.T) {
		if _, err := dialPeer(t, a, b).IndexCall(ctx, nil); !errors.Is(err, ErrInvalidRequest) {
			t.Fatalf("IndexCall(nil) = %v, want ErrInvalidRequest", err)
		}
	})
}
