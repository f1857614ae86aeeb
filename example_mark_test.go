package idem_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	"github.com/idemkit/idem"
)

// A plain server keeps a record per key but echoes nothing: MarkJSONID
// recognises its answer by the payment's id in the JSON body. A captive
// portal's page in front of it has no such id: the outcome stays unknown,
// and Settle pays once the device is past the portal.
func ExampleMarkJSONID() {
	var (
		portal atomic.Bool
		mu     sync.Mutex
		paid   = map[string]string{} // key: the payment's JSON
	)
	portal.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if portal.Load() {
			w.Header().Set("Content-Type", "text/html")
			_, _ = io.WriteString(w, "<html>Accept the terms to use the Wi-Fi</html>")
			return
		}
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if paid[key] == "" {
			paid[key] = fmt.Sprintf(`{"id":"pay_%d","amount":1500}`, len(paid)+1)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, paid[key])
	}))
	defer srv.Close()

	client, err := idem.New(idem.Config{
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkJSONID("id")},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
	in, _ := client.Intent(ctx, "checkout:cart-42", req)

	_, err = client.Do(ctx, in)
	fmt.Println("behind the portal, outcome unknown:", errors.Is(err, idem.ErrOutcomeUnknown))
	portal.Store(false)
	resp, err := client.Settle(ctx, in)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("paid:", resp.StatusCode, string(resp.Body))
	// Output:
	// behind the portal, outcome unknown: true
	// paid: 201 {"id":"pay_1","amount":1500}
}

// Credentials come from the Authorizer, asked before each attempt and
// never stored with the intent: a token refreshed between two attempts,
// or between a crash and the resume, is the one sent.
func ExampleConfig_authorizer() {
	var token atomic.Value // the app's session: refreshed elsewhere
	token.Store("t-1")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("Authorization") != "Bearer "+token.Load().(string) {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Idempotency-Key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client, err := idem.New(idem.Config{
		HTTPClient: srv.Client(),
		Server:     idem.Server{Mark: idem.MarkEcho},
		Authorizer: func(ctx context.Context, key string) (string, error) {
			return "Bearer " + token.Load().(string), nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	token.Store("t-2") // refreshed after the client was made
	req, _ := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500})
	resp, err := client.Send(context.Background(), "checkout:cart-43", req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("paid:", resp.StatusCode)
	// Output:
	// paid: 201
}
