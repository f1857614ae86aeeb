package persist

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestGroupSync: concurrent callers share a run of the sync that
// started after their call.
func TestGroupSync(t *testing.T) {
	for _, c := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"a call waits for a run that started after it", groupSyncWaitsForALaterRun},
		{"many callers share runs", groupSyncShares},
	} {
		t.Run(c.name, c.run)
	}
}

// groupSyncWaitsForALaterRun calls sync while a run is in progress:
// the call must not return on that run, which started before it, but only
// once a run that started after it has finished, and with that run's error.
func groupSyncWaitsForALaterRun(t *testing.T) {
	g := newGroupSync()
	var runs atomic.Int32
	started := make(chan int32, 2)
	release := []chan error{make(chan error), make(chan error)}
	do := func() error {
		n := runs.Add(1)
		started <- n
		return <-release[n-1]
	}

	doneA := make(chan error, 1)
	go func() { doneA <- g.sync(do) }()
	select {
	case n := <-started:
		if n != 1 {
			t.Fatalf("first run is #%d", n)
		}
	case err := <-doneA:
		t.Fatalf("the first caller returned (%v) without a run", err)
	}
	doneB := make(chan error, 1)
	go func() { doneB <- g.sync(do) }()
	for {
		g.mu.Lock()
		w := g.waiting
		g.mu.Unlock()
		if w == 1 {
			break
		}
		runtime.Gosched()
	}

	release[0] <- nil
	if err := <-doneA; err != nil {
		t.Fatalf("first caller: %v", err)
	}
	select {
	case n := <-started:
		if n != 2 {
			t.Fatalf("run #%d", n)
		}
	case err := <-doneB:
		t.Fatalf("the second caller returned (%v) on a run that started before its call", err)
	}
	failed := errors.New("sync failed")
	release[1] <- failed
	if err := <-doneB; !errors.Is(err, failed) {
		t.Fatalf("second caller: %v, want the error of its run", err)
	}
}

// groupSyncShares runs many callers at once: every call returns, and
// they share runs.
func groupSyncShares(t *testing.T) {
	g := newGroupSync()
	var runs atomic.Int32
	gate := make(chan struct{})
	do := func() error {
		if runs.Add(1) == 1 {
			<-gate // hold the first run until every caller has arrived
		}
		return nil
	}
	const callers = 50
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.sync(do) })
	for runs.Load() == 0 {
		runtime.Gosched()
	}
	for range callers {
		wg.Go(func() {
			if err := g.sync(do); err != nil {
				t.Error(err)
			}
		})
	}
	for {
		g.mu.Lock()
		w := g.waiting
		g.mu.Unlock()
		if w == callers {
			break
		}
		runtime.Gosched()
	}
	close(gate)
	wg.Wait()
	if n := runs.Load(); n != 2 {
		t.Errorf("%d callers arriving during a run took %d runs in all, want 2", callers, n)
	}
}
