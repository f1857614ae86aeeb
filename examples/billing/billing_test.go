package billing_test

import (
	"context"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/examples/billing"
	"github.com/idemkit/idem/fakeserver"
)

// newClient returns the code under test, pointed at a fake server of its
// own. The client and the server share a manual clock: the client's backoff
// passes at once, for the server too, so nothing waits on time.
func newClient(t *testing.T) (*billing.Client, *fakeserver.Server) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	c, err := billing.New(srv.URL, idem.Config{HTTPClient: srv.Client(), Clock: clk, Server: idem.Server{Mark: idem.MarkEcho}})
	require.NoError(t, err)
	return c, srv
}

// TestPay checks the app's payment client against the fake server: each
// subtest is a rule a customer relies on.
func TestPay(t *testing.T) {
	t.Parallel()

	t.Run("whatever goes wrong on the way, the customer is charged once", func(t *testing.T) {
		t.Parallel()
		faults := map[string]fakeserver.Fault{
			"the answer is lost":              {Kind: fakeserver.FaultDropResponse},
			"the connection resets":           {Kind: fakeserver.FaultReset},
			"the server fails and rolls back": {Kind: fakeserver.FaultError},
			"a proxy answers 503":             {Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, RetryAfter: "2"},
			"two answers are lost":            {Kind: fakeserver.FaultDropResponse, Count: 2},
		}
		for name, f := range faults {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				c, srv := newClient(t)
				f.Path = "/payments"
				require.NoError(t, srv.InjectFault(f))

				p, err := c.Pay(context.Background(), "cart-1", "cus_1", 1500, "AZN")
				require.NoError(t, err)
				assert.Equal(t, "succeeded", p.Status)
				assert.Equal(t, int64(1500), p.Amount)

				st := srv.Stats()
				assert.Equal(t, 1, st.ProviderCharges, "charged once")
				assert.Equal(t, 1, st.Payments)
			})
		}
	})

	// A final answer is not retried and not charged. Paying the same cart
	// again returns it from the device without sending.
	t.Run("a declined card is a final answer", func(t *testing.T) {
		t.Parallel()
		c, srv := newClient(t)
		ctx := context.Background()

		_, err := c.Pay(ctx, "cart-1", "cus_declined", 1500, "AZN")
		require.ErrorIs(t, err, billing.ErrDeclined)
		assert.Equal(t, 1, srv.Stats().Requests, "not retried")

		_, err = c.Pay(ctx, "cart-1", "cus_declined", 1500, "AZN")
		require.ErrorIs(t, err, billing.ErrDeclined)
		st := srv.Stats()
		assert.Equal(t, 1, st.Requests, "the second Pay sent nothing")
		assert.Zero(t, st.ProviderCharges)
	})

	// A double tap after a lost answer pays the same cart twice.
	t.Run("paying the same cart twice is one payment", func(t *testing.T) {
		t.Parallel()
		c, srv := newClient(t)
		ctx := context.Background()
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/payments"}))

		first, err := c.Pay(ctx, "cart-1", "cus_1", 1500, "AZN")
		require.NoError(t, err)
		again, err := c.Pay(ctx, "cart-1", "cus_1", 1500, "AZN")
		require.NoError(t, err)
		assert.Equal(t, first.ID, again.ID)
		assert.Equal(t, 1, srv.Stats().ProviderCharges)
	})
}

// TestImports checks what the example's production code links: an app's
// payment client ships without its test server.
func TestImports(t *testing.T) {
	t.Parallel()
	t.Run("the production code does not import the fake server", func(t *testing.T) {
		if testing.Short() {
			t.Skip("runs go list")
		}
		out, err := exec.Command("go", "list", "-deps", ".").Output()
		require.NoError(t, err)
		assert.False(t, slices.Contains(strings.Fields(string(out)), "github.com/idemkit/idem/fakeserver"),
			"go list -deps lists the fake server")
	})
}
