package idem

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/clocktest"
)

var retryAfterNow = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var retryAfterCases = []struct {
	name  string
	value string
	want  time.Duration
	ok    bool
}{
	{"delta seconds", "120", 120 * time.Second, true},
	{"zero", "0", 0, true},
	{"spaces", "  7 ", 7 * time.Second, true},
	{"IMF-fixdate", "Mon, 30 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
	{"RFC 850", "Monday, 30-Nov-26 12:01:00 GMT", time.Minute, true},
	{"asctime", "Mon Nov 30 12:00:05 2026", 5 * time.Second, true},
	{"date in the past", "Mon, 30 Nov 2026 11:00:00 GMT", 0, true},
	{"ten years", "315360000", 315360000 * time.Second, true},
	{"beyond int64 seconds", "99999999999999999999999", time.Duration(math.MaxInt64), true},
	{"just past the duration range", "9223372037", time.Duration(math.MaxInt64), true},
	{"empty", "", 0, false},
	{"negative", "-5", 0, false},
	{"fraction", "1.5", 0, false},
	{"garbage", "soon", 0, false},
	{"digits then text", "12abc", 0, false},
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	for _, tc := range retryAfterCases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseRetryAfter(tc.value, retryAfterNow)
			assert.Equal(t, tc.ok, ok)
			assert.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, tc := range retryAfterCases {
		f.Add(tc.value)
	}
	f.Fuzz(func(t *testing.T, v string) {
		d, ok := ParseRetryAfter(v, retryAfterNow)
		if d < 0 {
			t.Fatalf("negative wait %s for %q", d, v)
		}
		if !ok && d != 0 {
			t.Fatalf("wait %s reported for unparseable %q", d, v)
		}
	})
}

func TestRetryableStatus(t *testing.T) {
	t.Parallel()
	retry := map[int]bool{408: true, 409: true, 429: true, 500: true, 502: true, 503: true, 504: true}
	for code := 100; code < 600; code++ {
		assert.Equal(t, retry[code], retryableStatus(code), "status %d", code)
	}
}

// newTestBudget is a budget on a manual clock at retryAfterNow whose
// context leaves deadlineIn (none when zero).
func newTestBudget(t *testing.T, p RetryPolicy, deadlineIn time.Duration, expiry time.Time) (*budget, *clocktest.Clock) {
	t.Helper()
	clk := clocktest.New(retryAfterNow)
	b := newBudget(context.Background(), p.withDefaults(), clk, expiry)
	if deadlineIn > 0 {
		b.deadline = b.start.Add(deadlineIn)
	}
	return b, clk
}

func TestBudgetPutsTheContextDeadlineOnTheClocksTimeline(t *testing.T) {
	t.Parallel()
	for _, start := range []time.Time{time.Now().AddDate(-20, 0, 0), time.Now().AddDate(30, 0, 0)} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		b := newBudget(ctx, RetryPolicy{}.withDefaults(), clocktest.New(start), time.Time{})
		cancel()
		left := b.deadline.Sub(b.start)
		assert.LessOrEqual(t, left, time.Hour, "clock at %v", start)
		assert.Greater(t, left, 59*time.Minute, "clock at %v: the hour the context leaves, from the clock's now", start)
	}
}

func respWithRetryAfter(v string) *http.Response {
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Header: http.Header{"Retry-After": {v}}}
}

func TestBudgetBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialInterval: time.Second, MaxInterval: 8 * time.Second, Multiplier: 2, NoJitter: true, MaxAttempts: 100, MaxElapsed: time.Hour}
	b, _ := newTestBudget(t, p, 0, time.Time{})
	var waits []time.Duration
	for i := 0; i < 6; i++ {
		b.attempts++
		w, st := b.next(nil)
		require.Nil(t, st)
		waits = append(waits, w)
	}
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 8 * time.Second, 8 * time.Second}, waits)
}

