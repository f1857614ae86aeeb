package fault_test

import (
	"math/rand/v2"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver/fault"
)

func op(method, target, key string) fault.Op {
	r := httptest.NewRequest(method, target, nil)
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return fault.OpOf(r)
}

func TestPredicates(t *testing.T) {
	post := op("POST", "/payments", `"order-1"`)
	lookup := op("GET", "/payments?idempotency_key=order-1", "")
	t.Run("a key matches quoted or bare", func(t *testing.T) {
		assert.True(t, fault.Key("order-1")(post))
		assert.True(t, fault.Key(`"order-1"`)(post))
		assert.False(t, fault.Key("order-2")(post))
		assert.False(t, fault.Key("order-1")(lookup), "a query is not the key")
	})
	t.Run("path, method and query match exactly", func(t *testing.T) {
		assert.True(t, fault.Path("/payments")(post))
		assert.False(t, fault.Path("/payments/")(post))
		assert.True(t, fault.Method("POST")(post))
		assert.False(t, fault.Method("POST")(lookup))
		assert.True(t, fault.Query("idempotency_key")(lookup))
		assert.False(t, fault.Query("idempotency_key")(post))
	})
	t.Run("caller matches the site's caller", func(t *testing.T) {
		assert.True(t, fault.Caller("acme")(fault.Op{Caller: "acme"}))
		assert.False(t, fault.Caller("acme")(fault.Op{Caller: "globex"}))
	})
	t.Run("attempt matches the site's count", func(t *testing.T) {
		assert.True(t, fault.Attempt(2)(fault.Op{Attempt: 2}))
		assert.False(t, fault.Attempt(2)(fault.Op{Attempt: 3}))
	})
	t.Run("and, or and not combine in order", func(t *testing.T) {
		calls := 0
		count := func(fault.Op) bool { calls++; return true }
		assert.False(t, fault.And(fault.Method("GET"), count)(post))
		assert.Equal(t, 0, calls, "And stops at the first miss")
		assert.True(t, fault.Or(fault.Method("POST"), count)(post))
		assert.Equal(t, 0, calls, "Or stops at the first match")
		assert.True(t, fault.And(fault.Method("POST"), count)(post))
		assert.Equal(t, 1, calls)
		assert.True(t, fault.Not(fault.Method("GET"))(post))
		assert.True(t, fault.And()(post), "no predicate is every op")
		assert.False(t, fault.Or()(post))
		assert.True(t, fault.Any()(post))
	})
}

func TestChance(t *testing.T) {
	t.Run("a seed replays its choices", func(t *testing.T) {
		draw := func(src fault.Source) []bool {
			p := fault.Chance(0.3, src)
			var out []bool
			for range 100 {
				out = append(out, p(fault.Op{}))
			}
			return out
		}
		a, b := draw(fault.Seeded(7)), draw(fault.Seeded(7))
		assert.Equal(t, a, b)
		assert.NotEqual(t, a, draw(fault.Seeded(8)))
		hits := 0
		for _, x := range a {
			if x {
				hits++
			}
		}
		assert.InDelta(t, 30, hits, 15)
	})
	t.Run("it draws once per op whatever the chance, and never at zero", func(t *testing.T) {
		// The same stream, read directly: each Chance above zero draws once.
		src, mirror := rand.New(rand.NewPCG(1, 2)), rand.New(rand.NewPCG(1, 2))
		assert.False(t, fault.Chance(0, src)(fault.Op{}))
		assert.True(t, fault.Chance(1, src)(fault.Op{}))
		mirror.Float64()
		got := fault.Chance(0.5, src)(fault.Op{})
		assert.Equal(t, mirror.Float64() < 0.5, got)
		assert.Equal(t, mirror.Float64(), src.Float64(), "the streams are in step")
	})
	t.Run("a seeded source is safe for concurrent use", func(t *testing.T) {
		p := fault.Chance(0.5, fault.Seeded(1))
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 1000 {
					p(fault.Op{})
				}
			}()
		}
		wg.Wait()
	})
}

