// Package billing stands for your own code: an app's payment client built
// on idem. Its test, billing_test.go, shows how to test such code against
// the fake server: start one per test, inject the fault, assert on the
// server's counts.
package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idemkit/idem"
)

// problemCardDeclined is the problem type the payment API answers a
// declined card with. It is the API's word, so the client names it
// itself: production code does not import the fake server its tests use.
const problemCardDeclined = "https://idem.dev/problems/card-declined"

// ErrDeclined is returned by Pay when the card was declined.
var ErrDeclined = errors.New("billing: card declined")

// Client pays for carts. It is safe for concurrent use.
type Client struct {
	idem    *idem.Client
	baseURL string
}

// New returns a Client for the payment API at baseURL. cfg configures the
// idem client: a device sets Store to persist.OpenDir(...)'s store.
func New(baseURL string, cfg idem.Config) (*Client, error) {
	c, err := idem.New(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{idem: c, baseURL: baseURL}, nil
}

// Payment is a payment the server made.
type Payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Status   string `json:"status"`
}

// Pay charges customer amount (in minor units) for the cart cartID. Paying
// the same cart again with the same amount is the same intent: it resumes
// it, or returns its stored outcome.
func (c *Client) Pay(ctx context.Context, cartID, customer string, amount int64, currency string) (*Payment, error) {
	req, err := idem.JSONRequest(http.MethodPost, c.baseURL+"/payments",
		map[string]any{"amount": amount, "currency": currency, "customer": customer})
	if err != nil {
		return nil, err
	}
	resp, err := c.idem.Send(ctx, "cart:"+cartID, req)
	var apiErr *idem.APIError
	if errors.As(err, &apiErr) && apiErr.Problem.Type == problemCardDeclined {
		return nil, fmt.Errorf("%w: %s", ErrDeclined, apiErr.Problem.Detail)
	}
	if err != nil {
		return nil, err
	}
	var p Payment
	if err := json.Unmarshal(resp.Body, &p); err != nil {
		return nil, fmt.Errorf("billing: reading the payment: %w", err)
	}
	return &p, nil
}
