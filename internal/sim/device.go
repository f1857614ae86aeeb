package sim

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/persist"
)

// A device runs an app that pays through idem. It can crash at any point
// (the Client and everything in memory are gone, the store stays), lose
// power in the middle of a store write (the write is lost), run out of
// disk, and have its clock jump.

// crash unwinds a device's call stack when the device dies.
type crash struct {
	where string
	quick bool // the device comes back within seconds
}

type device struct {
	w         *world
	id        int
	principal string
	offset    time.Duration // the device clock minus the world's
	maxOffset time.Duration // the largest offset the clock has had
	// skewed: the clock is days off until correctAt, when it reads
	// preSkew's offset again.
	skewed    bool
	correctAt time.Time
	preSkew   [2]time.Duration // offset, maxOffset
	mem       persist.Store
	store     *deviceStore
	client    *idem.Client
	// client2 is a second Client on the same store, as two parts of an
	// app may hold; nil on most starts.
	client2    *idem.Client
	gen        int           // bumped at every crash
	upAt       time.Time     // when a dead device starts again
	bootAt     time.Time     // when the running process started
	slept      time.Duration // how long the device slept since then
	up         bool
	quoted     bool
	diskFull   time.Time // the disk is full until then
	stuckUntil time.Time // POSTs are held in transit until then
	policy     idem.RetryPolicy
	apps       []*app
	restarted  bool // the app has not resumed its intents since starting
	// settled is told of each intent SettleAll is done with, while the
	// app runs it (settleAllRacingTaps); nil otherwise.
	settled    func(s idem.Settled, done int)
	redirected bool // the edge redirected the device's last request

	attemptTimeout time.Duration

	// offline: no connection can be made until then. written counts the
	// requests the device wrote to a connection: what the client's trace
	// sees as WroteHeaders.
	offline time.Time
	written int
	// net are the device's network faults, made at its first request.
	net *netRules
}

// deviceClock is the device's clock: the world's time plus the device's
// offset. Sleeping lets the world run.
type deviceClock struct{ d *device }

func (c deviceClock) Now() time.Time { return c.d.w.parts.now().Add(c.d.offset) }

// Monotonic is the device's monotonic clock: the time since its process
// started, which no setting of the wall clock moves. (A Clock may offer it
// to idem; see idem.Monotonic where it exists.)
func (c deviceClock) Monotonic() time.Duration { return c.d.w.parts.now().Sub(c.d.bootAt) - c.d.slept }

// SinceBoot is the device's clock that counts sleep: the device booted at
// the world's start and never reboots.
func (c deviceClock) SinceBoot() (time.Duration, string, bool) {
	return c.d.w.parts.now().Sub(c.d.w.parts.epoch()) + time.Hour, fmt.Sprintf("boot-d%d", c.d.id), true
}

func (c deviceClock) Sleep(ctx context.Context, d time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.d.maybeCrash("while waiting to retry")
	if c.d.w.faulty && c.d.w.devRNG.chance(0.02) {
		// The phone sleeps through the wait: the world's time passes,
		// the monotonic reading of Go's clock does not.
		extra := time.Duration(1+c.d.w.devRNG.IntN(120)) * time.Minute
		c.d.slept += extra
		c.d.w.tracef("d%d sleeps %s during a wait", c.d.id, extra)
		d += extra
	}
	c.d.w.parts.advanceTo(c.d.w.parts.now().Add(d))
	return nil
}

func newDevice(w *world, id int) *device {
	r := w.devRNG
	d := &device{
		w:         w,
		id:        id,
		principal: fmt.Sprintf("Bearer user-%d", id),
		mem:       w.parts.newStore(id),
		policy: idem.RetryPolicy{
			MaxAttempts:     pick(r, 3, 5, 10),
			MaxElapsed:      pick(r, 30*time.Second, 2*time.Minute, 5*time.Minute),
			InitialInterval: pick(r, 200*time.Millisecond, 500*time.Millisecond, 2*time.Second),
			MaxInterval:     pick(r, 5*time.Second, 30*time.Second),
			// The jitter draws from math/rand's global source, which no
			// seed reaches; the world varies the policies instead.
			Jitter: -1,
		},
		attemptTimeout: pick(r, 5*time.Second, 10*time.Second, 30*time.Second),
	}
	d.store = &deviceStore{d: d, Store: d.mem}
	for _, name := range []string{"shop", "tips"}[:1+r.IntN(2)] {
		d.apps = append(d.apps, &app{d: d, name: name})
	}
	d.start()
	return d
}

