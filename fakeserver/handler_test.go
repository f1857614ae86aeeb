package fakeserver_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
)

// TestAbortEndsACommitWaitingOnALock: on PostgreSQL, a payment's commit
// waits on a lock another session holds; Abort ends it at once, and once
// the lock is gone nothing of it commits: the record stays IN_PROGRESS for
// a resend to take over.
func TestAbortEndsACommitWaitingOnALock(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	s := fakeserver.Start(t, &fakeserver.Options{Postgres: pool})
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE fake_payments IN EXCLUSIVE MODE")
	require.NoError(t, err)

	answered := make(chan int, 1)
	go func() {
		a, err := trySend(s.Client(), s.URL, req{Key: "locked", Body: payBody})
		if err != nil {
			answered <- 0
			return
		}
		answered <- a.Status
	}()
	conn, err := pgx.Connect(ctx, pool.Config().ConnConfig.ConnString())
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Eventually(t, func() bool {
		var waiting int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO fake_payments%'`).Scan(&waiting)
		return err == nil && waiting == 1
	}, time.Minute, 10*time.Millisecond, "the commit never waited on the lock")

	s.Abort()
	select {
	case code := <-answered:
		assert.GreaterOrEqual(t, code, http.StatusInternalServerError, "the aborted request is a server error")
	case <-time.After(20 * time.Second):
		t.Fatal("the request still waits on the lock 20 s after Abort")
	}
	require.NoError(t, tx.Rollback(ctx))
	var payments, inProgress int
	require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM fake_payments),
		(SELECT count(*) FROM idempotency_records WHERE status = 'IN_PROGRESS')`).Scan(&payments, &inProgress))
	assert.Zero(t, payments, "the aborted payment committed")
	assert.Equal(t, 1, inProgress)
}

// TestNewHandlerRefusesALeaseNoLongerThanTheProcessingDelay: a payment
// slower than its lease would be taken over by its resend while it runs
// and executed twice for one key, so the constructors refuse the options
// with a panic that says why; a lease longer than the delay is taken.
func TestNewHandlerRefusesALeaseNoLongerThanTheProcessingDelay(t *testing.T) {
	t.Parallel()
	for _, o := range []fakeserver.Options{
		{Lease: time.Second, ProcessingDelay: time.Second},
		{Lease: time.Second, ProcessingDelay: 2 * time.Second},
		{ProcessingDelay: time.Minute}, // the default lease is 30s
	} {
		assert.PanicsWithValue(t, "fakeserver: Lease ("+leaseOrDefault(o.Lease)+") must be longer than ProcessingDelay ("+o.ProcessingDelay.String()+
			"): a payment still running would be taken over by its resend and run twice", func() { fakeserver.NewHandler(&o) })
	}
	assert.NotPanics(t, func() {
		fakeserver.NewHandler(&fakeserver.Options{Lease: 2 * time.Second, ProcessingDelay: time.Second})
	})
}

func leaseOrDefault(d time.Duration) string {
	if d <= 0 {
		return (30 * time.Second).String()
	}
	return d.String()
}
