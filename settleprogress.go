package idem

import "sync"

// defaultSettleConcurrency is how many intents SettleAll settles at once
// unless Config.SettleConcurrency says otherwise.
const defaultSettleConcurrency = 4

// settleConfig is how SettleAll runs: how many settles at once, and whom
// it tells of each one's end.
type settleConfig struct {
	workers  int
	progress func(s Settled, done, total int)
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

func newSettleProgress(f func(Settled, int, int), total int) *settleProgress {
	return &settleProgress{f: f, total: total}
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

// Settled is what SettleAll made of one intent: Response and Err are those
// of Settle, and Intent.State() tells where it stands now.
type Settled struct {
	Intent   *Intent
	Response *Response
	Err      error
}
