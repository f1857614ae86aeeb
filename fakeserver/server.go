package fakeserver

import (
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
)

// Server is a fake server listening on a loopback port, shaped like
// httptest.Server: [NewServer] speaks HTTP, [NewTLSServer] HTTPS. Its methods (Stats, InjectFault, ...) are those of the
// embedded [Handler]. A Server is safe for concurrent use by multiple
// goroutines; Close is called once.
type Server struct {
	// URL is the base URL, http://127.0.0.1:port, or https://127.0.0.1:port
	// from NewTLSServer.
	URL string
	*Handler

	ts        *httptest.Server
	stopSweep context.CancelFunc
	sweepDone chan struct{}
}

// NewServer starts and returns a fake server on 127.0.0.1 and a free port.
// The caller calls Close when done; in a test:
//
//	srv := fakeserver.NewServer(opts)
//	t.Cleanup(srv.Close)
//
// nil opts means defaults.
func NewServer(opts *Options) *Server {
	h := NewHandler(opts)
	s := &Server{Handler: h, ts: httptest.NewUnstartedServer(h)}
	s.start()
	return s
}

// NewTLSServer starts and returns a fake server that speaks HTTPS, on
// 127.0.0.1 and a free port, as httptest.NewTLSServer does: its
// certificate is httptest's, for 127.0.0.1, ::1 and example.com, and only
// [Server.Client] trusts it. Use it to test a client's TLS setup, such
// as a pinned certificate or a custom RootCAs, against the contract.
// nil opts means defaults.
func NewTLSServer(opts *Options) *Server {
	h := NewHandler(opts)
	s := &Server{Handler: h, ts: httptest.NewUnstartedServer(h)}
	s.startTLS()
	return s
}

// startTLS is start over TLS.
func (s *Server) startTLS() {
	s.ts.StartTLS()
	s.URL = s.ts.URL
	s.startSweeper()
}

// start starts the server, and its background sweep if Options.SweepEvery
// is set.
func (s *Server) start() {
	s.ts.Start()
	s.URL = s.ts.URL
	s.startSweeper()
}

// startSweeper starts the background sweep if Options.SweepEvery is set.
func (s *Server) startSweeper() {
	if s.cfg.sweepEvery > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopSweep, s.sweepDone = cancel, make(chan struct{})
		go func() {
			defer close(s.sweepDone)
			s.runSweeper(ctx, s.cfg.sweepEvery)
		}()
	}
}

// Client returns an HTTP client for the server; for a server from
// NewTLSServer, one that trusts its certificate. Every call returns the
// same client; its idle connections are closed by Close.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Certificate returns the certificate of a server from NewTLSServer, and
// nil for one that speaks HTTP.
func (s *Server) Certificate() *x509.Certificate { return s.ts.Certificate() }

// Close stops the server, waiting for requests in flight to complete.
func (s *Server) Close() {
	if s.stopSweep != nil {
		s.stopSweep()
		<-s.sweepDone
	}
	s.ts.Close()
}
