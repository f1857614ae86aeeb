package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/google/uuid"
	"github.com/hashicorp/go-retryablehttp"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// paymentBody is the request every variant sends.
var paymentBody = []byte(`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"bench"}`)

// ClientReport compares the client variants and counts the durable writes
// of the file store.
type ClientReport struct {
	Results []Result
	// Concurrency is the number of goroutines per batch.
	Concurrency int
	// FileSaves is how many Saves (durable before returning) the
	// idem(file) variant made, FileDeferred how many SaveDeferreds, and
	// FileIntents how many intents it brought to success.
	FileSaves, FileDeferred, FileIntents int64
}

// WritesPerIntent is the file store's durable writes (Saves) per successful
// intent.
func (r *ClientReport) WritesPerIntent() float64 { return perIntent(r.FileSaves, r.FileIntents) }

// DeferredPerIntent is the file store's SaveDeferreds per successful
// intent.
func (r *ClientReport) DeferredPerIntent() float64 { return perIntent(r.FileDeferred, r.FileIntents) }

func perIntent(n, intents int64) float64 {
	if intents == 0 {
		return 0
	}
	return float64(n) / float64(intents)
}

// clientVariants returns the ways of making one payment against url, all
// through hc: plain net/http, go-retryablehttp, idem with the memory store,
// idem with the file store in dir, and the same with the outcome's save
// durable before Do returns. The plain variants send a
// fresh Idempotency-Key themselves, so the server does the same work for
// all four.
func clientVariants(hc *http.Client, url string, file *countingStore) ([]variant, error) {
	plain := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(paymentBody))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuid.NewString())
		return finish(hc.Do(req))
	}

	rc := retryablehttp.NewClient()
	rc.HTTPClient = hc
	rc.Logger = nil
	retrying := func(ctx context.Context) error {
		req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, url, paymentBody)
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", uuid.NewString())
		return finish(rc.Do(req))
	}

	mem, err := idem.New(idem.Config{HTTPClient: hc, Store: persist.NewMemory(nil), Server: idem.Server{Mark: idem.MarkEcho}})
	if err != nil {
		return nil, err
	}
	durable, err := idem.New(idem.Config{HTTPClient: hc, Store: file, Server: idem.Server{Mark: idem.MarkEcho}})
	if err != nil {
		return nil, err
	}
	// The same store, without SaveDeferred: both saves durable before Do
	// returns, as before the outcome's sync was deferred.
	outcomeDurable, err := idem.New(idem.Config{HTTPClient: hc, Store: saveOnly{file.Store}, Server: idem.Server{Mark: idem.MarkEcho}})
	if err != nil {
		return nil, err
	}
	req := idem.Request{
		Method: http.MethodPost, URL: url,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: paymentBody,
	}
	var seq atomic.Int64
	withIdem := func(c *idem.Client, ok *atomic.Int64) func(context.Context) error {
		return func(ctx context.Context) error {
			// The Pay screen makes the intent of its action (nothing is
			// written yet); the tap's Do arms it.
			in, err := c.Intent(ctx, fmt.Sprintf("checkout:%d", seq.Add(1)), req)
			if err != nil {
				return err
			}
			resp, err := c.Do(ctx, in)
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("status %d", resp.StatusCode)
			}
			if ok != nil {
				ok.Add(1)
			}
			return nil
		}
	}
	return []variant{
		{name: "net/http", do: plain},
		{name: "retryablehttp", do: retrying},
		{name: "idem(memory)", do: withIdem(mem, nil)},
		{name: "idem(file)", do: withIdem(durable, &file.intents), slow: 4},
		{name: "idem(file), outcome durable", do: withIdem(outcomeDurable, nil), slow: 4},
	}, nil
}

// finish reads the answer into memory and closes it, as a real client (and
// idem) does, and checks that the payment was made.
func finish(resp *http.Response, err error) error {
	if err != nil {
		return err
	}
	_, err = io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// saveOnly hides the hint of persist.WithDeferredSync from the store it
// wraps: every write is durable before it returns.
type saveOnly struct{ persist.Store }

func (s saveOnly) Write(ctx context.Context, rec, old *persist.Record) error {
	return s.Store.Write(noValues{ctx}, rec, old)
}

// noValues is ctx without its values, among them the hint of
// persist.WithDeferredSync.
type noValues struct{ context.Context }

func (noValues) Value(any) any { return nil }

// countingStore counts the writes made through it: the durable ones, each
// one durable write of the underlying store before it returns, and the
// deferred ones (persist.WithDeferredSync), whose directory sync runs in
// the background.
type countingStore struct {
	persist.Store
	saves    atomic.Int64
	deferred atomic.Int64
	intents  atomic.Int64 // successful intents, counted by the variant
}

func (s *countingStore) Write(ctx context.Context, rec, old *persist.Record) error {
	if persist.DeferredSync(ctx) {
		s.deferred.Add(1)
	} else {
		s.saves.Add(1)
	}
	return s.Store.Write(ctx, rec, old)
}
