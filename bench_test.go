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

	var plainT, intentT, doT time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		plain()
		t1 := time.Now()
		in := newIntent()
		t2 := time.Now()
		do(in)
		t3 := time.Now()
		plainT += t1.Sub(t0)
		intentT += t2.Sub(t1)
		doT += t3.Sub(t2)
	}
	n := float64(b.N)
	b.ReportMetric(float64(plainT.Nanoseconds())/n, "plain-ns/op")
	b.ReportMetric(float64(intentT.Nanoseconds())/n, "intent-ns/op")
	b.ReportMetric(float64(doT.Nanoseconds())/n, "do-ns/op")
	// The send itself, and the whole price of an intent (made when the
	// Pay button is shown, then sent).
	b.ReportMetric(float64(doT)/float64(plainT), "do/plain")
	b.ReportMetric(float64(intentT+doT)/float64(plainT), "idem/plain")
	b.ReportMetric(plainAllocs, "plain-allocs/op")
	b.ReportMetric(idemAllocs, "idem-allocs/op")
}
