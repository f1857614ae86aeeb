package persist

import "sync"

// groupSync lets concurrent callers share one run of a sync. A caller
// returns once a run that started after its call has finished. It gets
// that run's error. Callers that arrive while a run is in progress wait
// for it to end. Then they share the next run. So a burst of N callers
// costs two runs, not N.
type groupSync struct {
	mu        sync.Mutex
	cond      *sync.Cond
	running   bool
	started   uint64 // runs started
	completed uint64 // runs finished
	err       error  // of the last run finished
	waiting   int    // callers waiting for a run to end, for the tests
}

func newGroupSync() *groupSync {
	g := &groupSync{}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// sync returns once a run of do that started after sync was called has
// finished. It returns the error of the last run finished.
func (g *groupSync) sync(do func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	target := g.started + 1
	for g.completed < target {
		if g.running {
			g.waiting++
			g.cond.Wait()
			g.waiting--
			continue
		}
		g.running = true
		g.started++
		gen := g.started
		g.mu.Unlock()
		err := do()
		g.mu.Lock()
		g.running = false
		g.completed, g.err = gen, err
		g.cond.Broadcast()
	}
	return g.err
}
