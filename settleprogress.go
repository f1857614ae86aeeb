package idem

import "sync"

// defaultSettleConcurrency is how many intents SettleAll settles at once
// unless WithSettleConcurrency says otherwise.
const defaultSettleConcurrency = 4

// settleConfig is how SettleAll runs: how many settles at once, and whom
// it tells of each one's end.
type settleConfig struct {
	workers  int
	progress func(s Settled, done, total int)
}

// WithSettleConcurrency sets how many intents SettleAll settles at once:
// n from 1 (one after the other, oldest first) up. The default is 4: a
// device at app start should not open many connections at once, and
// settles wait mostly on the network. New refuses n below 1.
func WithSettleConcurrency(n int) Option {
	return func(c *config) {
		if n < 1 {
			c.refuse("WithSettleConcurrency(%d): use 1 or more (the default is %d)", n, defaultSettleConcurrency)
			return
		}
		c.settles.workers = n
	}
}

// WithSettleProgress calls f as SettleAll is done with each intent, with
// what became of it (as SettleAll's result will hold it), how many intents
// it is done with, this one included, and how many it will report in all:
// for a progress bar, or to show each payment's outcome as it arrives
// rather than after the slowest. SettleAll makes the calls one at a time,
// done counting up from 1 to total, on the goroutine that settled the
// intent; f must return promptly, as the next report waits for it (the
// settles go on meanwhile). A nil f reports nothing, as without the
// option. If f panics, SettleAll calls it no more, finishes its settles,
// and then panics with the same value on its caller's goroutine.
//
// A callback rather than an iterator: SettleAll settles several intents at
// once on goroutines of its own, which a callback can report from as they
// end, while an iterator would hold each settle until the app's loop asks
// for its result; and a callback crosses to Kotlin and Swift (the mobile
// facade) as a listener, which an iterator does not.
func WithSettleProgress(f func(s Settled, done, total int)) Option {
	return func(c *config) { c.settles.progress = f }
}

// settleProgress reports the settles of one SettleAll.
type settleProgress struct {
	f     func(Settled, int, int)
	mu    sync.Mutex
	done  int
	total int
	// panicked: f panicked, with panicValue; it is called no more, and
	// SettleAll panics with the value once its settles are done.
	panicked   bool
	panicValue any
}

func (c *Client) newSettleProgress(total int) *settleProgress {
	return &settleProgress{f: c.settles.progress, total: total}
}

// report tells the app that s is done. A panic of f is kept for rethrow:
// on a goroutine of SettleAll it would end the process, out of the app's
// reach.
func (p *settleProgress) report(s Settled) {
	if p.f == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	if p.panicked {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			p.panicked, p.panicValue = true, v
		}
	}()
	p.f(s, p.done, p.total)
}

// rethrow panics, on SettleAll's goroutine, with the value the callback
// panicked with, if it did.
func (p *settleProgress) rethrow() {
	p.mu.Lock()
	panicked, v := p.panicked, p.panicValue
	p.mu.Unlock()
	if panicked {
		panic(v)
	}
}
