package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// checkout is the intent name of this cart's payment: one action, whatever
// the cart holds when the user pays.
const checkout = "checkout:cart-42"

// cart is what the user is about to pay for.
type cart struct {
	items  []string
	amount int
}

func (c cart) request(baseURL string) idem.Request {
	req, _ := idem.JSONRequest(http.MethodPost, baseURL+"/payments", map[string]any{
		"amount": c.amount, "currency": "AZN", "customer": "cus_1", "description": fmt.Sprint(c.items)})
	return req
}

func run(ctx context.Context, out io.Writer) error {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	// A device would also set Store: persist.OpenDir(...).
	client, err := idem.New(idem.Config{
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	if err != nil {
		return err
	}
	// A tap gives up after one attempt and shows "payment status unknown".
	tap := idem.ContextWithRetryPolicy(ctx, idem.RetryPolicy{MaxAttempts: 1})

	// The Pay button is shown: an intent for the cart, in memory until the
	// tap, not sent.
	v1 := cart{items: []string{"book"}, amount: 1500}
	a, err := client.Intent(ctx, checkout, v1.request(srv.URL))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cart %v, %d: intent A, key %s, state %s\n", v1.items, v1.amount, a.Key(), a.State())

	// The user adds a pen and pays; the server charges, and the answer is
	// lost. A was never sent, so it is replaced silently: no request can be
	// in flight under its key.
	v2 := cart{items: []string{"book", "pen"}, amount: 1800}
	if err := srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}); err != nil {
		return err
	}
	_, err = client.Send(tap, checkout, v2.request(srv.URL))
	_, loadErr := client.Load(ctx, a.Key())
	fmt.Fprintf(out, "cart %v, %d: pay B; A was never sent, so it was replaced (A deleted: %t); the answer is lost, outcome unknown: %t\n",
		v2.items, v2.amount, errors.Is(loadErr, persist.ErrNotFound), errors.Is(err, idem.ErrOutcomeUnknown))

	// The user removes the pen and taps Pay again. A new payment now could
	// charge twice, so Send refuses and hands the previous intent back.
	v3 := cart{items: []string{"book"}, amount: 1500}
	_, err = client.Send(tap, checkout, v3.request(srv.URL))
	var unresolved *idem.UnresolvedError
	if !errors.As(err, &unresolved) {
		return fmt.Errorf("want an *idem.UnresolvedError, got %v", err)
	}
	b := unresolved.Previous
	fmt.Fprintf(out, "cart %v, %d: refused, intent B (key %s) has an unknown outcome\n", v3.items, v3.amount, b.Key())

	// Settling B is safe: the same key and bytes are charged at most once.
	resp, err := client.Settle(ctx, b)
	if err != nil {
		return err
	}
	var paid struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	_ = json.Unmarshal(resp.Body, &paid)
	fmt.Fprintf(out, "settled B: %s, payment %s of %d; the app tells the user the earlier cart was paid\n", b.State(), paid.ID, paid.Amount)

	// B's outcome is known now, and the action is paid: Send for it would
	// refuse another cart (*idem.ResolvedError). The user, told that B was
	// paid, still wants this cart: a deliberate second payment, a new
	// intent with a new key.
	c, err := client.NewIntent(ctx, checkout, v3.request(srv.URL))
	if err != nil {
		return err
	}
	if resp, err = client.Settle(ctx, c); err != nil {
		return err
	}
	fmt.Fprintf(out, "pay C: %d\n", resp.StatusCode)
	st := srv.Stats()
	fmt.Fprintf(out, "server: %d payments, %d provider charges (B and C, each once)\n", st.Payments, st.ProviderCharges)
	return nil
}
