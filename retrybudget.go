package idem

import (
	"cmp"
	"errors"
	"sync"
	"time"
)

// RetryBudget is the client-wide retry budget: a bucket of tokens that
// every call of one Client draws on to retry, as the AWS SDKs' retry quota
// does. A first attempt never needs a token. A retry takes RetryCost
// tokens, or TimeoutCost after an attempt that timed out; a call whose next
// retry finds too few tokens ends at once with a *RetryError whose Reason says
// the budget is spent, its outcome unknown (the intent stays pending, or not
// sent when the transport proves nothing left the device). A final answer
// that is the server's word (marked with the key's echo, or recognised by
// Server.Mark) puts tokens back, a stranger's on the path none: the
// cost of the retry that got it, or one token when the first attempt got
// it. Tokens also come back with time, one per
// Refill, so that a device left without successes (offline for an hour)
// still retries its next call. The bucket never holds more than Tokens.
// The zero RetryBudget holds the defaults; each field's zero value is its
// default.
//
// The defaults are the AWS standard retryer's bucket and costs (500
// tokens, 5 a retry, 10 after a timeout, refunds on answers), with a
// token back each second, which AWS does not give. Both sizes fit what
// the budget protects, and whom.
//
// AWS's quota lives in a server process that makes many calls a second.
// When the service it calls fails, every call fails at once; the quota
// turns the retries into fast failures, which protects the service, and
// the caller's own callers retry or shed load. Failing fast costs little
// there.
//
// A device is one person. It makes a few calls, and the cost of a failure
// is a payment whose outcome the user must learn later. A lost answer on a
// lossy radio says nothing of the server's health: a retry is the cure, and
// its answer refunds it. So the bucket must outlast the largest burst an
// app makes on a lossy network before those refunds come back. A billing
// run of 100 payments at once, 30% of the answers lost, loses about 30
// answers at once: 150 tokens, 300 if each loss ends in a timeout. Over
// 200 such runs, retries without jitter, 200 tokens paid every run whose
// losses closed the connection, and 450 every run whose losses timed out
// (400 left 2 runs with a payment unknown). A bucket of 20 paid four
// retries, and ended such a run "budget spent" within a second.
//
// What it protects on a device is the server from one device's many calls
// while it is down (a settle of every pending intent at start, a billing
// run), and the battery and data plan from a policy of tiny waits. Nothing
// refunds against a dead server: the full bucket pays 100 retries (50
// after timeouts), then one every five seconds (RetryCost × Refill). So in
// its first minute a Client makes at most 112 retries, beside one first
// attempt per call: 100 calls make at most 212 attempts, where each
// call's own policy alone would make 700 (seven attempts in a minute
// each). After it, one retry per five seconds at most, however many calls
// ask: the retries up to a moment t are at most 100 + t/5s. A fleet of devices
// coming back at a recovering server is spread by each call's backoff,
// its jitter and Retry-After, not by this bucket.
type RetryBudget struct {
	// Tokens is the bucket's size, and what it holds when the Client is
	// made. Zero means 500; -1 turns the budget off, leaving each call's
	// RetryPolicy alone to bound its retries.
	Tokens int
	// RetryCost is what a retry takes. Zero means 5.
	RetryCost int
	// TimeoutCost is what a retry takes after an attempt that timed out
	// (a timeout error from the transport or the http.Client's Timeout),
	// which ties up the server longer. Zero means 10.
	TimeoutCost int
	// Refill is the time, on the Client's clock, in which one token comes
	// back. Zero means one second: a retry every five seconds once the
	// bucket is empty; -1 means never: tokens then come back
	// only with final answers, as in the AWS SDKs.
	Refill time.Duration
}

// stopRetryBudget: the Client's retry budget (RetryBudget) held too few
// tokens for the next retry. Calls that failed together (a dead server at
// app start) stop retrying together; Settle or Do again later.
const stopRetryBudget = "client-wide retry budget spent"

// Defaults of RetryBudget.
const (
	defaultBudgetTokens      = 500
	defaultBudgetRetryCost   = 5
	defaultBudgetTimeoutCost = 10
	defaultBudgetRefill      = time.Second
	// firstAnswerRefund is what a final answer to a call's first attempt
	// puts back (the AWS SDKs' NoRetryIncrement).
	firstAnswerRefund = 1
)

// tokenBucket is a Client's retry budget. It is safe for concurrent use.
type tokenBucket struct {
	off                 bool
	size, cost, timeout int
	refill              time.Duration // 0: never
	mu                  sync.Mutex
	tokens              int
	filled              time.Time // when the last token came back; zero: not yet read
}

func newTokenBucket(b RetryBudget) *tokenBucket {
	if b.Tokens == -1 {
		return &tokenBucket{off: true}
	}
	t := &tokenBucket{
		size:    cmp.Or(b.Tokens, defaultBudgetTokens),
		cost:    cmp.Or(b.RetryCost, defaultBudgetRetryCost),
		timeout: cmp.Or(b.TimeoutCost, defaultBudgetTimeoutCost),
		refill:  b.Refill,
	}
	switch t.refill {
	case 0:
		t.refill = defaultBudgetRefill
	case -1:
		t.refill = 0
	}
	t.tokens = t.size
	return t
}

// fill adds the tokens that came back with time up to now. A clock set
// back adds nothing and restarts the count from now. t.mu is held.
func (t *tokenBucket) fill(now time.Time) {
	if t.filled.IsZero() || t.refill == 0 {
		t.filled = now
		return
	}
	d := now.Sub(t.filled)
	if d < 0 {
		t.filled = now
		return
	}
	n := int64(d / t.refill)
	if n >= int64(t.size-t.tokens) {
		t.tokens, t.filled = t.size, now
		return
	}
	t.tokens += int(n)
	t.filled = t.filled.Add(time.Duration(n) * t.refill)
}

// take takes the cost of a retry after an attempt that failed with err (a
// timeout costs more) and returns it, or 0 when the bucket holds too few:
// no retry then.
func (t *tokenBucket) take(now time.Time, err error) int {
	if t.off {
		return -1
	}
	cost := t.cost
	if timedOut(err) {
		cost = t.timeout
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fill(now)
	if t.tokens < cost {
		return 0
	}
	t.tokens -= cost
	return cost
}

// give puts back n tokens after a final answer.
func (t *tokenBucket) give(now time.Time, n int) {
	if t.off || n <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.fill(now)
	// Compared, not added: a bucket of math.MaxInt must not wrap around.
	if n >= t.size-t.tokens {
		t.tokens = t.size
		return
	}
	t.tokens += n
}

// timedOut reports an attempt that ended in a timeout: its transport's, or
// the http.Client's Timeout (net.Error and url.Error say so).
func timedOut(err error) bool {
	var te interface{ Timeout() bool }
	return err != nil && errors.As(err, &te) && te.Timeout()
}
