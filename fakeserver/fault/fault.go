// Package fault describes faults to inject into HTTP traffic. A fault is
// a rule: a [Predicate] says which requests it strikes, an [Effect] says
// what happens to them. An [Injector] holds the rules and answers, for each
// request, the effects to apply.
//
// The fake server's admin faults run on it, and so do the repository's
// fault proxy and simulation. To fault a fake server, give a [Rule] to its
// Handler.InjectRule, or post a fault as JSON to /_fake/faults.
// docs/FAKESERVER.md lists the effects a fake server applies.
//
// The package only decides. Each site applies the effects it knows, at its
// own points, and ignores the rest. A site may name effects of its own
// with a [Kind] of its own. A [List] keeps rules that come and go.
package fault

import (
	"errors"
	"net/http"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// Op is one request, as a predicate sees it.
type Op struct {
	Method string
	Path   string
	Query  url.Values
	// Key is the Idempotency-Key, unquoted when it parses.
	Key string
	// Caller is whom the site scopes keys to. Each site says how it names
	// one. OpOf leaves it empty.
	Caller string
	// Attempt counts ops at the site, from 1. Each site says what it counts.
	Attempt int
}

// OpOf returns r's Op. Its Attempt is 0: the site counts attempts.
func OpOf(r *http.Request) Op {
	return Op{Method: r.Method, Path: r.URL.Path, Query: r.URL.Query(), Key: parseKey(r.Header.Get("Idempotency-Key"))}
}

// parseKey returns k parsed when it is valid, and k unchanged otherwise.
// So a quoted key and its bare form match alike.
func parseKey(k string) string {
	if p, err := idempotency.ParseKey(k); err == nil {
		return p
	}
	return k
}

// Kind names an effect. The fake server's kinds are its admin JSON names.
type Kind string

// The effects. Delay, Hold and SlowAnswer wait Effect.Delay. The cuts
// forward Effect.Bytes first.
const (
	// LoseAnswer does the work and loses the answer.
	// The connection closes with no answer.
	LoseAnswer Kind = "drop_response"
	// Delay holds the work before it commits.
	Delay Kind = "delay"
	// CrashAfterInsert kills the worker once its record is in.
	// The record stays in progress, as a dead worker leaves it.
	CrashAfterInsert Kind = "crash_after_insert"
	// CrashAfterProvider kills the worker once the provider charged.
	// Nothing is recorded.
	CrashAfterProvider Kind = "crash_after_provider"
	// Error fails the work before its effect commits: 500, nothing done.
	Error Kind = "error"
	// Status answers in the server's stead, as a proxy in front would.
	// It sends Effect.Status, RetryAfter, Header and Body.
	// The request goes no further.
	Status Kind = "status"
	// Reset closes the connection before the request is read.
	Reset Kind = "reset"
	// LoseRequest loses the request on its way. No answer ever comes.
	LoseRequest Kind = "lose_request"
	// Hold delivers the request late.
	Hold Kind = "hold"
	// SlowAnswer delivers the answer late.
	SlowAnswer Kind = "slow_answer"
	// CutRequest closes the connection inside the request.
	// The server never reads all of it.
	CutRequest Kind = "cut_request"
	// CutAnswer closes the connection inside the answer's body.
	// The whole header block passes first.
	// A negative Bytes cuts the body in half where its length is known.
	CutAnswer Kind = "cut_answer"
	// Duplicate sends the request a second time, Delay after the first.
	// The copy's answer goes nowhere.
	Duplicate Kind = "duplicate"
)

// Effect is what a fault does to one request. Only the fields its Kind
// names are read. Many ops may share one effect: a site copies what it
// changes.
type Effect struct {
	Kind  Kind
	Delay time.Duration
	// Status, RetryAfter, Header and Body are the answer of Status.
	Status     int
	RetryAfter string
	Header     http.Header
	Body       []byte
	// Bytes is how much of the request or body a cut forwards.
	Bytes int
}

// Effects are the effects of one op, at most one of each Kind.
type Effects []Effect

// Has reports whether es holds an effect of kind k.
func (es Effects) Has(k Kind) bool {
	_, ok := es.Get(k)
	return ok
}

// Get returns the effect of kind k, if es holds one.
func (es Effects) Get(k Kind) (Effect, bool) {
	for _, e := range es {
		if e.Kind == k {
			return e, true
		}
	}
	return Effect{}, false
}

// Injector decides the faults of each op. The injectors of this package
// are safe for concurrent use when their predicates are.
type Injector interface {
	// Inject returns the effects to apply to op, or none.
	Inject(op Op) Effects
}

// Rule applies one effect to the ops its predicate matches.
// Use it by pointer: it counts the ops it struck.
type Rule struct {
	// When picks the ops. Nil matches every op.
	When Predicate
	// Effect is what the rule does.
	Effect Effect
	// Draw, if set, makes the effect per op instead.
	// It runs right after When matched, so draws keep their order.
	Draw func(Op) Effect
	// Times is how many ops the rule strikes. Zero or less means no limit.
	Times int

	struck atomic.Int64
}

// Inject returns the rule's effect if the rule matches op and is not
// spent.
func (r *Rule) Inject(op Op) Effects {
	if r.Spent() || r.When != nil && !r.When(op) {
		return nil
	}
	if r.Times > 0 && r.struck.Add(1) > int64(r.Times) {
		return nil // another op took the last strike meanwhile
	}
	if r.Draw != nil {
		return Effects{r.Draw(op)}
	}
	return Effects{r.Effect}
}

// Spent reports whether the rule struck its Times ops.
func (r *Rule) Spent() bool { return r.Times > 0 && r.struck.Load() >= int64(r.Times) }

// Left returns how many more ops the rule strikes, or -1 without limit.
func (r *Rule) Left() int {
	if r.Times <= 0 {
		return -1 // no limit, as Inject and Spent read it
	}
	return max(r.Times-int(r.struck.Load()), 0)
}

// First asks each injector in turn. The first that has effects answers.
// The ones after it are not asked, so their chances draw nothing.
func First(injs ...Injector) Injector { return first(injs) }

type first []Injector

func (f first) Inject(op Op) Effects {
	for _, inj := range f {
		if es := inj.Inject(op); len(es) > 0 {
			return es
		}
	}
	return nil
}

// All asks every injector in order and keeps the first effect of each
// kind. Every injector is asked, so each draws as it would alone.
func All(injs ...Injector) Injector { return all(injs) }

type all []Injector

func (a all) Inject(op Op) Effects {
	var es Effects
	for _, inj := range a {
		for _, e := range inj.Inject(op) {
			if !es.Has(e.Kind) {
				es = append(es, e)
			}
		}
	}
	return es
}

// ErrFull is List.Add's error when the list holds its Max rules.
var ErrFull = errors.New("fault: the list is full")

// List is a changing list of rules, as the fake server's admin endpoint
// keeps them. Each op gets at most one effect of each kind: the earliest
// rule's. A rule whose kind is taken is not asked, and does not count the
// op. A rule that draws its effect is always asked. Spent rules leave the
// list. A List is safe for concurrent use.
type List struct {
	// Max bounds the rules held. Zero means no bound.
	Max int
	// Final lists the kinds that end an op, as a proxy's answer does.
	// Their rules are asked first, and the first that strikes ends the
	// asking. So no other rule spends a strike on an op it never reaches.
	// A rule that draws its effect is asked with the others.
	Final []Kind

	mu    sync.Mutex
	rules []*Rule
}

// Add appends r, or returns ErrFull.
func (l *List) Add(r *Rule) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.Max > 0 && len(l.rules) >= l.Max {
		return ErrFull
	}
	l.rules = append(l.rules, r)
	return nil
}

// Clear removes every rule.
func (l *List) Clear() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.rules = nil
}

// Len returns how many rules the list holds.
func (l *List) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rules)
}

// Inject returns the effects of the rules that match op.
func (l *List) Inject(op Op) Effects {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.rules {
		if r.Draw == nil && slices.Contains(l.Final, r.Effect.Kind) {
			if es := r.Inject(op); len(es) > 0 {
				l.dropSpent()
				return es
			}
		}
	}
	var es Effects
	for _, r := range l.rules {
		if r.Draw == nil && slices.Contains(l.Final, r.Effect.Kind) {
			continue // asked above
		}
		if r.Draw != nil || !es.Has(r.Effect.Kind) {
			for _, e := range r.Inject(op) {
				if !es.Has(e.Kind) {
					es = append(es, e)
				}
			}
		}
	}
	l.dropSpent()
	return es
}

// dropSpent removes the spent rules. l.mu is held.
func (l *List) dropSpent() {
	kept := l.rules[:0]
	for _, r := range l.rules {
		if !r.Spent() {
			kept = append(kept, r)
		}
	}
	clear(l.rules[len(kept):])
	l.rules = kept
}
