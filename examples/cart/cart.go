package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

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

func (c cart) request(baseURL string) (idem.Request, error) {
	return idem.JSONRequest(http.MethodPost, baseURL+"/payments", map[string]any{
		"amount": c.amount, "currency": "AZN", "customer": "cus_1", "description": fmt.Sprint(c.items)})
}

func run(ctx context.Context, out io.Writer) error {
	srv := fakeserver.NewServer(nil)
	defer srv.Close()
	// The app gives up after one attempt and shows "payment status
	// unknown"; a device would also pass idem.WithStore(persist.OpenDir(...)).
	client, err := idem.New(idem.WithHTTPClient(srv.Client()), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	if err != nil {
		return err
	}

	// The Pay button is shown: an intent for the cart, saved, not sent.
	v1 := cart{items: []string{"book"}, amount: 1500}
	a, err := intentFor(ctx, client, srv.URL, v1)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cart %v, %d: intent A, key %s, state %s\n", v1.items, v1.amount, a.Key(), a.State())

	// The user adds a pen before paying. A was never sent, so it is
	// replaced silently: no request can be in flight under its key.
	v2 := cart{items: []string{"book", "pen"}, amount: 1800}
	b, err := intentFor(ctx, client, srv.URL, v2)
	if err != nil {
		return err
	}
	_, err = client.Load(ctx, a.Key())
	fmt.Fprintf(out, "cart %v, %d: intent B, key %s; A was never sent, so it was replaced (A deleted: %t)\n",
		v2.items, v2.amount, b.Key(), errors.Is(err, persist.ErrNotFound))

	// The user pays; the server charges, and the answer is lost.
	if err := srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: b.Key()}); err != nil {
		return err
	}
	_, err = client.Do(ctx, b)
	fmt.Fprintf(out, "pay B: the answer is lost; outcome unknown: %t, B is %s\n", errors.Is(err, idem.ErrOutcomeUnknown), b.State())

	// The user removes the pen and taps Pay again. A new payment now could
	// charge twice, so Intent refuses and hands the previous one back.
	v3 := cart{items: []string{"book"}, amount: 1500}
	_, err = intentFor(ctx, client, srv.URL, v3)
	var unresolved *idem.UnresolvedError
	if !errors.As(err, &unresolved) {
		return fmt.Errorf("want an *idem.UnresolvedError, got %v", err)
	}
	fmt.Fprintf(out, "cart %v, %d: refused, intent B (key %s) has an unknown outcome\n", v3.items, v3.amount, unresolved.Previous.Key())
	fmt.Fprintln(out, "  choices: resume B (Client.Do, same key: pays at most once), reconcile B (Client.Reconcile: ask without sending), forget B (Client.Forget: unsafe)")

	resp, err := settle(ctx, client, unresolved.Previous, srv.URL)
	if err != nil {
		return err
	}
	var paid struct {
		ID     string `json:"id"`
		Amount int    `json:"amount"`
	}
	_ = json.Unmarshal(resp.Body, &paid)
	fmt.Fprintf(out, "settled B: %s, payment %s of %d; the app tells the user the earlier cart was paid\n",
		unresolved.Previous.State(), paid.ID, paid.Amount)

	// B's outcome is known now, so the changed cart gets a new intent.
	c, err := intentFor(ctx, client, srv.URL, v3)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "cart %v, %d: intent C, key %s (new key: %t)\n", v3.items, v3.amount, c.Key(), c.Key() != b.Key())
	// The user, told that B was paid, still wants this cart.
	if resp, err = client.Do(ctx, c); err != nil {
		return err
	}
	fmt.Fprintf(out, "pay C: %d\n", resp.StatusCode)
	st := srv.Stats()
	fmt.Fprintf(out, "server: %d payments, %d provider charges (B and C, each once)\n", st.Payments, st.ProviderCharges)
	return nil
}

// intentFor is what the app calls whenever the Pay button is shown.
func intentFor(ctx context.Context, client *idem.Client, baseURL string, c cart) (*idem.Intent, error) {
	req, err := c.request(baseURL)
	if err != nil {
		return nil, err
	}
	return client.Intent(ctx, checkout, req)
}

// settle finds out what became of an intent with an unknown outcome. It asks
// the server first, which sends nothing; when the server cannot tell yet (no
// payment under the key, but the last attempt was too recent to rule one
// out) it resumes the intent, which is safe: the same key and bytes are
// charged at most once.
func settle(ctx context.Context, client *idem.Client, in *idem.Intent, baseURL string) (*idem.Response, error) {
	lookup := baseURL + "/payments?idempotency_key=" + url.QueryEscape(in.Key())
	resp, err := client.Reconcile(ctx, in, lookup)
	if errors.Is(err, idem.ErrOutcomeUnknown) {
		return client.Do(ctx, in)
	}
	return resp, err
}
