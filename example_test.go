package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// Paying from a button is one call. Here the network loses the first
// answer: the retry carries the same key, the server replays its answer, and
// the card is charged once.
func Example() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	dir, _ := os.MkdirTemp("", "idem-example")
	defer os.RemoveAll(dir)
	store, err := persist.OpenDir(dir, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	client, _ := idem.New(idem.Config{
		Store:      store,
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	resp, err := client.Send(context.Background(), "checkout:cart-42", req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("status:", resp.StatusCode, "attempts:", resp.Attempts, "replayed:", resp.Replayed)
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// status: 201 attempts: 2 replayed: true
	// charges: 1
}

// At app start, one call settles what an earlier run left unresolved: here
// a payment whose answer was lost just before the app died.
func ExampleClient_SettleAll() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	store := persist.NewMemory(nil) // a device would use persist.OpenDir
	ctx := context.Background()

	// The first run gives up after one attempt, whose answer was lost, and
	// dies.
	first, _ := idem.New(idem.Config{Store: store, HTTPClient: srv.Client(), Server: idem.Server{Mark: idem.MarkEcho}})
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 700, "currency": "AZN", "customer": "cus_1"})
	_, err := first.Send(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), "checkout:cart-7", req)
	fmt.Println("first run, outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown))

	// The next run settles it, with its own key.
	next, _ := idem.New(idem.Config{
		Store:      store,
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	settled, _ := next.SettleAll(ctx)
	for _, s := range settled {
		fmt.Println(s.Intent.Name(), s.Intent.State(), s.Response.StatusCode, "replayed:", s.Response.Replayed)
	}
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// first run, outcome unknown: true
	// checkout:cart-7 succeeded 201 replayed: true
	// charges: 1
}

// An intent too old to send again (the server may have forgotten its key)
// is settled through the server's lookup, which sends nothing. One manual
// clock drives the client and the fake server, so a day passes at once.
func ExampleClient_Settle() {
	clk := clock.NewManual(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	defer srv.Close()
	client, _ := idem.New(idem.Config{
		HTTPClient: srv.Client(),
		Clock:      clk,
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	ctx := context.Background()

	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 900, "currency": "AZN", "customer": "cus_1"})
	in, _ := client.Intent(ctx, "checkout:cart-5", req)
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := client.Do(idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1}), in)
	fmt.Println("outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown), "state:", in.State())

	clk.Advance(23 * time.Hour) // past the retention less the safety margin
	resp, err := client.Settle(ctx, in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("lookup:", resp.StatusCode, "state:", in.State(), "requests:", srv.Stats().Requests, "charges:", srv.Stats().ProviderCharges)
	// Output:
	// outcome unknown: true state: pending
	// lookup: 200 state: succeeded requests: 2 charges: 1
}

// A changed cart while the previous payment's outcome is unknown is refused,
// so the app settles the old one first instead of paying twice.
func ExampleClient_Send() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	ctx := context.Background()
	client, _ := idem.New(idem.Config{
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	cart := func(amount int) idem.Request {
		req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
			map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
		return req
	}
	// A tap in the foreground gets a short budget; the answer is lost.
	tap := idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1})
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})
	_, err := client.Send(tap, "checkout:cart-9", cart(1000))
	fmt.Println("outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown))

	_, err = client.Send(tap, "checkout:cart-9", cart(1200))
	var unresolved *idem.UnresolvedError
	if errors.As(err, &unresolved) {
		resp, _ := client.Settle(ctx, unresolved.Previous)
		fmt.Println("changed cart refused; the previous payment:", resp.StatusCode, "replayed:", resp.Replayed)
	}
	// The action is paid: a changed cart does not pay it again.
	_, err = client.Send(tap, "checkout:cart-9", cart(1200))
	var paid *idem.ResolvedError
	if errors.As(err, &paid) {
		fmt.Println("already paid:", paid.Previous.Response().StatusCode, "charges:", srv.Stats().ProviderCharges)
	}
	// A deliberate second payment is a new intent.
	again, _ := client.NewIntent(ctx, "checkout:cart-9", cart(1200))
	resp, _ := client.Settle(tap, again)
	fmt.Println("paid again:", resp.StatusCode, "charges:", srv.Stats().ProviderCharges)
	// Output:
	// outcome unknown: true
	// changed cart refused; the previous payment: 201 replayed: true
	// already paid: 201 charges: 1
	// paid again: 201 charges: 2
}

// The exact request of an intent, for an http.Client that idem does not
// manage: the same bytes and key as every attempt of Do.
func ExampleClient_HTTPRequest() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	client, _ := idem.New(idem.Config{Server: idem.Server{Mark: idem.MarkEcho}})
	ctx := context.Background()
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 300, "currency": "AZN", "customer": "cus_1"})
	in, _ := client.Intent(ctx, "checkout:cart-11", req)

	hreq, _ := client.HTTPRequest(ctx, in)
	fmt.Println(hreq.Method, hreq.URL.Path, "key:", hreq.Header.Get("Idempotency-Key") == in.Key())
	for range 2 {
		hreq, _ := client.HTTPRequest(ctx, in)
		resp, err := srv.Client().Do(hreq)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// POST /payments key: true
	// 201 replayed: false
	// 201 replayed: true
	// charges: 1
}

// Any *http.Client gets keys on POST and safe retries through the
// RoundTripper; GET passes through with no key. The request's context
// names its action, which is its identity: the same request, sent again
// or cloned, is one intent with one key.
func ExampleClient_RoundTripper() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	client, _ := idem.New(idem.Config{Server: idem.Server{Mark: idem.MarkEcho}})
	hc := &http.Client{Transport: client.RoundTripper(srv.Client().Transport)}

	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "0"})
	ctx := idem.ContextWithAction(context.Background(), "checkout:cart-7")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments",
		strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("status:", resp.StatusCode, "charges:", srv.Stats().ProviderCharges)
	// Output:
	// status: 201 charges: 1
}

// Do ends in one of three ways: a success, a final answer that is not one
// (a declined card: stored, never retried), or an unknown outcome (the
// intent is kept; Do it again later).
func ExampleClient_Do() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	client, _ := idem.New(idem.Config{HTTPClient: srv.Client(), Server: idem.Server{Mark: idem.MarkEcho}})
	ctx := context.Background()

	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_declined"})
	in, _ := client.Intent(ctx, "checkout:cart-3", req)

	resp, err := client.Do(ctx, in)
	var apiErr *idem.APIError
	switch {
	case err == nil:
		fmt.Println("paid:", resp.StatusCode)
	case errors.As(err, &apiErr):
		// A final answer from the server: show it to the user.
		fmt.Println("final answer:", apiErr.StatusCode, apiErr.Problem.Type)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// No final answer: the intent stays unresolved with its key.
		fmt.Println("outcome unknown, try again later:", err)
	default:
		fmt.Println(err)
	}
	fmt.Println("state:", in.State(), "charges:", srv.Stats().ProviderCharges)
	// Output:
	// final answer: 402 https://idem.dev/problems/card-declined
	// state: failed charges: 0
}
