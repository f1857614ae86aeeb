package idem

import (
	"cmp"
	"errors"
	"sync"
	"time"
)

// RetryBudget is the client-wide retry budget. It is a bucket of tokens that
// every call of one Client draws on to retry. The AWS SDKs' retry quota
// works the same way. A first attempt never needs a token. A retry takes
// RetryCost tokens, or TimeoutCost after an attempt that timed out. A call
// whose next retry finds too few tokens ends at once. Its error is a
// *RetryError whose Reason says the budget is spent. Its outcome is unknown,
// and the intent stays pending. (It ends not sent when the transport proves
// nothing left the device.)
//
// A final answer that is the server's word puts tokens back. (That answer is
// marked with the key's echo, or Server.Mark recognises it.) It puts back
// the cost of the retry that got it. If the first attempt got it, it puts
// back one token. A stranger's answer on the path puts back none. Tokens
// also come back with time, one per Refill. So a device left without
// successes, say offline for an hour, still retries its next call. The
// bucket never holds more than Tokens. The zero RetryBudget holds the
// defaults, for each field's zero value is its default.
//
// The defaults are the AWS standard retryer's bucket and costs. That is 500
// tokens, 5 a retry, 10 after a timeout, and refunds on answers. idem adds a
// token back each second, which AWS does not give. AWS's quota lives in a
// busy server process. There, failing fast protects the service it calls,
// and costs little. A device is one person, and a failure costs a payment of
// unknown outcome. A lost answer on a lossy radio says nothing of the
// server's health. A retry is the cure, and its answer refunds it. So the
// bucket must outlast the largest burst an app makes on a lossy network. Say
// a billing run sends 100 payments at once, and 30% of the answers are lost.
// Those losses cost 150 tokens, or 300 if each ends in a timeout. Over 200
// such runs, 450 tokens paid every run whose losses timed out. 400 left two
// runs with a payment unknown. A bucket of 20 ended such a run "budget
// spent" within a second.
//
// The budget protects the server from one device's many calls while it is
// down. (Think of a settle of every pending intent at start, or a billing
// run.) It also protects the battery and data plan from a policy of tiny
// waits. Nothing refunds against a dead server. The full bucket pays 100
// retries, or 50 after timeouts. Then it pays one every five seconds
// (RetryCost × Refill). So in its first minute a Client makes at most 112
// retries. Each call adds one first attempt to that. So 100 calls make at
// most 212 attempts in that minute. Each call's own policy alone would make
// 700, seven attempts each. The retries up to a moment t are at most
// 100 + t/5s, however many calls ask. A fleet of devices returning to a
// recovering server needs spreading too. Each call's backoff, jitter and
// Retry-After spread it, not this bucket.
type RetryBudget struct {
	// Tokens is the bucket's size, and what it holds when the Client is
	// made. Zero means 500. -1 turns the budget off. Then each call's
	// RetryPolicy alone bounds its retries.
	Tokens int
	// RetryCost is what a retry takes. Zero means 5.
	RetryCost int
	// TimeoutCost is what a retry takes after an attempt that timed out.
	// Such a retry ties up the server longer. A timeout is a timeout error
	// from the transport or the http.Client's Timeout. Zero means 10.
	TimeoutCost int
	// Refill is the time, on the Client's clock, in which one token comes
	// back. Zero means one second, a retry every five seconds once the
	// bucket is empty. -1 means never. Tokens then come back only with final
	// answers, as in the AWS SDKs.
	Refill time.Duration
}

// stopRetryBudget means the Client's retry budget (RetryBudget) held too few
// tokens for the next retry. Calls that failed together stop retrying
// together. (Think of a dead server at app start.) Settle or Do again later.
const stopRetryBudget = "client-wide retry budget spent"

// Defaults of RetryBudget.
const (
	defaultBudgetTokens      = 500
	defaultBudgetRetryCost   = 5
	defaultBudgetTimeoutCost = 10
	defaultBudgetRefill      = time.Second
	// firstAnswerRefund is what a final answer to a call's first attempt
	// puts back. It is the AWS SDKs' NoRetryIncrement.
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

// fill adds the tokens that came back with time up to now. A clock set back
// adds nothing and restarts the count from now. t.mu is held.
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

// take takes the cost of a retry after an attempt that failed with err. A
// timeout costs more. take returns the cost, or 0 when the bucket holds too
// few. There is no retry then.
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

// timedOut reports an attempt that ended in a timeout. That is its
// transport's timeout, or the http.Client's Timeout. (net.Error and
// url.Error say so.)
func timedOut(err error) bool {
	var te interface{ Timeout() bool }
	return err != nil && errors.As(err, &te) && te.Timeout()
}
