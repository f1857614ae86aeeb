package idem_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
)

// BenchmarkDo puts one successful idem Do (memory store: create the intent,
// send, record the outcome) beside a plain http.Client.Do of the same
// request, fresh key included, to the same fake server on loopback. The two
// alternate within one loop, so drift on the machine hits both alike; the
// ratio is reported as idem/plain.
func BenchmarkDo(b *testing.B) {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	hc := srv.Client()
	c, err := idem.New(idem.WithHTTPClient(hc))
	if err != nil {
		b.Fatal(err)
	}
	body := []byte(`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"bench"}`)
	url := srv.URL + "/payments"
	ctx := context.Background()

	plain := func() {
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
		// A real client reads the answer, as idem does.
		if _, err := io.ReadAll(resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b.Fatalf("plain: status %d", resp.StatusCode)
		}
	}
	withIdem := func() {
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
	// Warm the connection pool, then count allocations outside the timed
	// loop, where reading memory statistics would stop the world.
	plainAllocs := testing.AllocsPerRun(100, plain)
	idemAllocs := testing.AllocsPerRun(100, withIdem)

	var plainT, idemT time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		plain()
		t1 := time.Now()
		withIdem()
		t2 := time.Now()
		plainT += t1.Sub(t0)
		idemT += t2.Sub(t1)
	}
	n := float64(b.N)
	b.ReportMetric(float64(plainT.Nanoseconds())/n, "plain-ns/op")
	b.ReportMetric(float64(idemT.Nanoseconds())/n, "idem-ns/op")
	b.ReportMetric(float64(idemT)/float64(plainT), "idem/plain")
	b.ReportMetric(plainAllocs, "plain-allocs/op")
	b.ReportMetric(idemAllocs, "idem-allocs/op")
}
