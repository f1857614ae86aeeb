package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/persist"
)

// The randomized end-to-end test runs idem through the real plumbing that
// internal/sim models: the real fake server and its faults, over net/http
// and loopback TCP, a FileStore on disk, and goroutines racing under the Go
// scheduler. internal/sim finds the schedules that break the promise, each
// replayable from its seed; this test checks that the promise still holds
// through the real parts.
//
// Its draws (faults, double taps, restart points, declines) come from one
// seed, set as internal/sim's are, from the environment:
//
//	IDEM_SIM_SEED=n     run seed n alone (a failure prints the command that reruns it)
//	IDEM_SIM_SEEDS=n    run n seeds (default 1), from IDEM_SIM_FIRST_SEED (default 1)
//	IDEM_SIM_ACTIONS=n  user actions per seed (default 200)
//	IDEM_SIM_WORKERS=n  goroutines making them (default 8)
//	IDEM_SIM_STORE=file|memory the device store (default file)
//
// The interleaving of goroutines is the scheduler's, so a seed redraws the
// same faults for the same intents, not the same schedule. The long run:
//
//	IDEM_SIM_ACTIONS=10000 go test -race -run 'TestRandomizedEndToEnd$' -timeout 30m

// relEpoch is where the randomized run's manual clock starts.
var relEpoch = time.Date(2026, 12, 1, 8, 0, 0, 0, time.UTC)

// errKilled is what a killed generation's store answers: the process that
// owned it is gone, so it writes and reads nothing more.
var errKilled = errors.New("reliability test: this client generation was killed")

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
		return nil, errKilled
	}
	return s.mu.RUnlock, nil
}

func (s *fencedStore) Write(ctx context.Context, r, old *persist.Record) error {
	unlock, err := s.guard()
	if err != nil {
		return err
	}
	defer unlock()
	return s.Store.Write(ctx, r, old)
}

func (s *fencedStore) Get(ctx context.Context, key string) (*persist.Record, error) {
	unlock, err := s.guard()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.Store.Get(ctx, key)
}

func (s *fencedStore) List(ctx context.Context, f persist.Filter) ([]*persist.Record, error) {
	unlock, err := s.guard()
	if err != nil {
		return nil, err
	}
	defer unlock()
	return s.Store.List(ctx, f)
}

func (s *fencedStore) Delete(ctx context.Context, old *persist.Record) error {
	unlock, err := s.guard()
	if err != nil {
		return err
	}
	defer unlock()
	return s.Store.Delete(ctx, old)
}

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

// randomRun is the shared state of one randomized run.
type randomRun struct {
	t    *testing.T
	seed uint64
	// clock is the true time, the server's; device is the device's wall
	// clock over it, which jumps both ways.
	clock   *clock.Manual
	device  *deviceClock
	net     *network
	srv     *fakeserver.Server
	useFile bool
	dir     string
	policy  idem.RetryPolicy

	mu   sync.Mutex
	gen  *generation
	disk *persist.FileStore // the open FileStore, when useFile
	mem  persist.Store      // the device, when !useFile

	intentsMu sync.Mutex
	intents   []*rIntent // every intent of every action, in creation order

	attempts, retries, restarts, doubleTaps, calls            atomic.Int64
	jumps, reconciles, paidAgain, cartChanges, refusedChanges atomic.Int64
	redirects                                                 atomic.Int64 // calls that a login page's redirect ended
	faultsMu                                                  sync.Mutex
	faults                                                    map[string]int
	// statuses counts attempts by answer status, 0 for no answer.
	statuses map[int]int
}

// rAction is one user action of the run (a checkout): one or more
// purchases in turn, each a cart, all under the action's name.
type rAction struct {
	i        int
	name     string
	declined bool // the action's customer's card is declined
	amount   int
}

// cart returns the request of the action's purchase p: a changed cart is
// a changed request.
func (a *rAction) cart(t testing.TB, base string, p int) idem.Request {
	t.Helper()
	customer := "cus_" + strconv.Itoa(a.i%17)
	if a.declined {
		customer = "cus_declined"
	}
	req, err := idem.JSONRequest(http.MethodPost, base+"/payments", map[string]any{
		"amount": a.amount + p, "currency": "AZN", "customer": customer, "description": "random " + strconv.Itoa(a.i) + "/" + strconv.Itoa(p),
	})
	require.NoError(t, err)
	return req
}

// rIntent is one intent of the run and what the app was told about it.
type rIntent struct {
	i        int // the action's
	name     string
	req      idem.Request
	declined bool
	key      string
	// redirected is set when the intent's first attempt was drawn to be
	// sent to a login page.
	redirected bool
	// leftUnknown is set when the app tried to settle the intent and the
	// outcome stayed unknown.
	leftUnknown bool

	// final is the last final answer Do reported, nil if none.
	final *idem.Response
	// lastErr is the last call's error.
	lastErr error
	// budgetOut is true when the last call ended because its retry budget
	// ran out (not because its generation was killed).
	budgetOut bool
}

func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s=%q", name, v)
	return n
}

func envSeed(t testing.TB, name string, def uint64) uint64 {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	require.NoError(t, err, "%s=%q", name, v)
	return n
}

// pickSeeds returns the seeds of a randomized test: IDEM_SIM_SEED alone,
// or IDEM_SIM_SEEDS of them (def by default) from IDEM_SIM_FIRST_SEED, as
// internal/sim takes them.
func pickSeeds(t testing.TB, def uint64) []uint64 {
	t.Helper()
	if os.Getenv("IDEM_SIM_SEED") != "" {
		return []uint64{envSeed(t, "IDEM_SIM_SEED", 0)}
	}
	first := envSeed(t, "IDEM_SIM_FIRST_SEED", 1)
	var seeds []uint64
	for i := range envSeed(t, "IDEM_SIM_SEEDS", def) {
		seeds = append(seeds, first+i)
	}
	require.NotEmpty(t, seeds, "IDEM_SIM_SEEDS")
	return seeds
}