// start launches the app: a new Client on the store that survived.
func (d *device) start() {
	if d.w.faulty && d.w.cfg.Faults[faultKeySpelling] && d.w.devRNG.chance(d.w.cfg.Faults.rate(faultKeySpelling)) {
		d.w.stats.fault(faultKeySpelling.Name())
		d.quoted = !d.quoted
	}
	d.bootAt = d.w.parts.now()
	d.slept = 0
	cfg := idem.Config{
		HTTPClient:  &http.Client{Transport: d.w.parts.network(d)},
		Store:       d.store,
		Clock:       d.w.parts.clock(d),
		RetryPolicy: d.policy,
		Authorizer:  d.authorize,
		// One intent at a time, in the caller's goroutine: the world
		// runs SettleAll's settles as its own steps.
		SettleConcurrency: 1,
		SettleProgress: func(s idem.Settled, done, _ int) {
			if d.settled != nil {
				d.settled(s, done)
			}
		},
		Server: idem.Server{
			Mark:            idem.MarkEcho,
			Retention:       d.w.cfg.Retention,
			RetentionMargin: d.w.cfg.Margin,
			ReconcileDelay:  d.w.cfg.ReconcileDelay,
			Lookup:          func(_ idem.Request, key string) string { return lookupURL(key) },
			QuotedKey:       d.quoted,
		},
	}
	c, err := idem.New(cfg)
	if err != nil {
		panic(err)
	}
	d.client = c
	d.client2 = nil
	if d.w.faulty && d.w.devRNG.chance(d.w.cfg.Faults.rate(faultTwoClients)) {
		d.w.stats.fault(faultTwoClients.Name())
		if d.client2, err = idem.New(cfg); err != nil {
			panic(err)
		}
	}
	d.w.tracef("d%d starts (quoted keys: %v, clock offset %s)", d.id, d.quoted, d.offset)
	d.up = true
	d.restarted = true
}

var errTokenRefresh = errors.New("sim: the token refresh cannot reach the auth server")

// authorize is the app's Authorizer: the device's credentials, or, by
// chance while the world is faulty, a token refresh that fails. (The
// network names the device by its principal whatever the header says.)
func (d *device) authorize(context.Context, string) (string, error) {
	w := d.w
	if w.faulty && w.devRNG.chance(w.cfg.Faults.rate(faultAuthorizer)) {
		w.stats.fault(faultAuthorizer.Name())
		w.tracef("d%d: the Authorizer fails", d.id)
		return "", errTokenRefresh
	}
	return d.principal, nil
}

// maybeCrash kills the device here, by chance, while the world is faulty.
func (d *device) maybeCrash(where string) {
	if d.w.faulty && d.w.devRNG.chance(d.w.cfg.Faults.rate(faultCrash)) {
		d.w.stats.fault(faultCrash.Name())
		panic(crash{where: where})
	}
}

// die ends the device's process: nothing in memory survives.
func (d *device) die(quick bool) {
	d.gen++
	for _, a := range d.apps {
		a.outbox = nil
	}
	d.client = nil
	d.client2 = nil
	d.up = false
	down := pick(d.w.devRNG, time.Second, 10*time.Second, time.Minute, 10*time.Minute, 2*time.Hour)
	if quick {
		down = pick(d.w.devRNG, time.Second, 5*time.Second, 20*time.Second)
	}
	d.upAt = d.w.parts.now().Add(down)
	d.w.parts.died(d)
}

// act runs one user action on the device, catching a crash.
func (d *device) act(fn func()) {
	defer func() {
		if v := recover(); v != nil {
			c, ok := v.(crash)
			if !ok {
				panic(v)
			}
			d.w.tracef("d%d dies %s", d.id, c.where)
			d.die(c.quick)
		}
	}()
	fn()
}

