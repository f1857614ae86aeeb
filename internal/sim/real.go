package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	idemclock "github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// The real mode runs checkouts through the real parts the virtual world
// models. The fake server's handler serves on loopback TCP. The device
// keeps its intents in a persist.FileStore on disk. Workers race under
// the Go scheduler. A killed generation's store is fenced, as a dead
// process leaves its disk.
//
// Its faults are the world's classes, made as rules of package fault. The
// server applies its own kinds. The wire (a RoundTripper) applies the
// network's and the intermediary's. Each intent draws its faults from a
// stream of its own. So a seed redraws the same faults for the same
// intents, not the same schedule.

// mode chooses the parts a run uses.
type mode int

const (
	// virtual: one virtual clock, one goroutine at a time; a seed replays.
	virtual mode = iota
	// real: loopback HTTP, a FileStore, racing goroutines.
	real
)

// realEpoch is where the real mode's manual clock starts.
var realEpoch = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// realReconcileDelay is the clients' reconcile delay in the real mode:
// idem's default.
const realReconcileDelay = 2 * time.Minute

// realClasses are the fault classes the real mode injects.
var realClasses = []faultClass{
	faultHold, faultHoldAcrossCrash, faultLoseAnswer, faultReset, faultProxyStatus, faultProxyOther5xx,
	faultRedirect307, faultRedirectLogin, faultCrash, faultClockForward, faultClockBack,
	faultKeySpelling, faultCrashAfterInsert, faultCrashAfterCharge, faultError500, faultSlowWork,
}

// errGenKilled is what a killed generation's store answers: the process
// that owned it is gone, so it writes and reads nothing more.
var errGenKilled = errors.New("sim: this client generation was killed")

// fencedStore is the device store as one process generation sees it. kill
// waits for the saves in progress and then refuses every call, as a
// process killed between two writes would leave the disk.
type fencedStore struct {
	persist.Store
	mu   sync.RWMutex
	dead bool
}

func (s *fencedStore) kill() {
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
}

func (s *fencedStore) guard() (func(), error) {
	s.mu.RLock()
	if s.dead {
		s.mu.RUnlock()
		return nil, errGenKilled
	}
	return s.mu.RUnlock, nil
}

func fenced[T any](s *fencedStore, do func() (T, error)) (T, error) {
	unlock, err := s.guard()
	if err != nil {
		var zero T
		return zero, err
	}
	defer unlock()
	return do()
}

func (s *fencedStore) Write(ctx context.Context, r, old *persist.Record) error {
	_, err := fenced(s, func() (any, error) { return nil, s.Store.Write(ctx, r, old) })
	return err
}

func (s *fencedStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	return fenced(s, func() (*persist.Record, error) { return s.Store.Get(ctx, key) })
}

func (s *fencedStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	return fenced(s, func() ([]*persist.Record, error) { return s.Store.List(ctx, f) })
}

func (s *fencedStore) Delete(ctx context.Context, old *persist.Record) error {
	_, err := fenced(s, func() (any, error) { return nil, s.Store.Delete(ctx, old) })
	return err
}

// wallClock is the device's wall clock over the true time: it jumps both
// ways, while its monotonic reading keeps the true time.
type wallClock struct {
	idemclock.NoBoot
	true  *idemclock.Manual
	start time.Time
	skew  atomic.Int64
}

func (c *wallClock) Now() time.Time { return c.true.Now().Add(time.Duration(c.skew.Load())) }

func (c *wallClock) Sleep(ctx context.Context, d time.Duration) error { return c.true.Sleep(ctx, d) }

func (c *wallClock) Monotonic() time.Duration { return c.true.Now().Sub(c.start) }

// generation is one run of the app: a Client, its store and connections.
// Killing it cancels everything it has in flight and fences its store.
type generation struct {
	n      int
	client *idem.Client
	store  *fencedStore
	hc     *http.Client
	ctx    context.Context
	cancel context.CancelFunc
}

// killed reports whether err is a consequence of g having been killed.
func (g *generation) killed(err error) bool {
	return g.ctx.Err() != nil || errors.Is(err, errGenKilled)
}

// realRun is one run of the real mode.
type realRun struct {
	cfg     config
	clock   *idemclock.Manual
	device  *wallClock
	handler *fakeserver.Handler
	srv     *httptest.Server
	wire    *wire
	policy  idem.RetryPolicy

	mu   sync.Mutex
	gen  *generation
	disk *persist.FileStore // the open FileStore, or nil in memory
	mem  persist.Store

	intentsMu sync.Mutex
	intents   []*rIntent // in creation order

	statsMu    sync.Mutex
	stats      stats
	violations []string

	calls, doubleTaps, restarts atomic.Int64
}