func TestBudgetJitterStaysWithinBounds(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialInterval: time.Second, MaxInterval: time.Second, Jitter: 0.5, MaxAttempts: 1000, MaxElapsed: 1000 * time.Hour}
	b, _ := newTestBudget(t, p, 0, time.Time{})
	distinct := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		b.attempts = 1
		w, st := b.next(nil)
		require.Nil(t, st)
		assert.GreaterOrEqual(t, w, 500*time.Millisecond)
		assert.LessOrEqual(t, w, time.Second, "capped at MaxInterval")
		distinct[w] = true
	}
	assert.Greater(t, len(distinct), 10, "jitter spreads the waits")
}

func TestBudgetHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{InitialInterval: 100 * time.Millisecond, NoJitter: true}
	b, _ := newTestBudget(t, p, 0, time.Time{})
	b.attempts = 1
	w, st := b.next(respWithRetryAfter("3"))
	require.Nil(t, st)
	assert.Equal(t, 3*time.Second, w, "never sooner than the server asked")

	w, st = b.next(respWithRetryAfter("Mon, 30 Nov 2026 12:00:10 GMT"))
	require.Nil(t, st)
	assert.Equal(t, 10*time.Second, w)
}

func TestBudgetStops(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		policy   RetryPolicy
		deadline time.Duration
		expiry   time.Time
		attempts int
		resp     *http.Response
		reason   StopReason
		wait     time.Duration
	}{
		{"attempts", RetryPolicy{MaxAttempts: 3}, 0, time.Time{}, 3, nil, StopAttempts, 0},
		{"retry-after above cap", RetryPolicy{MaxRetryAfter: time.Minute}, 0, time.Time{}, 1, respWithRetryAfter("315360000"), StopRetryAfterCap, 315360000 * time.Second},
		{"retry-after past the deadline", RetryPolicy{}, 5 * time.Second, time.Time{}, 1, respWithRetryAfter("10"), StopDeadline, 10 * time.Second},
		{"retry-after past max elapsed", RetryPolicy{MaxElapsed: 20 * time.Second}, 0, time.Time{}, 1, respWithRetryAfter("30"), StopElapsed, 30 * time.Second},
		{"wait reaches expiry", RetryPolicy{}, 0, retryAfterNow.Add(2 * time.Second), 1, respWithRetryAfter("2"), StopExpired, 2 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := newTestBudget(t, tc.policy, tc.deadline, tc.expiry)
			b.attempts = tc.attempts
			_, st := b.next(tc.resp)
			require.NotNil(t, st)
			assert.Equal(t, tc.reason, st.reason)
			assert.Equal(t, tc.wait, st.wait)
		})
	}
}

func TestBudgetSpreadsClientsPastRetryAfter(t *testing.T) {
	t.Parallel()
	distinct := map[time.Duration]bool{}
	for range 100 {
		b, _ := newTestBudget(t, RetryPolicy{InitialInterval: 100 * time.Millisecond}, 0, time.Time{})
		b.attempts = 1
		w, st := b.next(respWithRetryAfter("10"))
		require.Nil(t, st)
		assert.GreaterOrEqual(t, w, 10*time.Second, "never sooner than asked")
		assert.LessOrEqual(t, w, 11*time.Second, "at most 10% later with the default jitter")
		distinct[w] = true
	}
	assert.Greater(t, len(distinct), 50, "clients told the same Retry-After come back at different times")
}

func TestBudgetDropsTheSpreadRatherThanGiveUp(t *testing.T) {
	t.Parallel()
	// The deadline leaves room for the Retry-After itself and no more.
	for range 50 {
		b, _ := newTestBudget(t, RetryPolicy{InitialInterval: 100 * time.Millisecond}, 10*time.Second, time.Time{})
		b.attempts = 1
		w, st := b.next(respWithRetryAfter("10"))
		require.Nil(t, st)
		assert.Equal(t, 10*time.Second, w)
	}
}
