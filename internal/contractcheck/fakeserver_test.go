package contractcheck_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/internal/clocktest"
	"github.com/idemkit/idem/internal/contractcheck"
)

// TestRunFakeServer: the fake server keeps the whole contract, so every
// row passes, the fault rows included, and the check sends no more
// requests than it announced.
func TestRunFakeServer(t *testing.T) {
	clk := clocktest.New(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	srv := fakeserver.Start(t, &fakeserver.Options{Clock: clk})
	cfg := contractcheck.Config{
		URL:    srv.URL + "/payments",
		Auth:   "Bearer caller-1",
		Auth2:  "Bearer caller-2",
		Lookup: srv.URL + "/payments?idempotency_key={key}",
		Sleep:  clk.Sleep,
	}
	rep, err := contractcheck.Run(context.Background(), cfg, nil)
	require.NoError(t, err)
	for _, r := range rep.Rows {
		t.Logf("%s %s: %s", r.Status, r.ID, r.Detail)
		assert.Equal(t, contractcheck.Pass, r.Status, "%s: %s %v", r.ID, r.Detail, r.Evidence)
	}
	assert.Len(t, rep.Rows, len(contractcheck.Rows()))
	assert.True(t, rep.OK())
	assert.LessOrEqual(t, rep.Sent, rep.Planned)
	t.Logf("%d of %d planned requests sent; %+v", rep.Sent, rep.Planned, srv.Stats())
}
