package faultproxy_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/fakeserver/fault"
	"github.com/idemkit/idem/internal/faultproxy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const body = "0123456789abcdefghijklmnopqrstuvwxyz"

// recorder is an HTTP server that answers body and remembers how many
// request bodies it read whole.
type recorder struct {
	mu    sync.Mutex
	whole int
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err == nil && string(b) == "payload" {
		rec.mu.Lock()
		rec.whole++
		rec.mu.Unlock()
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, body)
}

func (rec *recorder) count() int {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.whole
}

func start(t *testing.T) (*faultproxy.Proxy, *recorder, *http.Client) {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	p, err := faultproxy.New(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	// A fresh connection per request, so each scripted cut meets exactly
	// one request and net/http does not retry on a reused one.
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	return p, rec, &http.Client{Transport: tr}
}

func post(hc *http.Client, url string) (*http.Response, []byte, error) {
	resp, err := hc.Post(url, "text/plain", bytes.NewReader([]byte("payload")))
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func TestPassThrough(t *testing.T) {
	t.Parallel()
	p, rec, hc := start(t)
	for range 3 {
		resp, b, err := post(hc, p.URL())
		require.NoError(t, err)
		assert.Equal(t, http.StatusOK, resp.StatusCode)
		assert.Equal(t, body, string(b))
	}
	assert.Equal(t, 3, rec.count())
	assert.Equal(t, faultproxy.Stats{Conns: 3}, p.Stats())
}

func TestCuts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cut faultproxy.Cut
		// wantStatus is 0 when no response arrives at all.
		wantStatus int
		wantBody   string
		// whole says whether the server read the whole request.
		whole int
	}{
		{cut: faultproxy.Cut{Point: faultproxy.InRequest, N: 0}},
		{cut: faultproxy.Cut{Point: faultproxy.InRequest, N: 10}},
		{cut: faultproxy.Cut{Point: faultproxy.AfterHeaders}, wantStatus: http.StatusOK, whole: 1},
		{cut: faultproxy.Cut{Point: faultproxy.InBody, N: 1}, wantStatus: http.StatusOK, wantBody: body[:1], whole: 1},
		{cut: faultproxy.Cut{Point: faultproxy.InBody, N: 20}, wantStatus: http.StatusOK, wantBody: body[:20], whole: 1},
	}
	for _, tt := range tests {
		t.Run(tt.cut.Point.String(), func(t *testing.T) {
			t.Parallel()
			p, rec, hc := start(t)
			p.Script(tt.cut)
			resp, b, err := post(hc, p.URL())
			require.Error(t, err, "a cut connection is never a whole answer")
			if tt.wantStatus == 0 {
				assert.Nil(t, resp)
			} else {
				require.NotNil(t, resp, "the headers arrived: %v", err)
				assert.Equal(t, tt.wantStatus, resp.StatusCode)
				assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a body shorter than its Content-Length")
				assert.Equal(t, tt.wantBody, string(b))
			}
			assert.Equal(t, tt.whole, rec.count())
			assert.Equal(t, faultproxy.Stats{Conns: 1, Cut: 1}, p.Stats())

			// The script is used up: the next connection passes.
			resp, b, err = post(hc, p.URL())
			require.NoError(t, err)
			assert.Equal(t, http.StatusOK, resp.StatusCode)
			assert.Equal(t, body, string(b))
		})
	}
}

func TestCloseEndsOpenConnections(t *testing.T) {
	t.Parallel()
	block := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(block) })
	p, err := faultproxy.New(strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	tr := &http.Transport{DisableKeepAlives: true}
	t.Cleanup(tr.CloseIdleConnections)
	done := make(chan error, 1)
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get(p.URL())
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	require.Eventually(t, func() bool { return p.Stats().Conns == 1 }, testTimeout, testTick)
	require.NoError(t, p.Close())
	assert.Error(t, <-done, "the client sees the proxy go away")
}

const (
	testTimeout = 10 * time.Second
	testTick    = time.Millisecond
)

// A rule of package fault picks connections by their number.
func TestInject(t *testing.T) {
	t.Parallel()
	t.Run("a rule cuts the connections it picks", func(t *testing.T) {
		t.Parallel()
		p, rec, hc := start(t)
		p.Inject(&fault.Rule{When: fault.Attempt(2), Effect: fault.Effect{Kind: fault.CutAnswer, Bytes: 3}})
		p.Inject(&fault.Rule{When: fault.Attempt(3), Effect: fault.Effect{Kind: fault.Reset}})
		_, b, err := post(hc, p.URL())
		require.NoError(t, err)
		assert.Equal(t, body, string(b))
		_, b, err = post(hc, p.URL())
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.Equal(t, body[:3], string(b))
		resp, _, err := post(hc, p.URL())
		require.Error(t, err)
		assert.Nil(t, resp, "a reset connection answers nothing")
		assert.Equal(t, 2, rec.count(), "the reset request never reached the server")
		assert.Equal(t, faultproxy.Stats{Conns: 3, Cut: 2}, p.Stats())
	})
	t.Run("a script after connections cuts the next one", func(t *testing.T) {
		t.Parallel()
		p, _, hc := start(t)
		_, _, err := post(hc, p.URL())
		require.NoError(t, err)
		p.Script(faultproxy.Cut{}, faultproxy.Cut{Point: faultproxy.AfterHeaders})
		_, _, err = post(hc, p.URL())
		require.NoError(t, err, "the first scripted connection passes")
		_, b, err := post(hc, p.URL())
		assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
		assert.Empty(t, b)
		p.Script(faultproxy.Cut{Point: faultproxy.InRequest})
		_, _, err = post(hc, p.URL())
		assert.Error(t, err)
		assert.Equal(t, faultproxy.Stats{Conns: 4, Cut: 2}, p.Stats())
	})
}
