package fault

import (
	"math/rand/v2"
	"sync"
)

// Predicate picks the ops a rule strikes. A predicate may keep state or
// draw from a source. Whoever shares it across goroutines makes it safe.
type Predicate func(Op) bool

// Any matches every op.
func Any() Predicate { return func(Op) bool { return true } }

// Key matches ops with Idempotency-Key k. A quoted key and its bare form
// match alike.
func Key(k string) Predicate {
	k = parseKey(k)
	return func(op Op) bool { return op.Key == k }
}

// Caller matches ops of caller c, as the site names its callers.
func Caller(c string) Predicate { return func(op Op) bool { return op.Caller == c } }

// Path matches ops on exactly this URL path, such as "/payments".
func Path(p string) Predicate { return func(op Op) bool { return op.Path == p } }

// Method matches ops of method m, such as "POST".
func Method(m string) Predicate { return func(op Op) bool { return op.Method == m } }

// Query matches ops whose URL has the query parameter name.
func Query(name string) Predicate { return func(op Op) bool { return op.Query.Has(name) } }

// Attempt matches the op whose Attempt is n.
func Attempt(n int) Predicate { return func(op Op) bool { return op.Attempt == n } }

// And matches ops every p matches. It asks them in order and stops at the
// first miss, as && does. So a chance after a miss draws nothing.
func And(ps ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range ps {
			if !p(op) {
				return false
			}
		}
		return true
	}
}

// Or matches ops any p matches. It asks them in order and stops at the
// first match, as || does.
func Or(ps ...Predicate) Predicate {
	return func(op Op) bool {
		for _, p := range ps {
			if p(op) {
				return true
			}
		}
		return false
	}
}

// Not matches the ops p does not.
func Not(p Predicate) Predicate { return func(op Op) bool { return !p(op) } }

// Source is a source of random numbers in [0, 1).
// A *rand.Rand of math/rand/v2 is one.
type Source interface{ Float64() float64 }

// Chance matches an op with probability p, drawn from src. It draws once
// per op asked, unless p is 0 or less. So p changes no later draw. A
// seeded src replays the same choices, in the same order of ops.
func Chance(p float64, src Source) Predicate {
	return func(Op) bool { return p > 0 && src.Float64() < p }
}

// Seeded returns a source seeded with seed, safe for concurrent use.
// The same seed gives the same numbers.
func Seeded(seed uint64) Source {
	return &lockedSource{r: rand.New(rand.NewPCG(seed, seed))}
}

type lockedSource struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (s *lockedSource) Float64() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.Float64()
}