func TestRule(t *testing.T) {
	post := op("POST", "/payments", "k")
	t.Run("it strikes its Times ops, then is spent", func(t *testing.T) {
		r := &fault.Rule{When: fault.Method("POST"), Effect: fault.Effect{Kind: fault.Error}, Times: 2}
		assert.Empty(t, r.Inject(op("GET", "/payments", "k")), "a miss is not counted")
		assert.Equal(t, 2, r.Left())
		assert.True(t, r.Inject(post).Has(fault.Error))
		assert.True(t, r.Inject(post).Has(fault.Error))
		assert.True(t, r.Spent())
		assert.Empty(t, r.Inject(post))
		assert.Equal(t, 0, r.Left())
	})
	t.Run("without Times it never ends", func(t *testing.T) {
		r := &fault.Rule{Effect: fault.Effect{Kind: fault.Reset}}
		for range 10 {
			assert.True(t, r.Inject(post).Has(fault.Reset))
		}
		assert.Equal(t, -1, r.Left())
	})
	t.Run("concurrent ops take exactly Times strikes", func(t *testing.T) {
		r := &fault.Rule{Effect: fault.Effect{Kind: fault.Reset}, Times: 50}
		var mu sync.Mutex
		struck := 0
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 100 {
					if len(r.Inject(post)) > 0 {
						mu.Lock()
						struck++
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, 50, struck)
	})
	t.Run("a drawn effect is made after the match", func(t *testing.T) {
		n := 0
		r := &fault.Rule{When: fault.Method("POST"), Draw: func(op fault.Op) fault.Effect {
			n++
			return fault.Effect{Kind: fault.Delay, Delay: time.Duration(n) * time.Second}
		}}
		assert.Empty(t, r.Inject(op("GET", "/", "")))
		assert.Equal(t, 0, n)
		e, ok := r.Inject(post).Get(fault.Delay)
		require.True(t, ok)
		assert.Equal(t, time.Second, e.Delay)
	})
	t.Run("a negative Times strikes without limit, and Left says so", func(t *testing.T) {
		r := &fault.Rule{Times: -1, Effect: fault.Effect{Kind: fault.LoseAnswer}}
		struck := 0
		for range 5 {
			if len(r.Inject(fault.Op{Method: "POST", Path: "/payments"})) > 0 {
				struck++
			}
		}
		require.Equal(t, 5, struck) // it strikes without limit
		require.True(t, r.Left() != 0 || struck == 0,
			"Left() = %d (no more strikes) on a rule that struck %d ops and strikes on", r.Left(), struck)
	})
}

func TestFirst(t *testing.T) {
	asked := 0
	counting := &fault.Rule{When: func(fault.Op) bool { asked++; return true }, Effect: fault.Effect{Kind: fault.Error}}
	inj := fault.First(
		&fault.Rule{When: fault.Method("GET"), Effect: fault.Effect{Kind: fault.Reset}},
		counting,
	)
	assert.True(t, inj.Inject(fault.Op{Method: "GET"}).Has(fault.Reset))
	assert.Equal(t, 0, asked, "the injectors after the first answer are not asked")
	es := inj.Inject(fault.Op{Method: "POST"})
	assert.Equal(t, fault.Effects{{Kind: fault.Error}}, es)
	assert.Equal(t, 1, asked)
}

func TestAll(t *testing.T) {
	asked := 0
	counting := &fault.Rule{When: func(fault.Op) bool { asked++; return true }, Effect: fault.Effect{Kind: fault.Reset, Bytes: 2}}
	inj := fault.All(
		&fault.Rule{Effect: fault.Effect{Kind: fault.Reset, Bytes: 1}},
		counting,
		&fault.Rule{Effect: fault.Effect{Kind: fault.Error}},
	)
	es := inj.Inject(fault.Op{})
	assert.Equal(t, fault.Effects{{Kind: fault.Reset, Bytes: 1}, {Kind: fault.Error}}, es, "the first effect of a kind wins")
	assert.Equal(t, 1, asked, "every injector is asked")
}

func TestList(t *testing.T) {
	post := op("POST", "/payments", "k")
	t.Run("the earliest rule of a kind wins and the later is not counted", func(t *testing.T) {
		var l fault.List
		require.NoError(t, l.Add(&fault.Rule{Effect: fault.Effect{Kind: fault.Delay, Delay: time.Second}, Times: 1}))
		later := &fault.Rule{Effect: fault.Effect{Kind: fault.Delay, Delay: time.Minute}, Times: 1}
		require.NoError(t, l.Add(later))
		require.NoError(t, l.Add(&fault.Rule{Effect: fault.Effect{Kind: fault.Error}, Times: 1}))
		es := l.Inject(post)
		assert.Len(t, es, 2)
		e, _ := es.Get(fault.Delay)
		assert.Equal(t, time.Second, e.Delay)
		assert.True(t, es.Has(fault.Error))
		assert.Equal(t, 1, later.Left(), "a rule whose kind was taken keeps its strike")
		assert.Equal(t, 1, l.Len(), "spent rules leave the list")
		e, _ = l.Inject(post).Get(fault.Delay)
		assert.Equal(t, time.Minute, e.Delay)
		assert.Empty(t, l.Inject(post))
		assert.Equal(t, 0, l.Len())
	})
	t.Run("a drawn effect of a kind taken is dropped", func(t *testing.T) {
		var l fault.List
		require.NoError(t, l.Add(&fault.Rule{Effect: fault.Effect{Kind: fault.Error}}))
		require.NoError(t, l.Add(&fault.Rule{Draw: func(fault.Op) fault.Effect { return fault.Effect{Kind: fault.Error, Status: 1} }}))
		assert.Equal(t, fault.Effects{{Kind: fault.Error}}, l.Inject(post))
	})
	t.Run("a final kind that strikes ends the asking", func(t *testing.T) {
		l := fault.List{Final: []fault.Kind{fault.Status}}
		lose := &fault.Rule{When: fault.Key("k"), Effect: fault.Effect{Kind: fault.LoseAnswer}, Times: 1}
		require.NoError(t, l.Add(lose))
		require.NoError(t, l.Add(&fault.Rule{Effect: fault.Effect{Kind: fault.Status, Status: 503}, Times: 1}))
		assert.Equal(t, fault.Effects{{Kind: fault.Status, Status: 503}}, l.Inject(post))
		assert.Equal(t, 1, lose.Left(), "the op never reached the rule after the answer")
		assert.Equal(t, fault.Effects{{Kind: fault.LoseAnswer}}, l.Inject(post))
		assert.Equal(t, 0, l.Len())
	})
	t.Run("it holds at most Max rules", func(t *testing.T) {
		l := fault.List{Max: 2}
		require.NoError(t, l.Add(&fault.Rule{}))
		require.NoError(t, l.Add(&fault.Rule{}))
		assert.ErrorIs(t, l.Add(&fault.Rule{}), fault.ErrFull)
		l.Clear()
		assert.Equal(t, 0, l.Len())
		require.NoError(t, l.Add(&fault.Rule{}))
	})
}