// TestRandomizedEndToEnd runs many actions from many goroutines against
// the fake server with faults drawn at random for each intent, double taps
// and client restarts at random points, and checks at the end that every
// intent made exactly one payment or one decline, or provably none, that
// what the app was told is what the server stored, and that the server's
// totals add up.
//
// Between the app and the server is a network (see network) that holds
// requests in transit, across restarts and up to the reconcile delay, and a
// proxy that answers its own 5xx after the server did the work, redirects
// to a login page, and redirects with 307. The device's clock jumps both
// ways. An action may change its cart (a new purchase, with a new intent),
// reconcile an intent the app gave up on and pay again when the server
// never did it, as an app does: every new intent is checked to be created
// only while every earlier intent of its action is settled.
func TestRandomizedEndToEnd(t *testing.T) {
	t.Parallel()
	nIntents := envInt(t, "IDEM_SIM_ACTIONS", 200)
	workers := envInt(t, "IDEM_SIM_WORKERS", 8)
	require.Positive(t, nIntents)
	require.Positive(t, workers)
	for _, seed := range pickSeeds(t, 1) {
		if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { randomizedEndToEnd(t, seed, nIntents, workers) }) {
			t.Errorf("seed %d broke the invariants; replay it with:\n\tIDEM_SIM_SEED=%d IDEM_SIM_ACTIONS=%d IDEM_SIM_WORKERS=%d go test . -run 'TestRandomizedEndToEnd$' -count=1 -v",
				seed, seed, nIntents, workers)
			return
		}
	}
}

