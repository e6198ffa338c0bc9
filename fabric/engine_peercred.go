package fabric

import (
	"context"
	"net"

	"google.golang.org/grpc/credentials"
)

// peerCred is the engine process at the other end of a connection to the
// engine socket, where the platform says (see peerCredOf); zero where not.
type peerCred struct {
	credentials.CommonAuthInfo
	pid int32
	uid uint32
}

func (peerCred) AuthType() string { return "peercred" }

// peerCreds are the engine socket's transport credentials: no security
// beyond the socket's file mode, but each connection learns its peer's
// process, for sessions. A client with insecure credentials talks to it.
type peerCreds struct{}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerCred{CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}}, nil
}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc := peerCredOf(c)
	pc.CommonAuthInfo = credentials.CommonAuthInfo{SecurityLevel: credentials.NoSecurity}
	return c, pc, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "insecure"}
}

func (peerCreds) Clone() credentials.TransportCredentials { return peerCreds{} }

func (peerCreds) OverrideServerName(string) error { return nil }
