package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem/fakeserver"
)

// layerVariants returns the fake server's payment handler called directly
// (no network): bare, behind the idempotency layer with a fresh key per
// request, and behind it replaying one completed key. Every request carries
// a key, so the bare handler parses one too.
func layerVariants() ([]variant, error) {
	bare := fakeserver.NewBareHandler(nil)
	layered := fakeserver.NewHandler(nil)
	replayKey := uuid.NewString()
	serve := func(h http.Handler, key string, want int) error {
		req, err := http.NewRequest(http.MethodPost, "http://127.0.0.1/payments", bytes.NewReader(paymentBody))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			return fmt.Errorf("status %d, want %d: %s", rec.Code, want, rec.Body)
		}
		return nil
	}
	if err := serve(layered, replayKey, http.StatusCreated); err != nil {
		return nil, err
	}
	return []variant{
		{name: "bare handler", do: func(context.Context) error { return serve(bare, uuid.NewString(), http.StatusCreated) }},
		{name: "layer, fresh key", do: func(context.Context) error { return serve(layered, uuid.NewString(), http.StatusCreated) }},
		{name: "layer, replay", do: func(context.Context) error { return serve(layered, replayKey, http.StatusCreated) }},
	}, nil
}

// loopbackLayerVariants returns the same three over loopback, through a
// plain net/http client: what a client of the server sees. The caller
// calls the returned close function.
func loopbackLayerVariants() ([]variant, func(), error) {
	bare := httptest.NewServer(fakeserver.NewBareHandler(nil))
	layered := httptest.NewServer(fakeserver.NewHandler(nil))
	closeAll := func() { bare.Close(); layered.Close() }
	post := func(srv *httptest.Server, key string) func(context.Context) error {
		hc := srv.Client()
		url := srv.URL + "/payments"
		return func(ctx context.Context) error {
			k := key
			if k == "" {
				k = uuid.NewString()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(paymentBody))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", k)
			return finish(hc.Do(req))
		}
	}
	replay := post(layered, uuid.NewString())
	if err := replay(context.Background()); err != nil {
		closeAll()
		return nil, nil, err
	}
	return []variant{
		{name: "loopback: bare handler", do: post(bare, "")},
		{name: "loopback: layer, fresh key", do: post(layered, "")},
		{name: "loopback: layer, replay", do: replay},
	}, closeAll, nil
}

// StormReport is the outcome of many concurrent requests for one key.
type StormReport struct {
	Requests        int
	ProcessingDelay time.Duration
	// Executions is how often the server ran the payment: it must be 1.
	Executions int
	// Created counts the fresh 201, Replayed the 201s replayed from the
	// record (requests that arrived after it completed), InProgress the
	// 409s, and Other the rest, transport errors included.
	Created, Replayed, InProgress, Other int
	// AllAnswered is the time from the release of the requests until the
	// last answer arrived.
	AllAnswered time.Duration
}

// storm sends n concurrent requests with one key, one attempt each, to a
// fake server on loopback whose payments take delay, so that they overlap.
func storm(ctx context.Context, n int, delay time.Duration) (*StormReport, error) {
	srv := fakeserver.NewServer(&fakeserver.Options{ProcessingDelay: delay})
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: n, MaxIdleConns: n}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	url := srv.URL + "/payments"
	key := uuid.NewString()
	// Open the n connections first, with admin requests that the server
	// does not count, so that the storm measures the server, not dialing.
	var dial sync.WaitGroup
	for range n {
		dial.Go(func() {
			if resp, err := hc.Get(srv.URL + "/_fake/stats"); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	dial.Wait()

	status := make([]int, n)
	replayed := make([]bool, n)
	var ready, done sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		ready.Add(1)
		done.Go(func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(paymentBody))
			if err == nil {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
			}
			ready.Done()
			<-release
			if err != nil {
				return
			}
			resp, err := hc.Do(req)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status[i] = resp.StatusCode
			replayed[i] = resp.Header.Get("Idempotent-Replayed") == "true"
		})
	}
	ready.Wait()
	before := srv.Stats().Executions
	start := time.Now()
	close(release)
	done.Wait()
	r := &StormReport{Requests: n, ProcessingDelay: delay, AllAnswered: time.Since(start),
		Executions: srv.Stats().Executions - before}
	for i, s := range status {
		switch {
		case s == http.StatusCreated && replayed[i]:
			r.Replayed++
		case s == http.StatusCreated:
			r.Created++
		case s == http.StatusConflict:
			r.InProgress++
		default:
			r.Other++
		}
	}
	return r, nil
}
