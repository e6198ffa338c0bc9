package netbench

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// NewTLS starts a TLS 1.3-over-TCP server of cfg.Src and dials
// cfg.Parallel connections to it, one per worker (TCP has no streams): a
// worker writes an 8-byte big-endian block number and reads the block
// back. The Transport is named "tls".
func NewTLS(cfg Config) (*Transport, error) {
	if err := cfg.check(true); err != nil {
		return nil, err
	}
	return newTCP("tls", cfg, true)
}

// NewTCP is NewTLS over raw TCP, without encryption. The Transport is
// named "tcp".
func NewTCP(cfg Config) (*Transport, error) {
	if err := cfg.check(false); err != nil {
		return nil, err
	}
	return newTCP("tcp", cfg, false)
}

func newTCP(name string, cfg Config, secure bool) (_ *Transport, err error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ipOr(cfg.ServerIP).String(), "0"))
	if err != nil {
		return nil, err
	}
	if secure {
		sc := cfg.ServerTLS.Clone()
		sc.MinVersion = tls.VersionTLS13
		ln = tls.NewListener(ln, sc)
	}
	var mu sync.Mutex
	served := map[net.Conn]struct{}{}
	var wg sync.WaitGroup
	bs := cfg.BlockBytes
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			served[c] = struct{}{}
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var req [8]byte
				for {
					if _, err := io.ReadFull(c, req[:]); err != nil {
						return
					}
					b, err := block(cfg.Src, bs, binary.BigEndian.Uint64(req[:]))
					if err != nil {
						return
					}
					if _, err := c.Write(b); err != nil {
						return
					}
				}
			}()
		}
	}()
	conns := make([]net.Conn, max(1, cfg.Parallel))
	closeAll := func() error {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		err := ln.Close()
		mu.Lock()
		for c := range served {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
		return err
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ipOr(cfg.ClientIP)}, Timeout: 10 * time.Second}
	for i := range conns {
		c, err := d.Dial("tcp", ln.Addr().String())
		if err != nil {
			return nil, fmt.Errorf("netbench: %s dial: %w", name, err)
		}
		conns[i] = c
		if secure {
			cc := cfg.ClientTLS.Clone()
			cc.MinVersion = tls.VersionTLS13
			tc := tls.Client(c, cc)
			conns[i] = tc
			if err := tc.Handshake(); err != nil {
				return nil, fmt.Errorf("netbench: %s handshake: %w", name, err)
			}
		}
	}
	return &Transport{
		Name: name, Parallel: len(conns),
		Fetch: func(ctx context.Context, w int, first, n uint64) error {
			c := conns[w]
			if dl, ok := ctx.Deadline(); ok {
				c.SetDeadline(dl)
			}
			for blk := first; blk < first+n; blk++ {
				dst, err := block(cfg.Dst, bs, blk)
				if err != nil {
					return err
				}
				var req [8]byte
				binary.BigEndian.PutUint64(req[:], blk)
				if _, err := c.Write(req[:]); err != nil {
					return err
				}
				if _, err := io.ReadFull(c, dst); err != nil {
					return err
				}
			}
			return ctx.Err()
		},
		Closer: closeAll,
	}, nil
}
