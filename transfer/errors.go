package transfer

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinels that errors from calls match with errors.Is. A handler wraps
// one of them to choose the code its caller sees.
var (
	// ErrInvalidRequest: the request is malformed or out of bounds.
	ErrInvalidRequest = errors.New("transfer: invalid request")
	// ErrNotFound: the named thing (block set, region, lease) is unknown.
	ErrNotFound = errors.New("transfer: not found")
	// ErrLeaseRefused: a read touches memory that the lease does not cover,
	// or the lease is not live.
	ErrLeaseRefused = errors.New("transfer: refused by lease")
	// ErrUnavailable: the holder cannot serve now (no handler, shutting
	// down, overloaded).
	ErrUnavailable = errors.New("transfer: unavailable")
	// ErrTooLarge: a frame or request exceeds the configured caps.
	ErrTooLarge = errors.New("transfer: too large")
	// ErrInternal: the holder failed in a way that is not the caller's.
	ErrInternal = errors.New("transfer: internal error")
	// ErrNotMember: the peer's certificate is valid but names a node that
	// is not a current member (or not the node dialed).
	ErrNotMember = errors.New("transfer: peer is not a current member")
	// ErrTimeout: the peer did not answer within the call's bound.
	ErrTimeout = errors.New("transfer: peer did not answer in time")
	// ErrClosed: the node is closed.
	ErrClosed = errors.New("transfer: node closed")
)

// Code is the wire form of an error's kind.
type Code uint32

// Error codes on the wire.
const (
	CodeInternal Code = iota
	CodeInvalidRequest
	CodeNotFound
	CodeLeaseRefused
	CodeUnavailable
	CodeTooLarge
)

var codeSentinel = map[Code]error{
	CodeInternal:       ErrInternal,
	CodeInvalidRequest: ErrInvalidRequest,
	CodeNotFound:       ErrNotFound,
	CodeLeaseRefused:   ErrLeaseRefused,
	CodeUnavailable:    ErrUnavailable,
	CodeTooLarge:       ErrTooLarge,
}

// codeOrder is the order codeOf tries the sentinels in, the most specific
// first: an error may wrap two (a read refused by the lease wraps the
// handler's reason too), and its code must not depend on map order.
var codeOrder = []Code{CodeTooLarge, CodeLeaseRefused, CodeNotFound, CodeUnavailable, CodeInvalidRequest, CodeInternal}

func codeOf(err error) Code {
	for _, c := range codeOrder {
		if errors.Is(err, codeSentinel[c]) {
			return c
		}
	}
	return CodeInternal
}

// MaxErrorMessage bounds the text of an error a node sends a peer, and
// what it keeps of one a peer sent (the rest is cut, with how much was):
// a peer's refusal reaches logs and engines' errors.
const MaxErrorMessage = 1024

// errorMessage is msg as an Error frame carries it, or as a peer's is
// kept: at most MaxErrorMessage bytes of valid UTF-8 (proto3 strings
// must be: a cut rune or a handler's raw bytes would turn an answer into
// a reset).
func errorMessage(msg string) string {
	if len(msg) > MaxErrorMessage {
		// The note of the length takes at most 32 bytes: the text stays
		// within the bound, and one cut already is not cut again.
		msg = fmt.Sprintf("%s... (%d bytes)", msg[:MaxErrorMessage-32], len(msg))
	}
	return strings.ToValidUTF8(msg, "?")
}

// RemoteError is an error that the holder sent back for a call.
type RemoteError struct {
	Peer    string
	Method  string
	Code    Code
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("transfer: %s from %s: %s", e.Method, e.Peer, e.Message)
}

// Is matches the sentinel of e's code.
func (e *RemoteError) Is(target error) bool {
	s, ok := codeSentinel[e.Code]
	if !ok {
		s = ErrInternal
	}
	return target == s
}

// Stream and connection error codes (QUIC application error codes).
const (
	streamErrCancelled = 0x10 // the caller gave up (context, progress timeout)
	streamErrProtocol  = 0x11 // a frame did not parse
	connErrClosing     = 0x20 // the node is closing
	connErrNotMember   = 0x21 // the peer is no longer a member
	connErrTimedOut    = 0x22 // a call on the connection timed out (dropSilent)
)