// jumpClock moves the device clock, by chance.
func (d *device) jumpClock() {
	w := d.w
	if !w.faulty {
		return
	}
	r := w.devRNG
	if d.skewed {
		if !w.parts.now().Before(d.correctAt) {
			// The network time corrects the clock.
			d.skewed = false
			d.offset, d.maxOffset = d.preSkew[0], d.preSkew[1]
			w.tracef("d%d's clock is corrected (offset %s)", d.id, d.offset)
		}
		return
	}
	switch {
	case r.chance(w.cfg.Faults.rate(faultClockDays)):
		w.stats.fault(faultClockDays.Name())
		d.skewed = true
		d.preSkew = [2]time.Duration{d.offset, d.maxOffset}
		d.correctAt = w.parts.now().Add(r.between(time.Minute, 6*time.Hour))
		skew := time.Duration(1+r.IntN(3)) * 24 * time.Hour
		if r.chance(0.5) {
			skew = -skew
		}
		d.offset += skew
		w.maxAhead = max(w.maxAhead, d.offset-d.preSkew[0])
		w.tracef("d%d's clock goes %s off until %s", d.id, skew, d.correctAt.Sub(epoch))
	case r.chance(w.cfg.Faults.rate(faultClockForward)):
		w.stats.fault(faultClockForward.Name())
		d.offset += pick(r, time.Minute, time.Hour, w.cfg.Retention)
		d.maxOffset = max(d.maxOffset, d.offset)
	case r.chance(w.cfg.Faults.rate(faultClockBack)):
		w.stats.fault(faultClockBack.Name())
		// Never more than half the client's safety margin behind the
		// furthest the clock has read, however many jumps: a device clock
		// set back further can make an app restarted since send a key the
		// server has forgotten, which no client can detect
		// (docs/RELIABILITY.md).
		d.offset = max(d.offset-r.between(time.Second, w.cfg.Margin/2), d.maxOffset-w.cfg.Margin/2)
	}
}

var errDiskFull = errors.New("sim: no space left on device")

// deviceStore is the device's store: persist.NewMemory's, behind a disk that can
// fill up and a power supply that can fail in the middle of a write.
type deviceStore struct {
	persist.Store
	d *device
}

func (s *deviceStore) write(op string, do func() error) error {
	d := s.d
	w := d.w
	if w.faulty && w.parts.now().Before(d.diskFull) {
		w.stats.fault(faultDiskFull.Name())
		return errDiskFull
	}
	if w.faulty && w.devRNG.chance(w.cfg.Faults.rate(faultDiskFull)) {
		d.diskFull = w.parts.now().Add(pick(w.devRNG, time.Second, time.Minute, 10*time.Minute))
		w.stats.fault(faultDiskFull.Name())
		return errDiskFull
	}
	if w.faulty && w.devRNG.chance(w.cfg.Faults.rate(faultPowerCut)) {
		// The power goes in the middle of the write: it never reaches
		// the disk.
		w.stats.fault(faultPowerCut.Name())
		panic(crash{where: "power cut during " + op})
	}
	d.maybeCrash("before " + op)
	if err := do(); err != nil {
		return err
	}
	d.maybeCrash("after " + op)
	return nil
}

func (s *deviceStore) Write(ctx context.Context, rec, old *persist.Record) error {
	w := s.d.w
	if w.faulty && rec.State == persist.StateNotSent && w.devRNG.chance(w.cfg.Faults.rate(faultNotSentWrite)) {
		w.stats.fault(faultNotSentWrite.Name())
		return errDiskFull
	}
	if w.faulty && rec.State.Resolved() && rec.Response != nil && w.devRNG.chance(w.cfg.Faults.rate(faultSaveAfterAnswer)) {
		// The server answered; the disk fills up before its outcome is
		// saved.
		w.stats.fault(faultSaveAfterAnswer.Name())
		return errDiskFull
	}
	// A write checks the stored records first: the device may die there.
	s.d.maybeCrash("before a store read")
	return s.write("save", func() error {
		if err := s.Store.Write(ctx, rec, old); err != nil {
			return err
		}
		if w.faulty && w.devRNG.chance(w.cfg.Faults.rate(faultWriteLands)) {
			w.stats.fault(faultWriteLands.Name())
			w.tracef("d%d: the write of %s (%s) lands, and reports an error", s.d.id, rec.Key, rec.State)
			return errSyncFailed
		}
		return nil
	})
}

var errSyncFailed = errors.New("sim: fsync: input/output error")

func (s *deviceStore) Delete(ctx context.Context, old *persist.Record) error {
	s.d.maybeCrash("before a store read")
	return s.write("delete", func() error { return s.Store.Delete(ctx, old) })
}

func (s *deviceStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	s.d.maybeCrash("before a store read")
	return s.Store.Get(ctx, key)
}

func (s *deviceStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	s.d.maybeCrash("before a store read")
	return s.Store.List(ctx, f)
}
