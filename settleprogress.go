package idem

import "sync"

// defaultSettleConcurrency is how many intents SettleAll settles at once.
// Config.SettleConcurrency may say otherwise.
const defaultSettleConcurrency = 4

// settleConfig is how SettleAll runs. It says how many settles run at once,
// and whom SettleAll tells of each one's end.
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
	// panicked means f panicked, with panicValue. f is called no more.
	// SettleAll panics with the value once its settles are done.
	panicked   bool
	panicValue any
}

func newSettleProgress(f func(Settled, int, int), total int) *settleProgress {
	return &settleProgress{f: f, total: total}
}

// report tells the app that s is done. A panic of f is kept for rethrow. On
// a goroutine of SettleAll it would end the process, out of the app's reach.
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

// rethrow panics on SettleAll's goroutine with the callback's panic value.
// It does so only if the callback panicked.
func (p *settleProgress) rethrow() {
	p.mu.Lock()
	panicked, v := p.panicked, p.panicValue
	p.mu.Unlock()
	if panicked {
		panic(v)
	}
}

// Settled is what SettleAll made of one intent. Response and Err are those
// of Settle. Intent.State() tells where the intent stands now.
type Settled struct {
	Intent   *Intent
	Response *Response
	Err      error
}