// randomizedEndToEnd is one run of TestRandomizedEndToEnd.
func randomizedEndToEnd(t *testing.T, seed uint64, nIntents, workers int) {
	rng := rand.New(rand.NewPCG(seed, 0x1de3))

	run := &randomRun{t: t, seed: seed, clock: clock.NewManual(relEpoch), faults: make(map[string]int), statuses: make(map[int]int)}
	run.device = newDeviceClock(run.clock)
	// A FileStore on disk unless asked otherwise: the simulation's devices
	// keep their intents in memory (persist.NewMemory).
	switch v := os.Getenv("IDEM_SIM_STORE"); v {
	case "", "file":
		run.useFile = true
	case "memory":
	default:
		t.Fatalf("IDEM_SIM_STORE=%q: want file or memory", v)
	}
	// A long retention on both sides: the run's manual clock moves by every
	// goroutine's waits, and expiry is not what this test is about.
	const retention = 90 * 24 * time.Hour
	run.srv = fakeserver.NewServer(&fakeserver.Options{Clock: run.clock, Lease: 5 * time.Second, Retention: retention})
	t.Cleanup(run.srv.Close)
	run.policy = idem.RetryPolicy{
		MaxAttempts:     6,
		MaxElapsed:      24 * time.Hour, // the shared clock races: attempts are the budget
		InitialInterval: 100 * time.Millisecond,
		MaxInterval:     2 * time.Second,
		MaxRetryAfter:   8 * time.Second,
	}
	if run.useFile {
		run.dir = filepath.Join(t.TempDir(), "device")
	} else {
		run.mem = persist.NewMemory(nil)
	}
	run.net = newNetwork(run)
	t.Cleanup(run.net.close)
	require.NoError(t, run.restart(nil))
	t.Cleanup(func() {
		run.mu.Lock()
		defer run.mu.Unlock()
		run.gen.cancel()
		run.gen.hc.CloseIdleConnections()
		if run.disk != nil {
			_ = run.disk.Close()
		}
	})

	actions := make([]*rAction, nIntents)
	for i := range actions {
		actions[i] = &rAction{i: i, name: fmt.Sprintf("random:%d", i), declined: rng.IntN(10) == 0, amount: 100 + rng.IntN(100000)}
	}
	// Each intent's draws come from its own stream, so they do not depend
	// on which worker picks it up when.
	seeds := make([]uint64, len(actions))
	for i := range seeds {
		seeds[i] = rng.Uint64()
	}

	start := time.Now()
	stopRestarts := make(chan struct{})
	restarterDone := make(chan struct{})
	go func() {
		// Restarts at random moments while the workers run, so they land
		// before, during and after requests and saves.
		defer close(restarterDone)
		r := rand.New(rand.NewPCG(seed, 0x5eed))
		maxRestarts := 5 + nIntents/40
		for range maxRestarts {
			// A random moment, once the workers have made some progress
			// since the last restart: a slow generation (a big FileStore to
			// open, a loaded machine) must still get work done.
			since := run.calls.Load()
			for ready := false; !ready; {
				timer := time.NewTimer(time.Duration(2+r.IntN(40)) * time.Millisecond)
				select {
				case <-stopRestarts:
					timer.Stop()
					return
				case <-timer.C:
				}
				ready = run.calls.Load()-since >= int64(workers)
			}
			if err := run.restart(r); err != nil {
				// The workers see a killed generation and stop in a bounded
				// number of tries.
				t.Errorf("restart: %v", err)
				return
			}
		}
	}()

	jobs := make(chan *rAction)
	var wg sync.WaitGroup
	for range workers {
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
	close(stopRestarts)
	<-restarterDone
	if t.Failed() {
		return
	}
	run.check(run.intents, time.Since(start))
}

// current returns the live generation.
func (run *randomRun) current() *generation {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.gen
}

// restart kills the live generation, if any, and starts a new Client on
// the same device store, as an app killed and launched again. It may run
// on any goroutine, so it returns its error rather than failing the test.
func (run *randomRun) restart(r *rand.Rand) error {
	run.mu.Lock()
	defer run.mu.Unlock()
	n := 0
	if old := run.gen; old != nil {
		old.cancel()
		old.store.kill()
		old.hc.CloseIdleConnections()
		n = old.n + 1
		run.restarts.Add(1)
	}
	var base persist.Store = run.mem
	if run.useFile {
		if run.disk != nil {
			if err := run.disk.Close(); err != nil {
				return fmt.Errorf("closing the device store: %w", err)
			}
		}
		fs, err := persist.OpenDir(run.dir, nil)
		if err != nil {
			return fmt.Errorf("reopening the device store: %w", err)
		}
		run.disk = fs
		base = fs
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if r != nil && r.IntN(2) == 0 {
		// Half the generations keep no idle connections, so every attempt
		// dials a fresh one and sees faults unhidden by net/http's retry of
		// a reused connection.
		tr.DisableKeepAlives = true
	}
	store := &fencedStore{Store: base}
	hc := &http.Client{Transport: &genTransport{n: run.net, store: store, base: tr}, Timeout: 30 * time.Second}
	if r != nil && r.IntN(2) == 0 {
		// The device's clock jumps as the app starts: set by the user, or
		// by a network's wrong time.
		run.jumpClock(r)
	}
	var extra []idem.Option
	if r != nil && r.IntN(4) == 0 {
		// The key as an sf-string: the server must take "K" and K as one.
		extra = append(extra, idem.WithQuotedKey())
	}
	c, err := idem.NewWith(append(extra,
		idem.WithLookup(contractLookup),
		idem.WithHTTPClient(hc),
		idem.WithStore(store),
		idem.WithClock(run.device),
		idem.WithRetryPolicy(run.policy),
		idem.WithRetention(90*24*time.Hour, time.Hour),
		idem.WithAttemptHook(func(a idem.Attempt) {
			run.attempts.Add(1)
			run.faultsMu.Lock()
			run.statuses[a.StatusCode]++
			run.faultsMu.Unlock()
			if a.Retry {
				run.retries.Add(1)
			}
		}),
	)...)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	run.gen = &generation{n: n, client: c, store: store, hc: hc, ctx: ctx, cancel: cancel}
	return nil
}

// jumpClock sets the device's clock forward or back by up to three hours,
// keeping it within six hours of the true time.
func (run *randomRun) jumpClock(r *rand.Rand) {
	by := time.Duration(1+r.IntN(180)) * time.Minute
	if r.IntN(2) == 0 {
		by = -by
	}
	if skew := run.device.skewed(); skew+by > 6*time.Hour || skew+by < -6*time.Hour {
		by = -by
	}
	run.device.Jump(by)
	run.jumps.Add(1)
}

// killed reports whether err is a consequence of g having been killed.
func (g *generation) killed(err error) bool {
	return g.ctx.Err() != nil || errors.Is(err, errKilled)
}

// injectFaults draws the faults for one intent's key: the server's, and
// the network's and proxy's in front of it.
func (run *randomRun) injectFaults(it *rIntent, r *rand.Rand) {
	n := r.IntN(4) // 0-3 faults; a quarter of the intents see none
	for range n {
		if r.IntN(3) == 0 {
			run.injectProxyFault(it, r)
			continue
		}
		f := fakeserver.Fault{Key: it.key, Count: 1 + r.IntN(2)}
		label := ""
		switch r.IntN(9) {
		case 0:
			f.Kind = fakeserver.FaultDropResponse
		case 1:
			f.Kind, f.Delay = fakeserver.FaultDelay, time.Duration(1+r.IntN(5))*time.Millisecond
		case 2:
			f.Kind = fakeserver.FaultCrashAfterInsert
		case 3:
			f.Kind = fakeserver.FaultCrashAfterProvider
		case 4:
			f.Kind = fakeserver.FaultError
		case 5:
			f.Kind = fakeserver.FaultReset
		case 6:
			f.Kind, f.Status = fakeserver.FaultStatus, []int{http.StatusTooManyRequests, http.StatusServiceUnavailable}[r.IntN(2)]
			switch r.IntN(3) {
			case 0:
				f.RetryAfter = strconv.Itoa(1 + r.IntN(3))
				label = "+retry-after-seconds"
			case 1:
				f.RetryAfter = run.clock.Now().Add(time.Duration(1+r.IntN(3)) * time.Second).Format(http.TimeFormat)
				label = "+retry-after-date"
			}
		case 7:
			f.Kind, f.Status = fakeserver.FaultStatus, []int{http.StatusRequestTimeout, http.StatusInternalServerError, http.StatusBadGateway, http.StatusGatewayTimeout}[r.IntN(4)]
		case 8:
			// A Retry-After above the client's cap ends the call at once:
			// the budget runs out and the intent stays unresolved.
			f.Kind, f.Status, f.RetryAfter = fakeserver.FaultStatus, http.StatusServiceUnavailable, "3600"
			label = "+retry-after-over-cap"
		}
		err := run.srv.InjectFault(f)
		if errors.Is(err, fakeserver.ErrTooManyFaults) {
			// The faults of intents that settled before meeting them stay
			// pending; at the server's bound, drop them all and go on.
			run.srv.ClearFaults()
			run.count("server faults dropped at the bound", 1)
			err = run.srv.InjectFault(f)
		}
		assert.NoError(run.t, err)
		name := string(f.Kind)
		if f.Kind == fakeserver.FaultStatus {
			name += "-" + strconv.Itoa(f.Status)
		}
		run.faultsMu.Lock()
		run.faults[name+label] += f.Count
		run.faultsMu.Unlock()
	}
}

func (run *randomRun) count(fault string, n int) {
	run.faultsMu.Lock()
	run.faults[fault] += n
	run.faultsMu.Unlock()
}

// injectProxyFault draws one fault of the network or the proxy.
func (run *randomRun) injectProxyFault(it *rIntent, r *rand.Rand) {
	var f proxyFault
	switch r.IntN(5) {
	case 0, 1:
		// Held in transit for up to (nearly) the reconcile delay, the
		// longest the client assumes; one time in two the app is killed
		// while the request is on its way, before it records anything.
		f = proxyFault{kind: proxyHold, hold: time.Duration(1+r.IntN(int(reconcileDelay/time.Second)-1)) * time.Second, die: r.IntN(2) == 0}
		name := "net-hold"
		if f.die {
			name += "+app-killed"
		}
		run.count(name, 1)
	case 2:
		// A CDN answers its own 5xx after the server did the work.
		f = proxyFault{kind: proxyStatusAfterWork, status: []int{501, 507, 520, 522, 524}[r.IntN(5)]}
		run.count("proxy-after-work-"+strconv.Itoa(f.status), 1)
	case 3:
		f = proxyFault{kind: proxyRedirect307}
		run.count("proxy-307", 1)
	case 4:
		// A login page in front of the server answers with a redirect,
		// perhaps after an earlier attempt charged: the outcome is unknown
		// and the call ends.
		it.redirected = true
		f = proxyFault{kind: proxyLogin}
		run.count("proxy-login-redirect", 1)
	}
	run.net.add(it.key, f)
}

// action runs one user action: one purchase, or, one time in three, two or
// three in turn, each with a changed cart.
func (run *randomRun) action(a *rAction, r *rand.Rand) {
	purchases := 1
	if r.IntN(3) == 0 {
		purchases += 1 + r.IntN(2)
	}
	for p := range purchases {
		if p > 0 {
			run.cartChanges.Add(1)
			if r.IntN(3) == 0 {
				run.jumpClock(r)
			}
		}
		it := run.newIntent(a, a.cart(run.t, run.srv.URL, p), false, r)
		if it == nil {
			return // the previous purchase is unresolved: the app waits
		}
		if !run.drive(it, a, r, 0) {
			return
		}
	}
}

// newIntent creates the intent for req with Client.Intent (or NewIntent
// when again is set, to pay again after a void intent), and checks the
// promise of the unresolved guard: a new intent exists only while every
// earlier intent of its action is settled. It returns nil when the guard
// refused.
func (run *randomRun) newIntent(a *rAction, req idem.Request, again bool, r *rand.Rand) *rIntent {
	t := run.t
	for try := 0; ; try++ {
		if try == 20 {
			t.Errorf("action %d: no intent could be created in 20 generations", a.i)
			return nil
		}
		g := run.current()
		var (
			in  *idem.Intent
			err error
		)
		if again {
			in, err = g.client.NewIntent(g.ctx, a.name, req)
		} else {
			in, err = g.client.Intent(g.ctx, a.name, req)
			if errors.As(err, new(*idem.ResolvedError)) {
				// The action's last purchase succeeded: the next one is
				// a deliberate new payment.
				in, err = g.client.NewIntent(g.ctx, a.name, req)
			}
		}
		if err == nil {
			// The user taps: the intent is armed before anything is sent.
			err = idem.Arm(g.client, g.ctx, in)
		}
		switch {
		case g.killed(err):
			continue
		case errors.As(err, new(*idem.UnresolvedError)):
			run.refusedChanges.Add(1)
			return nil
		case err != nil:
			t.Errorf("action %d: %v", a.i, err)
			return nil
		}
		recs, err := g.store.List(g.ctx, persist.Filter{Name: a.name})
		if g.killed(err) {
			continue
		}
		require.NoError(t, err)
		for _, rec := range recs {
			if rec.Key != in.Key() && !rec.State.Resolved() {
				t.Errorf("action %d: intent %s was created while intent %s (%s, created %s) was unresolved", a.i, in.Key(), rec.Key, rec.State, rec.CreatedAt)
			}
		}
		it := &rIntent{i: a.i, name: a.name, req: req, declined: a.declined, key: in.Key()}
		run.intentsMu.Lock()
		known := false
		for _, other := range run.intents {
			known = known || other.key == it.key
		}
		if !known {
			run.intents = append(run.intents, it)
		}
		run.intentsMu.Unlock()
		if known {
			// The same cart's intent, returned again: a resumption.
			for _, other := range run.intents {
				if other.key == it.key {
					return other
				}
			}
		}
		run.injectFaults(it, r)
		if r.IntN(4) == 0 {
			// The user leaves the Pay screen open: the first attempt
			// goes out minutes after the intent was made.
			_ = run.clock.Sleep(context.Background(), time.Duration(r.IntN(600))*time.Second)
		}
		return it
	}
}

// drive makes up to three calls of Do for it, some of them double taps,
// across whatever restarts happen. An intent left unresolved may then be
// reconciled, as the app does after a restart or when the user gives up
// waiting, and paid again under a new intent when the server never did
// it. The result says whether the action may go on to its next purchase.
func (run *randomRun) drive(it *rIntent, a *rAction, r *rand.Rand, depth int) bool {
	t := run.t
	g := run.current()
	in, err := g.client.Load(g.ctx, it.key)
	if err != nil {
		if !g.killed(err) {
			t.Errorf("intent %d: load: %v", it.i, err)
			return false
		}
		g = nil
	}

	const maxCalls = 3
	killedCalls := 0
	for call := 0; call < maxCalls; {
		if cur := run.current(); cur != g {
			// A restart: the new app loads the intent from the device.
			g = cur
			loaded, err := g.client.Load(g.ctx, it.key)
			if err != nil {
				if g.killed(err) {
					continue
				}
				t.Errorf("intent %d: load after restart: %v", it.i, err)
				return false
			}
			in = loaded
			if !in.State().Resolved() && r.IntN(2) == 0 {
				// The app looks the intent up before it resumes it.
				if done, ok := run.settle(g, it, in, r); ok {
					return done
				}
				// A kill may have cut the reconciliation short: the
				// device is the truth, so start over from it.
				continue
			}
		}
		if in.State().Resolved() {
			return true
		}
		run.calls.Add(1)
		resp, err := run.doMaybeTwice(g, in, r)
		it.lastErr = err
		// A killed generation's goroutines may still return what its
		// memory holds; only what the device kept counts.
		final := resp != nil && (err == nil || isAPIError(err)) && g.ctx.Err() == nil
		if final {
			it.final = resp
			var saveErr *idem.SaveError
			if !errors.As(err, &saveErr) {
				return true
			}
			// The answer arrived but could not be saved (the generation was
			// killed): the next Do replays it.
		}
		if err != nil && !final && !errors.Is(err, idem.ErrOutcomeUnknown) && !g.killed(err) {
			t.Errorf("intent %d: unexpected error: %v", it.i, err)
			return false
		}
		if g.killed(err) {
			// A killed call does not use up the intent's calls, but a run of
			// restarts cannot keep one intent going for ever.
			killedCalls++
			if killedCalls > 20 {
				t.Errorf("intent %d: killed 20 times", it.i)
				return false
			}
			continue
		}
		it.budgetOut = budgetRanOut(err)
		var retryErr *idem.RetryError
		if errors.As(err, &retryErr) && retryErr.Reason == idem.StopRedirect {
			run.redirects.Add(1)
		}
		call++
	}
	if r.IntN(2) == 0 {
		return false // left for later: the check settles it
	}
	void, ok := run.settle(g, it, in, r)
	if !ok {
		return false
	}
	if void && depth < 2 {
		// The server never did it: the app pays again, under a new key.
		again := run.newIntent(a, it.req, true, r)
		if again == nil {
			return false
		}
		run.paidAgain.Add(1)
		return run.drive(again, a, r, depth+1)
	}
	return !void
}

// settle reconciles an unresolved intent as an app does: after a while,
// and again after the reconcile delay when the server cannot tell yet. ok
// says whether it concluded; void, that the server never did the work.
func (run *randomRun) settle(g *generation, it *rIntent, in *idem.Intent, r *rand.Rand) (void, ok bool) {
	if run.net.uncertain(it.key) {
		// A kill cut one of its round trips short: the request may sit
		// in a socket for a moment of real time, which the manual clock
		// does not measure. The check settles it at the end.
		return false, false
	}
	if r.IntN(3) == 0 {
		// The device's clock is set while the app waits for an answer.
		run.jumpClock(r)
	}
	_ = run.clock.Sleep(g.ctx, time.Duration(r.Int64N(int64(2*reconcileDelay))))
	for range 2 {
		resp, err := g.client.Reconcile(g.ctx, in)
		switch {
		case g.killed(err):
			return false, false
		case errors.Is(err, idem.ErrOutcomeUnknown):
			_ = run.clock.Sleep(g.ctx, reconcileDelay)
			continue
		case err != nil:
			run.t.Errorf("intent %d: reconcile: %v", it.i, err)
			return false, false
		}
		run.reconciles.Add(1)
		switch in.State() {
		case persist.StateSucceeded:
			it.final = resp
			return false, true
		case persist.StateVoid:
			return true, true
		}
		run.t.Errorf("intent %d: reconciled to %s", it.i, in.State())
		return false, false
	}
	it.leftUnknown = true
	return false, false
}

// The faults of the network and the proxy in front of the server.
const (
	proxyHold            = "hold"
	proxyStatusAfterWork = "status-after-work"
	proxyLogin           = "login"
	proxyRedirect307     = "redirect-307"
)

type proxyFault struct {
	kind   string
	hold   time.Duration // proxyHold: how long the request stays in transit
	die    bool          // proxyHold: the app is killed meanwhile
	status int           // proxyStatusAfterWork
}

// network is what lies between the devices and the fake server: it keeps
// requests in transit for a while on the true clock, across restarts, and
// answers for the proxy.
type network struct {
	run  *randomRun
	base *http.Transport // delivers the held requests
	// delivering is held while held requests are delivered, so that no
	// request passes one that is due and on its way.
	delivering sync.Mutex
	mu         sync.Mutex
	// faults holds each key's next faults, in order.
	faults map[string][]proxyFault
	held   []heldRequest
	// cut holds the keys of which a round trip was cut short by a kill.
	cut map[string]bool
}

type heldRequest struct {
	req *http.Request
	due time.Time
}

func newNetwork(run *randomRun) *network {
	return &network{run: run, base: &http.Transport{DisableKeepAlives: true}, faults: make(map[string][]proxyFault), cut: make(map[string]bool)}
}

func (n *network) close() { n.base.CloseIdleConnections() }

func (n *network) add(key string, f proxyFault) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults[key] = append(n.faults[key], f)
}

func (n *network) next(key string) (proxyFault, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	fs := n.faults[key]
	if len(fs) == 0 {
		return proxyFault{}, false
	}
	n.faults[key] = fs[1:]
	return fs[0], true
}

func (n *network) uncertain(key string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cut[key]
}

// deliver lets the held requests whose time has come reach the server,
// all of them when all is set, and drops their answers.
func (n *network) deliver(all bool) {
	n.delivering.Lock()
	defer n.delivering.Unlock()
	now := n.run.clock.Now()
	n.mu.Lock()
	var due []heldRequest
	kept := n.held[:0]
	for _, h := range n.held {
		if all || !now.Before(h.due) {
			due = append(due, h)
		} else {
			kept = append(kept, h)
		}
	}
	n.held = kept
	n.mu.Unlock()
	for _, h := range due {
		resp, err := n.base.RoundTrip(h.req)
		if err != nil {
			continue // the server's own faults apply to it too
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// genTransport is one app generation's way onto the network.
type genTransport struct {
	n     *network
	store *fencedStore // the generation's: killed with it
	base  http.RoundTripper
}

func (tr *genTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	// What was held until now arrives first.
	tr.n.deliver(false)
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	if req.Method == http.MethodGet && req.URL.Path == "/login" {
		return proxyAnswer(req, http.StatusOK, "text/html", "<html>Sign in</html>", nil), nil
	}
	key := strings.Trim(req.Header.Get("Idempotency-Key"), `"`)
	f, ok := proxyFault{}, false
	if key != "" {
		f, ok = tr.n.next(key)
	}
	switch {
	case !ok:
	case f.kind == proxyHold:
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return nil, err
		}
		later := req.Clone(context.Background())
		later.Body = io.NopCloser(bytes.NewReader(body))
		unlock, err := tr.store.guard()
		if err != nil {
			return nil, err // the app is dead: nothing leaves it
		}
		tr.n.mu.Lock()
		tr.n.held = append(tr.n.held, heldRequest{req: later, due: tr.n.run.clock.Now().Add(f.hold)})
		tr.n.mu.Unlock()
		unlock()
		if f.die {
			if err := tr.n.run.restart(nil); err != nil {
				tr.n.run.t.Errorf("restart: %v", err)
			}
		}
		return nil, errors.New("reliability test: the connection broke while the request was in transit")
	case f.kind == proxyLogin:
		return proxyAnswer(req, http.StatusFound, "text/html", "", http.Header{"Location": {"/login"}}), nil
	case f.kind == proxyRedirect307:
		return proxyAnswer(req, http.StatusTemporaryRedirect, "text/plain", "", http.Header{"Location": {req.URL.String()}}), nil
	case f.kind == proxyStatusAfterWork:
		resp, err := tr.forward(req, key)
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return proxyAnswer(req, f.status, "text/html", "<html>origin error</html>", nil), nil
	}
	return tr.forward(req, key)
}

// forward sends req to the server. When the app is killed meanwhile, the
// request may still sit in a socket for a moment of real time, which the
// manual clock does not see; its key is then marked cut.
func (tr *genTransport) forward(req *http.Request, key string) (*http.Response, error) {
	resp, err := tr.base.RoundTrip(req)
	if req.Context().Err() != nil && key != "" {
		tr.n.mu.Lock()
		tr.n.cut[key] = true
		tr.n.mu.Unlock()
	}
	return resp, err
}

func proxyAnswer(req *http.Request, status int, contentType, body string, h http.Header) *http.Response {
	if h == nil {
		h = http.Header{}
	}
	h.Set("Content-Type", contentType)
	return &http.Response{
		StatusCode: status, Status: strconv.Itoa(status) + " " + http.StatusText(status),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: req,
	}
}

// doMaybeTwice calls Do, or, one time in six, two Do calls at once on the
// same intent (a double tap), which must agree.
func (run *randomRun) doMaybeTwice(g *generation, in *idem.Intent, r *rand.Rand) (*idem.Response, error) {
	if r.IntN(6) != 0 {
		return g.client.Do(g.ctx, in)
	}
	run.doubleTaps.Add(1)
	var (
		wg          sync.WaitGroup
		resps       [2]*idem.Response
		errs        [2]error
		doubleEarly = r.IntN(2) == 0
	)
	for i := range 2 {
		wg.Go(func() {
			if i == 1 && !doubleEarly {
				// The second tap a moment later, while the first may be
				// waiting or on the wire: a real overlap window, not a
				// synchronisation.
				time.Sleep(100 * time.Microsecond)
			}
			resps[i], errs[i] = g.client.Do(g.ctx, in)
		})
	}
	wg.Wait()
	if errs[0] == nil && errs[1] == nil {
		assert.Equal(run.t, resps[0].StatusCode, resps[1].StatusCode, "double tap on %s", in.Key())
		assert.Equal(run.t, string(resps[0].Body), string(resps[1].Body), "double tap on %s", in.Key())
	}
	if errs[0] == nil || isAPIError(errs[0]) && resps[0] != nil {
		return resps[0], errs[0]
	}
	return resps[1], errs[1]
}

// budgetRanOut reports a call ended by its retry budget: attempts, time,
// the context's deadline, the Retry-After cap or the client-wide budget.
func budgetRanOut(err error) bool {
	var re *idem.RetryError
	if !errors.As(err, &re) {
		return false
	}
	switch re.Reason {
	case idem.StopAttempts, idem.StopElapsed, idem.StopDeadline, idem.StopRetryAfterCap, idem.StopRetryBudget:
		return true
	}
	return false
}

func isAPIError(err error) bool {
	var apiErr *idem.APIError
	return errors.As(err, &apiErr)
}

// serverAnswer is what the server holds for a key, seen through its lookup
// and a replay of the intent's request.
type serverAnswer struct {
	lookupStatus int
	lookupBody   []byte
	replayStatus int
	replayBody   []byte
	replayed     bool
}

// askServer looks the key up and, when replay is set, resends the intent's
// request with its key. Only resend a key whose record is COMPLETED: for any
// other, the resend would do the work.
func (run *randomRun) askServer(hc *http.Client, it *rIntent, replay bool) serverAnswer {
	t := run.t
	var a serverAnswer
	resp, err := hc.Get(lookupOf(run.srv.URL+"/payments", it.key))
	require.NoError(t, err)
	a.lookupBody, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	a.lookupStatus = resp.StatusCode
	if !replay {
		return a
	}

	req, err := http.NewRequest(it.req.Method, it.req.URL, bytes.NewReader(it.req.Body))
	require.NoError(t, err)
	req.Header = it.req.Header.Clone()
	req.Header.Set("Idempotency-Key", it.key)
	resp, err = hc.Do(req)
	require.NoError(t, err)
	a.replayBody, err = io.ReadAll(resp.Body)
	require.NoError(t, err)
	resp.Body.Close()
	a.replayStatus = resp.StatusCode
	a.replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	return a
}

// check verifies the invariants of the issue once every worker is done.
func (run *randomRun) check(intents []*rIntent, wall time.Duration) {
	t := run.t
	g := run.current()
	ctx := context.Background()
	stats := run.srv.Stats()

	// The unresolved intents, settled by reconciling once every attempt's
	// lease and the reconcile delay are over, and without faults.
	run.srv.ClearFaults()
	run.net.mu.Lock()
	clear(run.net.faults)
	run.net.mu.Unlock()
	run.clock.Advance(reconcileDelay + time.Minute)
	run.net.deliver(true) // everything held in transit has arrived by now
	var (
		succeeded, declined, void, unresolved, reconciledPaid, reconciledVoid, reconciledResumed int
	)
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	for _, it := range intents {
		in, err := g.client.Load(ctx, it.key)
		require.NoError(t, err, "intent %d", it.i)
		state := in.State()
		if !state.Resolved() {
			unresolved++
			assert.True(t, it.budgetOut || it.leftUnknown || it.redirected, "intent %d (%s) is unresolved but its budget did not run out; last error: %v", it.i, it.key, it.lastErr)
			if it.final != nil {
				t.Errorf("intent %d: the app was given a final answer (%d) but the device did not keep it", it.i, it.final.StatusCode)
			}
			resp, err := g.client.Reconcile(ctx, in)
			if errors.Is(err, idem.ErrOutcomeUnknown) {
				// The server cannot settle it by lookup (its record is still
				// IN_PROGRESS, a dead worker's): resuming with the same key
				// is safe and makes the server recover it.
				reconciledResumed++
				resp, err = g.client.Do(ctx, in)
				if isAPIError(err) {
					err = nil
				}
			}
			require.NoError(t, err, "reconcile intent %d", it.i)
			state = in.State()
			switch state {
			case persist.StateSucceeded:
				reconciledPaid++
				assert.False(t, it.declined, "intent %d: a declined card reconciled as paid", it.i)
				it.final = resp
			case persist.StateVoid:
				reconciledVoid++
			case persist.StateFailed:
				assert.True(t, it.declined, "intent %d: resumed to a failure", it.i)
				it.final = resp
			default:
				t.Errorf("intent %d: reconciled to %s", it.i, state)
			}
		}
		a := run.askServer(hc, it, state == persist.StateSucceeded || state == persist.StateFailed)
		switch state {
		case persist.StateSucceeded:
			succeeded++
			require.NotNil(t, in.Response(), "intent %d", it.i)
			assert.False(t, it.declined, "intent %d: a declined card succeeded", it.i)
			assert.Equal(t, http.StatusOK, a.lookupStatus, "intent %d: succeeded but the server has no payment for %s", it.i, it.key)
			if it.final != nil {
				if it.final.StatusCode == http.StatusCreated {
					// The answer the app was given is the answer the server
					// stored for the key, byte for byte.
					assert.Equal(t, http.StatusCreated, a.replayStatus, "intent %d", it.i)
					assert.True(t, a.replayed, "intent %d: the resend was not a replay", it.i)
					assert.Equal(t, string(a.replayBody), string(it.final.Body), "intent %d", it.i)
					assert.Equal(t, string(in.Response().Body), string(it.final.Body), "intent %d: device and app differ", it.i)
				}
				assert.Equal(t, paymentID(t, a.lookupBody), paymentID(t, it.final.Body), "intent %d", it.i)
			}
		case persist.StateFailed:
			declined++
			assert.True(t, it.declined, "intent %d failed: %d %s", it.i, in.Response().StatusCode, in.Response().Body)
			assert.Equal(t, http.StatusPaymentRequired, in.Response().StatusCode, "intent %d", it.i)
			assert.Equal(t, http.StatusNotFound, a.lookupStatus, "intent %d: declined but a payment exists", it.i)
			assert.Equal(t, http.StatusPaymentRequired, a.replayStatus, "intent %d", it.i)
			assert.True(t, a.replayed, "intent %d: the decline was not stored", it.i)
			if it.final != nil {
				assert.Equal(t, string(a.replayBody), string(it.final.Body), "intent %d", it.i)
			}
		case persist.StateVoid:
			void++
			assert.Equal(t, http.StatusNotFound, a.lookupStatus, "intent %d: void but the server has payment %s", it.i, a.lookupBody)
		default:
			t.Errorf("intent %d ended %s", it.i, state)
		}
	}

	// The server's totals are the sum of the intents' outcomes. (stats is
	// from before the checks, whose resumes may have paid and whose
	// replays are counted as requests.)
	after := run.srv.Stats()
	assert.Equal(t, succeeded, after.Payments, "payments at the server")
	assert.GreaterOrEqual(t, after.ProviderCharges, succeeded, "provider charges")
	assert.Equal(t, succeeded, after.ProviderCharges, "provider charges: one per payment, none orphaned")
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	resp, err := hc.Get(run.srv.URL + "/payments")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(body, &list))
	assert.Len(t, list.Data, succeeded, "payments listed")

	store := "memory"
	if run.useFile {
		store = "file"
	}
	t.Logf("seed %d, store %s: %d intents in %s: %d succeeded, %d declined, %d void, %d unresolved after the app's calls (%d reconciled paid, %d reconciled void, %d of them resumed after an unsettled lookup); %d orphan charges",
		run.seed, store, len(intents), wall.Round(time.Millisecond), succeeded, declined, void, unresolved, reconciledPaid, reconciledVoid, reconciledResumed, after.ProviderCharges-succeeded)
	t.Logf("app: %d calls ended by a redirect to a login page, %d reconciles that concluded during the run, %d payments made again after a void intent, %d changed carts, %d refused while an intent was unresolved, %d clock jumps (device clock now %s off)",
		run.redirects.Load(), run.reconciles.Load(), run.paidAgain.Load(), run.cartChanges.Load(), run.refusedChanges.Load(), run.jumps.Load(), run.device.skewed())
	t.Logf("server, before the checks: %d requests, %d executions, %d payments, %d provider charges, %d records, %d in progress",
		stats.Requests, stats.Executions, stats.Payments, stats.ProviderCharges, stats.Records, stats.InProgress)
	t.Logf("client: %d Do calls, %d attempts, %d retries, %d double taps, %d restarts, %.1fh of manual clock",
		run.calls.Load(), run.attempts.Load(), run.retries.Load(), run.doubleTaps.Load(), run.restarts.Load(), run.clock.Now().Sub(relEpoch).Hours())
	run.faultsMu.Lock()
	names := make([]string, 0, len(run.faults))
	for k := range run.faults {
		names = append(names, k)
	}
	sort.Strings(names)
	var sb strings.Builder
	for _, k := range names {
		fmt.Fprintf(&sb, " %s=%d", k, run.faults[k])
	}
	codes := make([]int, 0, len(run.statuses))
	for c := range run.statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var sc strings.Builder
	for _, c := range codes {
		fmt.Fprintf(&sc, " %d=%d", c, run.statuses[c])
	}
	run.faultsMu.Unlock()
	t.Logf("faults injected (counts):%s", sb.String())
	t.Logf("attempts by status (0: no answer):%s", sc.String())
}

// paymentID returns the id of a payment body.
func paymentID(t testing.TB, body []byte) string {
	t.Helper()
	var p struct {
		ID string `json:"id"`
	}
	require.NoError(t, json.Unmarshal(body, &p), "body %s", body)
	require.NotEmpty(t, p.ID, "body %s", body)
	return p.ID
}

// TestReconcileAfterCrashAfterProviderFindsTheCharge: the server charged
// the provider and died before recording anything; the client's budget ran
// out before any attempt took the record over. Reconciling must not call
// the intent void while the provider holds its charge, or the app pays
// again under a new key; resuming it settles it with that one charge.
func TestReconcileAfterCrashAfterProviderFindsTheCharge(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(relEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk})
	t.Cleanup(srv.Close)
	c, err := idem.NewWith(idem.WithLookup(contractLookup), idem.WithHTTPClient(srv.Client()), idem.WithClock(clk), idem.WithRetryPolicy(idem.RetryPolicy{MaxAttempts: 1}))
	require.NoError(t, err)
	req, err := idem.JSONRequest(http.MethodPost, srv.URL+"/payments", map[string]any{"amount": 1500, "currency": "AZN", "customer": "cus_1"})
	require.NoError(t, err)
	ctx := context.Background()
	in, err := c.Intent(ctx, "checkout:orphan", req)
	require.NoError(t, err)
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: in.Key()}))

	_, err = c.Do(ctx, in)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
	require.Equal(t, 1, srv.Stats().ProviderCharges, "the provider charged")

	clk.Advance(reconcileDelay + time.Minute) // past the lease and the reconcile delay
	_, err = c.Reconcile(ctx, in)
	if err == nil {
		require.NotEqual(t, persist.StateVoid, in.State(), "the provider holds a charge for this intent, so it is not void")
	} else {
		require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "unsettled, not void")
		assert.False(t, in.State().Resolved())
		// Resuming with the same key makes the server recover the dead
		// worker's record: it finds the charge and records the payment.
		resp, err := c.Do(ctx, in)
		require.NoError(t, err)
		assert.Equal(t, http.StatusCreated, resp.StatusCode)
	}
	assert.Equal(t, persist.StateSucceeded, in.State())
	stats := srv.Stats()
	assert.Equal(t, 1, stats.Payments)
	assert.Equal(t, 1, stats.ProviderCharges, "one user action, one charge")
}

// TestTakeoverThatFailsKeepsTheProviderCharge: a worker charged the
// provider and died; the request that takes its record over fails (a 500,
// or its client goes away) before recording anything. The record must keep
// its stable id, so that the next request asks the provider again instead
// of charging under a new id.
func TestTakeoverThatFailsKeepsTheProviderCharge(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(relEpoch)
	srv := fakeserver.NewServer(&fakeserver.Options{Clock: clk, Lease: 5 * time.Second})
	t.Cleanup(srv.Close)
	tr := &http.Transport{DisableKeepAlives: true} // no transport-level retry
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tr}
	const key = "takeover-then-error"
	post := func() (int, error) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := hc.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}

	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: key}))
	_, err := post()
	require.Error(t, err, "the worker died after charging")
	require.Equal(t, 1, srv.Stats().ProviderCharges)

	clk.Advance(6 * time.Second) // the dead worker's lease is over
	require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: key}))
	status, err := post()
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, status, "the takeover failed")

	status, err = post()
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, status)
	stats := srv.Stats()
	assert.Equal(t, 1, stats.Payments)
	assert.Equal(t, 1, stats.ProviderCharges, "one payment, charged twice at the provider")
}
