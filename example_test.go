package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// A payment whose first response is lost: the retry carries the same key,
// the server replays its answer, and the card is charged once.
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

	client, err := idem.New(idem.WithStore(store), idem.WithHTTPClient(srv.Client()))
	if err != nil {
		fmt.Println(err)
		return
	}

	ctx := context.Background()
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	// The intent is saved before anything is sent.
	in, err := client.Intent(ctx, "checkout:cart-42", req)
	if err != nil {
		fmt.Println(err)
		return
	}

	// The network loses the first answer.
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})

	resp, err := client.Do(ctx, in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("status:", resp.StatusCode, "attempts:", resp.Attempts, "replayed:", resp.Replayed)
	fmt.Println("state:", in.State())
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// status: 201 attempts: 2 replayed: true
	// state: succeeded
	// charges: 1
}

// After a restart, the unresolved intents are resumed, each with its own key.
func ExampleClient_Unresolved() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	store := persist.NewMemory(nil) // a device would use persist.OpenDir
	ctx := context.Background()

	// The first run gives up after one attempt whose answer was lost.
	first, _ := idem.New(idem.WithStore(store), idem.WithHTTPClient(srv.Client()),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 700, "currency": "AZN", "customer": "cus_1"})
	in, _ := first.Intent(ctx, "checkout:cart-7", req)
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := first.Do(ctx, in)
	fmt.Println("first run, outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown))

	// The next run resumes it.
	next, _ := idem.New(idem.WithStore(store), idem.WithHTTPClient(srv.Client()))
	pending, _ := next.Unresolved(ctx)
	for _, in := range pending {
		resp, err := next.Do(ctx, in)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println("resumed:", resp.StatusCode, "replayed:", resp.Replayed)
	}
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// first run, outcome unknown: true
	// resumed: 201 replayed: true
	// charges: 1
}

// A changed cart while the previous payment's outcome is unknown is refused,
// so the app can settle the old one first instead of paying twice.
func ExampleClient_Intent() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	ctx := context.Background()
	client, _ := idem.New(idem.WithHTTPClient(srv.Client()),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))

	cart := func(amount int) idem.Request {
		req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
			map[string]any{"amount": amount, "currency": "AZN", "customer": "cus_1"})
		return req
	}
	in, _ := client.Intent(ctx, "checkout:cart-9", cart(1000))
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, _ = client.Do(ctx, in) // the answer is lost

	_, err := client.Intent(ctx, "checkout:cart-9", cart(1200))
	var unresolved *idem.UnresolvedError
	if errors.As(err, &unresolved) {
		fmt.Println("previous intent unresolved:", unresolved.Previous.Key() == in.Key())
		// Resuming it is safe: same key, same bytes.
		resp, _ := client.Do(ctx, unresolved.Previous)
		fmt.Println("previous intent:", resp.StatusCode, "replayed:", resp.Replayed)
	}
	next, _ := client.Intent(ctx, "checkout:cart-9", cart(1200))
	resp, _ := client.Do(ctx, next)
	fmt.Println("new intent:", resp.StatusCode, "new key:", next.Key() != in.Key())
	// Output:
	// previous intent unresolved: true
	// previous intent: 201 replayed: true
	// new intent: 201 new key: true
}

// Any *http.Client gets keys on POST and safe retries through the
// RoundTripper; GET passes through with no key.
func ExampleClient_RoundTripper() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	client, _ := idem.New()
	hc := &http.Client{Transport: client.RoundTripper(srv.Client().Transport)}

	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/payments", Status: http.StatusServiceUnavailable, RetryAfter: "0"})
	resp, err := hc.Post(srv.URL+"/payments", "application/json",
		strings.NewReader(`{"amount":300,"currency":"AZN","customer":"cus_1"}`))
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
	client, _ := idem.New(idem.WithHTTPClient(srv.Client()))
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

// Reconcile asks the server what became of an intent without sending it
// again: here the server did the work, and only its answer was lost.
func ExampleClient_Reconcile() {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	client, _ := idem.New(idem.WithHTTPClient(srv.Client()),
		idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	ctx := context.Background()

	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments",
		map[string]any{"amount": 900, "currency": "AZN", "customer": "cus_1"})
	in, _ := client.Intent(ctx, "checkout:cart-5", req)
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: in.Key()})
	_, err := client.Do(ctx, in)
	fmt.Println("outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown), "state:", in.State())

	lookup := srv.URL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	resp, err := client.Reconcile(ctx, in, lookup)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("lookup:", resp.StatusCode, "state:", in.State(), "charges:", srv.Stats().ProviderCharges)
	// Output:
	// outcome unknown: true state: pending
	// lookup: 200 state: succeeded charges: 1
}