// bad records a broken invariant. Any goroutine may call it.
func (run *realRun) bad(format string, args ...any) {
	run.statsMu.Lock()
	defer run.statsMu.Unlock()
	run.violations = append(run.violations, fmt.Sprintf(format, args...))
}

// count adds one to the figures' count of kind.
func (run *realRun) count(kind string) {
	run.statsMu.Lock()
	defer run.statsMu.Unlock()
	run.stats.fault(kind)
}

// rAction is one user action (a checkout): one or more purchases in
// turn, each a cart.
type rAction struct {
	i        int
	name     string
	declined bool // the customer's card is declined
	amount   int
}

// cart returns the request of purchase p: a changed cart is a changed
// request.
func (a *rAction) cart(base string, p int) idem.Request {
	customer := "cus_" + strconv.Itoa(a.i%17)
	if a.declined {
		customer = declinedCustomer
	}
	req, err := idem.JSONRequest(http.MethodPost, base+"/payments", map[string]any{
		"amount": a.amount + p, "currency": "AZN", "customer": customer, "description": cartDesc(a.i, p),
	})
	if err != nil {
		panic(err)
	}
	return req
}

func cartDesc(action, purchase int) string { return fmt.Sprintf("a%d/c%d", action, purchase) }

// rIntent is one intent and what the app was told about it.
type rIntent struct {
	i, p     int // the action's, the purchase's
	req      idem.Request
	declined bool
	key      string
	// redirected: a login page's redirect was drawn for it.
	redirected bool
	// leftUnknown: the app tried to settle it and the outcome stayed
	// unknown.
	leftUnknown bool
	// unstored: a kill came before its first Do armed it. Nothing of it
	// was stored or sent.
	unstored bool
	final    *idem.Response // the last final answer Do reported
	lastErr  error
	// budgetOut: the last call ended because its retry budget ran out.
	budgetOut bool
}

// runReal runs cfg over the real parts and checks the invariants.
func runReal(cfg config) result {
	if cfg.Actions == 0 {
		cfg.Actions = 200
	}
	if cfg.Workers == 0 {
		cfg.Workers = 8
	}
	run := newRealRun(cfg)
	defer run.srv.Close()
	defer run.wire.close()
	if err := run.restart(nil); err != nil {
		return result{Violations: []string{err.Error()}}
	}
	defer func() {
		run.mu.Lock()
		defer run.mu.Unlock()
		run.gen.cancel()
		run.gen.hc.CloseIdleConnections()
		if run.disk != nil {
			_ = run.disk.Close()
		}
	}()
	run.play()
	run.stats.Actions = cfg.Actions
	if len(run.violations) == 0 {
		run.check()
	}
	run.stats.Intents = len(run.intents)
	run.stats.Charges = len(chargesOf(run.handler))
	return result{Stats: run.stats, Violations: run.violations}
}

// newRealRun starts the fake server of a run on loopback.
func newRealRun(cfg config) *realRun {
	run := &realRun{cfg: cfg, clock: idemclock.NewManual(realEpoch)}
	run.device = &wallClock{true: run.clock, start: realEpoch}
	// A long retention on both sides: the manual clock moves by every
	// goroutine's waits. Expiry is the virtual mode's to explore.
	const retention = 90 * 24 * time.Hour
	run.handler = fakeserver.NewHandler(&fakeserver.Options{
		Clock: run.clock, Lease: 5 * time.Second, Retention: retention,
		Logger: slog.New(outcomes{func(o string) {
			run.statsMu.Lock()
			defer run.statsMu.Unlock()
			run.stats.count(&run.stats.Outcomes, o)
		}}),
	})
	run.srv = httptest.NewServer(run.handler)
	run.policy = idem.RetryPolicy{
		MaxAttempts:     6,
		MaxElapsed:      24 * time.Hour, // the shared clock races: attempts are the budget
		InitialInterval: 100 * time.Millisecond,
		MaxInterval:     2 * time.Second,
		MaxRetryAfter:   8 * time.Second,
	}
	if cfg.Dir == "" {
		run.mem = persist.NewMemory(nil)
	}
	run.wire = newWire(run)
	return run
}

