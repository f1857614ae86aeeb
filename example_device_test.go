package idem_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// payOnDevice is what an app on a device does when the user taps Pay: the
// README's example.
func payOnDevice(ctx context.Context, stateDir, apiURL string) error {
	// Intents live in the app's private files, never in a cache directory
	// the system may clear while a payment is unresolved.
	store, err := persist.OpenDir(filepath.Join(stateDir, "idem"), nil)
	if err != nil {
		return err // persist.ErrLocked: another process holds the directory
	}
	defer store.Close()
	client, err := idem.New(idem.Config{
		Store:  store,
		Server: idem.Server{Mark: idem.MarkEcho, LookupQuery: "idempotency_key"},
	})
	if err != nil {
		return err
	}

	req, err := idem.JSONRequest(http.MethodPost, apiURL+"/payments",
		map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	if err != nil {
		return err
	}
	resp, err := client.Send(ctx, "checkout:cart-42", req)
	var apiErr *idem.APIError
	switch {
	case err == nil:
		fmt.Println("paid:", resp.StatusCode, "attempts:", resp.Attempts, "replayed:", resp.Replayed)
	case errors.As(err, &apiErr):
		// A final answer, such as a declined card: show it to the user.
		fmt.Println("not paid:", apiErr.StatusCode, apiErr.Problem.Type)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// No final answer: the intent stays unresolved with its key. Settle
		// it later (Settle, or SettleAll at the next start); never pay anew.
		fmt.Println("outcome unknown, settle later:", err)
	default:
		return err // not sent, an earlier payment unresolved or paid, or the store failed
	}
	return nil
}

// A device pays once although the network loses the first answer.
func Example_device() {
	srv := fakeserver.NewServer(nil) // the app's API server
	defer srv.Close()
	dir, err := os.MkdirTemp("", "idem-device") // the app's private files
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	_ = srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"})

	if err := payOnDevice(context.Background(), dir, srv.URL); err != nil {
		fmt.Println(err)
	}
	fmt.Println("charges:", srv.Stats().ProviderCharges)
	// Output:
	// paid: 201 attempts: 2 replayed: true
	// charges: 1
}
