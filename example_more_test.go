package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
)

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
