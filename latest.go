package idem

import (
	"sync"

	"github.com/idemkit/idem/persist"
)

// latest remembers the version of each unresolved intent that this Client
// saved last, so that Do can tell an Intent that holds it from a stale one
// without reading the store. Resolved intents are dropped: they never
// change, so it holds only unresolved ones.
type latest struct {
	mu sync.Mutex
	m  map[string]*persist.Record
}

func (l *latest) saved(rec *persist.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rec.State.Resolved() {
		delete(l.m, rec.Key)
		return
	}
	if l.m == nil {
		l.m = make(map[string]*persist.Record)
	}
	l.m[rec.Key] = rec
}

func (l *latest) forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, key)
}

func (l *latest) is(rec *persist.Record) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.m[rec.Key] == rec
}
