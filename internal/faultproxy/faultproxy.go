// Package faultproxy is a TCP proxy for tests that breaks connections below
// HTTP at chosen points: before the request is fully read, right after the
// response headers, or in the middle of the response body. It exists to
// prove that a client never takes a cut-off answer for a success.
//
// Its faults are rules of package fault. A rule's op is one connection,
// and its Attempt the connection's number from 1. The proxy applies the
// cuts (fault.CutRequest, fault.CutAnswer) and fault.Reset.
//
// Only loopback targets are meant; the proxy listens on 127.0.0.1.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/idemkit/idem/fakeserver/fault"
)

// Point is where a connection is cut.
type Point int

const (
	// None forwards the connection untouched.
	None Point = iota
	// InRequest closes the connection after Cut.N bytes of the request have
	// been forwarded to the server: the server never reads a whole request.
	InRequest
	// AfterHeaders closes the connection right after the first response's
	// header block (the blank line included) has reached the client.
	AfterHeaders
	// InBody closes the connection after the first response's headers and
	// Cut.N bytes of what follows them (chunk framing included, if any).
	InBody
)

func (p Point) String() string {
	switch p {
	case None:
		return "none"
	case InRequest:
		return "in-request"
	case AfterHeaders:
		return "after-headers"
	case InBody:
		return "in-body"
	}
	return fmt.Sprintf("Point(%d)", int(p))
}

// Cut says where one connection is broken.
type Cut struct {
	Point Point
	N     int
}

// Effect returns the cut as an effect of package fault. None has none.
func (c Cut) Effect() (fault.Effect, bool) {
	switch c.Point {
	case InRequest:
		return fault.Effect{Kind: fault.CutRequest, Bytes: c.N}, true
	case AfterHeaders:
		return fault.Effect{Kind: fault.CutAnswer}, true
	case InBody:
		return fault.Effect{Kind: fault.CutAnswer, Bytes: c.N}, true
	}
	return fault.Effect{}, false
}

// cutOf returns the cut the effects ask for. A reset cuts the request
// before its first byte. An answer cut of negative length keeps none of
// the body: the proxy does not know its length.
func cutOf(es fault.Effects) Cut {
	if _, ok := es.Get(fault.Reset); ok {
		return Cut{Point: InRequest}
	}
	if e, ok := es.Get(fault.CutRequest); ok {
		return Cut{Point: InRequest, N: max(e.Bytes, 0)}
	}
	if e, ok := es.Get(fault.CutAnswer); ok {
		return Cut{Point: InBody, N: max(e.Bytes, 0)}
	}
	return Cut{}
}

// Proxy forwards TCP connections from its address to a target, applying
// the scripted cuts to the next connections in order and passing the rest
// through. A Proxy is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	faults fault.List
	mu     sync.Mutex
	// scripted is the number of the last connection a script cuts.
	scripted int
	conns    map[net.Conn]struct{}
	stats    Stats
	closed   bool

	wg sync.WaitGroup
}

// Stats counts what the proxy did.
type Stats struct {
	Conns int // connections accepted
	Cut   int // connections cut as scripted
}

// New starts a proxy on 127.0.0.1 and a free port that forwards to target
// (host:port). Call Close when done.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns http://host:port of the proxy.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// Script queues cuts for the next connections, one per connection. Each
// cut is a rule for the connection with its number.
func (p *Proxy) Script(cuts ...Cut) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cuts {
		p.scripted = max(p.scripted, p.stats.Conns) + 1
		if e, ok := c.Effect(); ok {
			_ = p.faults.Add(&fault.Rule{When: fault.Attempt(p.scripted), Effect: e, Times: 1})
		}
	}
}

// Inject adds a rule. Each connection asks the rules in the order added.
func (p *Proxy) Inject(r *fault.Rule) { _ = p.faults.Add(r) }

// Stats returns the counters now.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops accepting, closes every open connection and waits for the
// proxy's goroutines to end.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.stats.Conns++
		cut := cutOf(p.faults.Inject(fault.Op{Attempt: p.stats.Conns}))
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		p.conns[c] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(c, cut)
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *Proxy) countCut() {
	p.mu.Lock()
	p.stats.Cut++
	p.mu.Unlock()
}

// serve pumps one connection both ways until either side ends or the cut
// is made, then closes both.
func (p *Proxy) serve(client net.Conn, cut Cut) {
	defer p.wg.Done()
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		_ = client.Close()
		p.forget(client)
		return
	}
	if !p.track(server) {
		_ = server.Close()
		_ = client.Close()
		p.forget(client)
		return
	}
	var once sync.Once
	closeBoth := func() {
		once.Do(func() {
			_ = client.Close()
			_ = server.Close()
		})
	}
	defer p.forget(client, server)

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // client -> server
		defer wg.Done()
		defer closeBoth()
		if cut.Point == InRequest {
			if _, err := io.CopyN(server, client, int64(cut.N)); err == nil {
				p.countCut()
			}
			return
		}
		_, _ = io.Copy(server, client)
	}()
	go func() { // server -> client
		defer wg.Done()
		defer closeBoth()
		switch cut.Point {
		case AfterHeaders, InBody:
			n := 0
			if cut.Point == InBody {
				n = cut.N
			}
			if err := copyHeadersAnd(client, server, n); err == nil {
				p.countCut()
			}
		default:
			_, _ = io.Copy(client, server)
		}
	}()
	wg.Wait()
}

var errShort = errors.New("faultproxy: the response ended before the cut point")

// copyHeadersAnd forwards from src to dst the first response's header block
// and n bytes after it, then returns; errShort if src ended sooner.
func copyHeadersAnd(dst io.Writer, src io.Reader, n int) error {
	var seen []byte // bytes read until the end of the headers is known
	buf := make([]byte, 4096)
	limit := -1 // total bytes to forward, once known
	sent := 0
	for {
		m, err := src.Read(buf)
		if m > 0 {
			chunk := buf[:m]
			if limit < 0 {
				seen = append(seen, chunk...)
				if i := bytes.Index(seen, []byte("\r\n\r\n")); i >= 0 {
					limit = i + 4 + n
				}
			}
			if limit >= 0 {
				if rest := limit - sent; len(chunk) > rest {
					chunk = chunk[:rest]
				}
			}
			w, werr := dst.Write(chunk)
			sent += w
			if werr != nil {
				return werr
			}
			if limit >= 0 && sent >= limit {
				return nil
			}
		}
		if err != nil {
			return errShort
		}
	}
}
