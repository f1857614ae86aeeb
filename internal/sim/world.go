// Package sim is a simulation of apps on devices paying through idem, a
// network between them and a payments server, driven by one seed. It
// exists for its tests. A run draws user actions, network faults, device
// crashes, clock jumps and server faults from the seed. Then it checks
// that no checkout was charged twice. It checks that what the app was
// told matches what the provider did. And it checks that every intent
// settles once the world turns calm.
//
// A run has two modes, chosen by config.Mode. Both run the same devices
// and apps (device.go, app.go) over parts of their own (parts.go). Both
// share the fault classes (faults.go), their rules in package fault, the
// seeds and the provider's ledger check (checkLedger).
//
// The virtual mode finds the schedules that break the promise. Everything
// runs on one virtual clock. The devices' apps run on the goroutine of
// Run, one action at a time. Each server request runs on a goroutine of
// its own, but only one goroutine ever runs at a time. The others wait on
// channels until the world hands them the turn. So a seed replays the
// same run, whatever the Go scheduler does.
//
// The real mode checks that the promise holds through the real parts
// (realparts.go). The fake server's handler serves on loopback TCP. Each
// device keeps a persist.FileStore on disk and runs on a goroutine of its
// own. The network's faults strike on the wire, in a RoundTripper. A seed
// draws the same kinds of actions and faults, not the same schedule.
//
// Both take their seeds from IDEM_SIM_SEED, IDEM_SIM_SEEDS and
// IDEM_SIM_FIRST_SEED; docs/RELIABILITY.md describes them.
package sim

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"time"
)

// epoch is where the world's clock starts.
var epoch = time.Date(2030, 1, 1, 9, 0, 0, 0, time.UTC)

// event is something the world does at a time: deliver a request, resume a
// server worker, sweep the server's records.
type event struct {
	at  time.Time
	seq uint64 // ties are run in the order they were scheduled
	fn  func()
}

type events []*event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if c := e[i].at.Compare(e[j].at); c != 0 {
		return c < 0
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(*event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*e = old[:len(old)-1]
	return x
}

// clock is the world's true time and its queue of scheduled events.
type clock struct {
	now    time.Time
	queue  events
	seq    uint64
	inStep bool
}

// at schedules fn at t (or now, if t is past).
func (c *clock) at(t time.Time, fn func()) {
	if t.Before(c.now) {
		t = c.now
	}
	c.seq++
	heap.Push(&c.queue, &event{at: t, seq: c.seq, fn: fn})
}

// after schedules fn d from now.
func (c *clock) after(d time.Duration, fn func()) { c.at(c.now.Add(d), fn) }

// advanceTo runs, in time order, every event due by t, then sets the time
// to t. Events scheduled meanwhile for times up to t run too.
func (c *clock) advanceTo(t time.Time) {
	for len(c.queue) > 0 && !c.queue[0].at.After(t) {
		c.step()
	}
	if t.After(c.now) {
		c.now = t
	}
}

// step runs the next event, moving the time to it. It reports false when
// nothing is scheduled.
func (c *clock) step() bool {
	if len(c.queue) == 0 {
		return false
	}
	if c.inStep {
		panic("sim: an event waited for the world; events must not block")
	}
	e := heap.Pop(&c.queue).(*event)
	if e.at.After(c.now) {
		c.now = e.at
	}
	c.inStep = true
	defer func() { c.inStep = false }()
	e.fn()
	return true
}

// rng is the world's only source of randomness.
type rng struct{ *rand.Rand }

func newRNG(seed uint64, stream uint64) rng {
	return rng{rand.New(rand.NewPCG(seed, stream))}
}

// chance reports true with probability p.
func (r rng) chance(p float64) bool { return p > 0 && r.Float64() < p }

// between returns a duration uniform in [lo, hi].
func (r rng) between(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// pick returns one of xs.
func pick[T any](r rng, xs ...T) T { return xs[r.IntN(len(xs))] }

// proc is a server worker: a goroutine that runs only while the world has
// handed it the turn. It gives the turn back when it parks or ends.
type proc struct {
	w        *world
	wake     chan bool // true: run on; false: the server died, unwind
	yield    chan struct{}
	done     bool
	killed   bool
	panicked error // a panic other than errKilled, re-raised by resume
}

// errKilled unwinds a worker whose server crashed.
type errKilled struct{}

func (errKilled) Error() string { return "sim: the server process died" }

// spawn starts fn as a worker and runs it until it parks or ends.
func (w *world) spawn(fn func(p *proc)) *proc {
	p := &proc{w: w, wake: make(chan bool), yield: make(chan struct{})}
	w.procs = append(w.procs, p)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(errKilled); !ok {
					p.panicked = fmt.Errorf("sim: worker panicked: %v", v)
				}
			}
			p.done = true
			p.yield <- struct{}{}
		}()
		if !<-p.wake {
			p.killed = true
			return
		}
		fn(p)
	}()
	w.resume(p, true)
	return p
}

// resume hands the turn to p and waits until p gives it back.
func (w *world) resume(p *proc, alive bool) {
	if p.done {
		return
	}
	p.wake <- alive
	<-p.yield
	if p.done {
		w.reap()
		if p.panicked != nil {
			panic(p.panicked)
		}
	}
}

// reap drops ended workers from the list.
func (w *world) reap() {
	live := w.procs[:0]
	for _, p := range w.procs {
		if !p.done {
			live = append(live, p)
		}
	}
	clear(w.procs[len(live):])
	w.procs = live
}

// park gives the turn back until the world resumes p. A worker whose server
// died unwinds from here with a panic of errKilled.
func (p *proc) park() {
	p.yield <- struct{}{}
	if !<-p.wake {
		p.killed = true
		panic(errKilled{})
	}
}

// sleep parks p for d of world time; d = 0 lets the other workers due now
// run first.
func (p *proc) sleep(d time.Duration) {
	p.w.clk.after(d, func() { p.w.resume(p, true) })
	p.park()
}

// killAll ends every worker, as a server process dying does.
func (w *world) killAll() {
	for _, p := range append([]*proc(nil), w.procs...) {
		w.resume(p, false)
	}
	w.reap()
}

// String names the world's clock reading, for failure messages.
func (c *clock) String() string { return fmt.Sprintf("T+%s", c.now.Sub(epoch)) }
