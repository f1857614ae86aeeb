package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
)

// BenchmarkDo puts one successful idem Do (memory store: send, record the
// outcome) beside a plain http.Client.Do of the same request, fresh key
// included, to the same fake server on loopback. The two alternate within
// one loop, so drift on the machine hits both alike. do/plain is the send
// alone; idem/plain adds creating and saving the intent, which an app does
// earlier, when the Pay button is shown.
func BenchmarkDo(b *testing.B) {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	hc := srv.Client()
	c, err := idem.NewWith(idem.WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"bench"}`)
	url := srv.URL + "/payments"
	ctx := context.Background()

	plain := func() { plainPayment(b, ctx, hc, url, body) }
	newIntent := func() *idem.Intent {
		in, err := c.NewIntent(ctx, "", idem.Request{
			Method: http.MethodPost, URL: url,
			Header: http.Header{"Content-Type": {"application/json"}}, Body: body,
		})
		if err != nil {
			b.Fatal(err)
		}
		return in
	}
	do := func(in *idem.Intent) {
		resp, err := c.Do(ctx, in)
		if err != nil || resp.StatusCode != http.StatusCreated {
			b.Fatalf("idem: %v", err)
		}
	}
	withIdem := func() { do(newIntent()) }
	// Warm the connection pool, then count allocations outside the timed
	// loop, where reading memory statistics would stop the world.
	plainAllocs := testing.AllocsPerRun(100, plain)
	idemAllocs := testing.AllocsPerRun(100, withIdem)

	// One plain request and one idem payment per iteration, in turn first,
	// so that neither always runs on the machine the other left.
	plainLat := make([]time.Duration, 0, b.N)
	intentLat := make([]time.Duration, 0, b.N)
	doLat := make([]time.Duration, 0, b.N)
	idemLat := make([]time.Duration, 0, b.N)
	withIdemTimed := func() {
		t0 := time.Now()
		in := newIntent()
		t1 := time.Now()
		do(in)
		t2 := time.Now()
		intentLat = append(intentLat, t1.Sub(t0))
		doLat = append(doLat, t2.Sub(t1))
		idemLat = append(idemLat, t2.Sub(t0))
	}
	plainTimed := func() {
		t0 := time.Now()
		plain()
		plainLat = append(plainLat, time.Since(t0))
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			plainTimed()
			withIdemTimed()
		} else {
			withIdemTimed()
			plainTimed()
		}
	}
	b.StopTimer()
	plainP50 := float64(p50(plainLat))
	b.ReportMetric(plainP50, "plain-p50-ns")
	b.ReportMetric(float64(p50(intentLat)), "intent-p50-ns")
	// The send itself, and the whole price of an intent (made when the
	// Pay button is shown, then sent), at p50 as cmd/idembench reports.
	b.ReportMetric(float64(p50(doLat))/plainP50, "do/plain-p50")
	b.ReportMetric(float64(p50(idemLat))/plainP50, "idem/plain-p50")
	b.ReportMetric(plainAllocs, "plain-allocs/op")
	b.ReportMetric(idemAllocs, "idem-allocs/op")
}

// plainPayment is one payment without idem: a POST with a fresh key,
// its answer read whole, as idem reads it.
func plainPayment(b *testing.B, ctx context.Context, hc *http.Client, url string, body []byte) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", uuid.NewString())
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		b.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b.Fatalf("plain: status %d", resp.StatusCode)
	}
}

// p50 is the nearest-rank median of lat.
func p50(lat []time.Duration) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[(len(s)+1)/2-1]
}

// BenchmarkPayment runs one kind of payment alone per sub-benchmark: a
// plain http.Client.Do with a fresh key, or an idem payment (NewIntent and
// Do, on a memory store). Its cpu-ns/op is the process's CPU time per
// payment, the client's and the fake server's work together. The
// difference of the two is the CPU idem adds to a payment. It moves less
// with the machine's load than BenchmarkDo's p50 or ns/op, which count
// time spent waiting for a core.
func BenchmarkPayment(b *testing.B) {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	hc := srv.Client()
	c, err := idem.NewWith(idem.WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"bench"}`)
	url := srv.URL + "/payments"
	ctx := context.Background()
	b.Run("plain", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := processCPU()
		for b.Loop() {
			plainPayment(b, ctx, hc, url, body)
		}
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("idem", func(b *testing.B) {
		b.ReportAllocs()
		cpu0 := processCPU()
		for b.Loop() {
			in, err := c.NewIntent(ctx, "", idem.Request{
				Method: http.MethodPost, URL: url,
				Header: http.Header{"Content-Type": {"application/json"}}, Body: body,
			})
			if err != nil {
				b.Fatal(err)
			}
			resp, err := c.Do(ctx, in)
			if err != nil || resp.StatusCode != http.StatusCreated {
				b.Fatalf("idem: %v", err)
			}
		}
		b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N), "cpu-ns/op")
	})
}
