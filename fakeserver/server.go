package fakeserver

import (
	"context"
	"net/http"
	"net/http/httptest"
)

// Server is a fake server listening on a loopback port, shaped like
// httptest.Server. Its methods (Stats, InjectFault, ...) are those of the
// embedded [Handler]. A Server is safe for concurrent use by multiple
// goroutines; Close is called once.
type Server struct {
	// URL is the base URL, http://127.0.0.1:port, set when it starts.
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

// start starts the server, and its background sweep if Options.SweepEvery
// is set.
func (s *Server) start() {
	s.ts.Start()
	s.URL = s.ts.URL
	if s.cfg.sweepEvery > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopSweep, s.sweepDone = cancel, make(chan struct{})
		go func() {
			defer close(s.sweepDone)
			s.runSweeper(ctx, s.cfg.sweepEvery)
		}()
	}
}

// Client returns an HTTP client for the server. Every call returns the same
// client; its idle connections are closed by Close.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Close stops the server, waiting for requests in flight to complete.
func (s *Server) Close() {
	if s.stopSweep != nil {
		s.stopSweep()
		<-s.sweepDone
	}
	s.ts.Close()
}
