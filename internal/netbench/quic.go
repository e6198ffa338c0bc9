package netbench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/quic-go/quic-go"
)

// Config describes a baseline: the blocks it serves and how it connects.
type Config struct {
	// Src holds the blocks served, back to back; block i is
	// Src[i×BlockBytes : (i+1)×BlockBytes].
	Src []byte
	// Dst receives block i at the same offset as in Src. It must be at
	// least as long as the blocks fetched.
	Dst []byte
	// BlockBytes is the size of one block. Required.
	BlockBytes uint64
	// Parallel is how many blocks are in flight: concurrent streams over
	// QUIC, connections over TCP (which has no streams). If zero, 1.
	Parallel int
	// Conns is how many QUIC connections the streams spread over
	// (ignored by TCP). If zero, 1.
	Conns int
	// ServerTLS and ClientTLS secure QUIC and TLS-over-TCP: the same
	// certificates, verification and ALPN as the path compared against,
	// so that the baseline pays the same crypto. Unused by raw TCP.
	ServerTLS, ClientTLS *tls.Config
	// QUIC is the quic-go configuration of both ends (windows, stream
	// limits). If nil, quic-go's defaults.
	QUIC *quic.Config
	// ServerIP and ClientIP are the loopback addresses listeners and
	// dialers bind. If nil, 127.0.0.1.
	ServerIP, ClientIP net.IP
	// UDPBuffer, if positive, is asked of the kernel as the UDP sockets'
	// send and receive buffers (as the agent does for its own sockets).
	UDPBuffer int
}

func (c *Config) check(needTLS bool) error {
	switch {
	case c.BlockBytes == 0:
		return errors.New("netbench: BlockBytes is zero")
	case uint64(len(c.Src)) < c.BlockBytes:
		return fmt.Errorf("netbench: Src of %d bytes holds no block of %d", len(c.Src), c.BlockBytes)
	case len(c.Dst) < len(c.Src):
		return fmt.Errorf("netbench: Dst of %d bytes is shorter than Src (%d)", len(c.Dst), len(c.Src))
	case needTLS && (c.ServerTLS == nil || c.ClientTLS == nil):
		return errors.New("netbench: ServerTLS and ClientTLS are required")
	}
	return nil
}

func ipOr(ip net.IP) net.IP {
	if ip == nil {
		return net.IPv4(127, 0, 0, 1)
	}
	return ip
}

// block returns block i of buf, or an error when it lies outside.
func block(buf []byte, bs, i uint64) ([]byte, error) {
	if i >= uint64(len(buf))/bs {
		return nil, fmt.Errorf("netbench: block %d outside %d blocks", i, uint64(len(buf))/bs)
	}
	return buf[i*bs : (i+1)*bs], nil
}

func (c *Config) udp(ip net.IP) (*net.UDPConn, error) {
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: ipOr(ip)})
	if err != nil {
		return nil, err
	}
	if c.UDPBuffer > 0 {
		_ = uc.SetReadBuffer(c.UDPBuffer)
		_ = uc.SetWriteBuffer(c.UDPBuffer)
	}
	return uc, nil
}

// NewQUIC starts a bare quic-go server of cfg.Src and dials cfg.Conns
// connections to it. A block moves on its own stream: an 8-byte
// big-endian block number as the request, the block's bytes in one write
// as the answer. Fetches spread over the connections by worker. The
// Transport is named "quic"; Close stops both ends.
func NewQUIC(cfg Config) (_ *Transport, err error) {
	if err := cfg.check(true); err != nil {
		return nil, err
	}
	var closers []func() error
	closeAll := func() error {
		var errs []error
		for i := len(closers) - 1; i >= 0; i-- {
			errs = append(errs, closers[i]())
		}
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	uc, err := cfg.udp(cfg.ServerIP)
	if err != nil {
		return nil, err
	}
	str := &quic.Transport{Conn: uc}
	closers = append(closers, str.Close)
	ln, err := str.Listen(cfg.ServerTLS, cfg.QUIC)
	if err != nil {
		return nil, err
	}
	closers = append(closers, ln.Close)
	bs := cfg.BlockBytes
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			go serveQUIC(c, cfg.Src, bs)
		}
	}()
	conns := make([]*quic.Conn, max(1, cfg.Conns))
	for i := range conns {
		cu, err := cfg.udp(cfg.ClientIP)
		if err != nil {
			return nil, err
		}
		ct := &quic.Transport{Conn: cu}
		closers = append(closers, ct.Close)
		c, err := ct.Dial(context.Background(), ln.Addr(), cfg.ClientTLS, cfg.QUIC)
		if err != nil {
			return nil, fmt.Errorf("netbench: quic dial: %w", err)
		}
		closers = append(closers, func() error { return c.CloseWithError(0, "") })
		conns[i] = c
	}
	return &Transport{
		Name: "quic", Parallel: max(1, cfg.Parallel),
		Fetch: func(ctx context.Context, w int, first, n uint64) error {
			for blk := first; blk < first+n; blk++ {
				dst, err := block(cfg.Dst, bs, blk)
				if err != nil {
					return err
				}
				if err := fetchQUIC(ctx, conns[w%len(conns)], blk, dst); err != nil {
					return err
				}
			}
			return nil
		},
		Closer: closeAll,
	}, nil
}

func serveQUIC(c *quic.Conn, src []byte, bs uint64) {
	for {
		s, err := c.AcceptStream(context.Background())
		if err != nil {
			return
		}
		go func() {
			var req [8]byte
			if _, err := io.ReadFull(s, req[:]); err != nil {
				s.CancelWrite(1)
				return
			}
			b, err := block(src, bs, binary.BigEndian.Uint64(req[:]))
			if err != nil {
				s.CancelWrite(2)
				return
			}
			s.Write(b)
			s.Close()
		}()
	}
}

func fetchQUIC(ctx context.Context, c *quic.Conn, blk uint64, dst []byte) error {
	s, err := c.OpenStreamSync(ctx)
	if err != nil {
		return err
	}
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], blk)
	if _, err := s.Write(req[:]); err != nil {
		s.CancelRead(0)
		return err
	}
	s.Close()
	_, err = io.ReadFull(s, dst)
	return err
}