// play makes the run's actions on its workers while the app is killed
// at random moments.
func (run *realRun) play() {
	rng := rand.New(rand.NewPCG(run.cfg.Seed, 0x1de3))
	actions := make([]*rAction, run.cfg.Actions)
	for i := range actions {
		actions[i] = &rAction{i: i, name: fmt.Sprintf("checkout:%d", i), declined: rng.IntN(10) == 0, amount: 100 + rng.IntN(100000)}
	}
	// Each action draws from its own stream, whichever worker runs it.
	seeds := make([]uint64, len(actions))
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}
	stop := make(chan struct{})
	restarterDone := make(chan struct{})
	go func() {
		defer close(restarterDone)
		run.restartAtRandom(rand.New(rand.NewPCG(run.cfg.Seed, 0x5eed)), stop)
	}()
	jobs := make(chan *rAction)
	var wg sync.WaitGroup
	for range run.cfg.Workers {
		wg.Go(func() {
			for a := range jobs {
				run.action(a, rand.New(rand.NewPCG(seeds[a.i], uint64(a.i))))
			}
		})
	}
	for _, a := range actions {
		jobs <- a
	}
	close(jobs)
	wg.Wait()
	close(stop)
	<-restarterDone
}

// restartAtRandom kills the app at random moments until stop, so kills
// land before, during and after requests and saves.
func (run *realRun) restartAtRandom(r *rand.Rand, stop chan struct{}) {
	for range 5 + run.cfg.Actions/40 {
		// Once the workers made some progress since the last restart: a
		// slow generation must still get work done.
		since := run.calls.Load()
		for ready := false; !ready; {
			timer := time.NewTimer(time.Duration(2+r.IntN(40)) * time.Millisecond)
			select {
			case <-stop:
				timer.Stop()
				return
			case <-timer.C:
			}
			ready = run.calls.Load()-since >= int64(run.cfg.Workers)
		}
		if err := run.restart(r); err != nil {
			run.bad("restart: %v", err)
			return
		}
	}
}

// current returns the live generation.
func (run *realRun) current() *generation {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.gen
}

// restart kills the live generation, if any, and starts a new Client on
// the same device store, as an app killed and launched again.
func (run *realRun) restart(r *rand.Rand) error {
	run.mu.Lock()
	defer run.mu.Unlock()
	n := 0
	if old := run.gen; old != nil {
		old.cancel()
		old.store.kill()
		old.hc.CloseIdleConnections()
		n = old.n + 1
		run.restarts.Add(1)
		run.count(faultCrash.Name())
	}
	base := run.mem
	if run.cfg.Dir != "" {
		if run.disk != nil {
			if err := run.disk.Close(); err != nil {
				return fmt.Errorf("closing the device store: %w", err)
			}
		}
		fs, err := persist.OpenDir(filepath.Join(run.cfg.Dir, "device"), nil)
		if err != nil {
			return fmt.Errorf("reopening the device store: %w", err)
		}
		run.disk, base = fs, fs
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if r != nil && r.IntN(2) == 0 {
		// No idle connections: every attempt dials afresh, and no fault
		// hides behind net/http's retry of a reused connection.
		tr.DisableKeepAlives = true
	}
	store := &fencedStore{Store: base}
	hc := &http.Client{Transport: &genTransport{w: run.wire, store: store, base: tr}, Timeout: 30 * time.Second}
	if r != nil && r.IntN(2) == 0 {
		// The device's clock jumps as the app starts.
		run.jumpClock(r)
	}
	quoted := false
	if r != nil && r.IntN(4) == 0 && run.cfg.Faults[faultKeySpelling] {
		// The key as an sf-string: the server must take "K" and K as one.
		run.count(faultKeySpelling.Name())
		quoted = true
	}
	c, err := idem.New(idem.Config{
		HTTPClient:  hc,
		Store:       store,
		Clock:       run.device,
		RetryPolicy: run.policy,
		Server: idem.Server{
			Mark:            idem.MarkEcho,
			Retention:       90 * 24 * time.Hour,
			RetentionMargin: time.Hour,
			QuotedKey:       quoted,
			Lookup: func(req idem.Request, key string) string {
				return req.URL + "?idempotency_key=" + url.QueryEscape(key)
			},
		},
		OnAttempt: func(idem.Attempt) {
			run.statsMu.Lock()
			run.stats.Attempts++
			run.statsMu.Unlock()
		},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	run.gen = &generation{n: n, client: c, store: store, hc: hc, ctx: ctx, cancel: cancel}
	return nil
}

// jumpClock sets the device's clock forward or back by up to three hours,
// within six hours of the true time.
func (run *realRun) jumpClock(r *rand.Rand) {
	by := time.Duration(1+r.IntN(180)) * time.Minute
	if r.IntN(2) == 0 {
		by = -by
	}
	if skew := time.Duration(run.device.skew.Load()); skew+by > 6*time.Hour || skew+by < -6*time.Hour {
		by = -by
	}
	f := faultClockForward
	if by < 0 {
		f = faultClockBack
	}
	if !run.cfg.Faults[f] {
		return
	}
	run.count(f.Name())
	run.device.skew.Add(int64(by))
}
