package fakeserver

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

const benchBody = `{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`

// poster posts benchBody to a server, over one kept-alive connection.
type poster struct {
	url string
	c   *http.Client
}

func (p poster) post(tb testing.TB, key string) {
	r, _ := http.NewRequest(http.MethodPost, p.url+"/payments", strings.NewReader(benchBody))
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	resp, err := p.c.Do(r)
	if err != nil {
		tb.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		tb.Fatalf("status %d", resp.StatusCode)
	}
}

func startPoster(tb testing.TB, h http.Handler) poster {
	ts := httptest.NewServer(h)
	tb.Cleanup(ts.Close)
	return poster{url: ts.URL, c: ts.Client()}
}

// BenchmarkPayment puts the idempotency layer beside the same payment
// handler without it, both on loopback in one run. It reports each
// sub-benchmark's cost relative to the bare handler as "x-bare".
func BenchmarkPayment(b *testing.B) {
	var bare float64
	run := func(b *testing.B, h *Handler, key func(i int) string) float64 {
		p := startPoster(b, h)
		post := func(k string) { p.post(b, k) }
		post(key(-1)) // warm the connection and, for replays, store the record
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; b.Loop(); i++ {
			post(key(i))
		}
		return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	}
	b.Run("bare", func(b *testing.B) {
		bare = run(b, newHandler(nil, true), func(int) string { return "" })
	})
	ratio := func(b *testing.B, ns float64) {
		if bare > 0 {
			b.ReportMetric(ns/bare, "x-bare")
		}
	}
	b.Run("idempotent-fresh", func(b *testing.B) {
		ratio(b, run(b, NewHandler(nil), func(i int) string { return "key-" + strconv.Itoa(i) }))
	})
	b.Run("idempotent-replay", func(b *testing.B) {
		ratio(b, run(b, NewHandler(nil), func(int) string { return "key-replay" }))
	})
}

// BenchmarkPaymentInterleaved sends a bare, a fresh and a replayed payment
// in each iteration, so that the three see the same machine load, and
// reports the ratios. On a shared machine this is the ratio to trust.
func BenchmarkPaymentInterleaved(b *testing.B) {
	bare := startPoster(b, newHandler(nil, true))
	idem := startPoster(b, NewHandler(nil))
	bare.post(b, "")
	idem.post(b, "key-replay")
	var tBare, tFresh, tReplay time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		t0 := time.Now()
		bare.post(b, "")
		t1 := time.Now()
		idem.post(b, "key-"+strconv.Itoa(i))
		t2 := time.Now()
		idem.post(b, "key-replay")
		t3 := time.Now()
		tBare, tFresh, tReplay = tBare+t1.Sub(t0), tFresh+t2.Sub(t1), tReplay+t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(tBare.Nanoseconds())/n, "bare-ns/op")
	b.ReportMetric(float64(tFresh.Nanoseconds())/n, "fresh-ns/op")
	b.ReportMetric(float64(tReplay.Nanoseconds())/n, "replay-ns/op")
	b.ReportMetric(float64(tFresh)/float64(tBare), "fresh-x-bare")
	b.ReportMetric(float64(tReplay)/float64(tBare), "replay-x-bare")
}

// BenchmarkPaymentInProcess measures the same three without the network:
// the CPU the idempotency layer adds to a request.
func BenchmarkPaymentInProcess(b *testing.B) {
	serve := func(b *testing.B, h http.Handler, key string) {
		r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(benchBody))
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("status %d", w.Code)
		}
	}
	b.Run("bare", func(b *testing.B) {
		h := newHandler(nil, true)
		b.ReportAllocs()
		for b.Loop() {
			serve(b, h, "")
		}
	})
	b.Run("idempotent-fresh", func(b *testing.B) {
		h := NewHandler(nil)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			serve(b, h, "key-"+strconv.Itoa(i))
		}
	})
	b.Run("idempotent-replay", func(b *testing.B) {
		h := NewHandler(nil)
		serve(b, h, "key-replay")
		b.ReportAllocs()
		for b.Loop() {
			serve(b, h, "key-replay")
		}
	})
}
