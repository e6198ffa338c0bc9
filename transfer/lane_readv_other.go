//go:build !linux

package transfer

import (
	"net"

	"github.com/kvfabric/kvfabric/layout"
)

// readPiecesVec is readPieces where readv is not used.
func readPiecesVec(_ *net.TCPConn, pr *laneProgress, segs []layout.Segment, dst [][]byte) error {
	return readPieces(pr, segs, dst)
}
