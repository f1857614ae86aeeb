package fakeserver_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/idempotency"
)

// orderBook is an app's own handler of POST /carts/{cart}/orders, as its
// production server would run it: it makes one order per stable id, so
// that a takeover after a dead worker finds the order made and does not
// make another.
type orderBook struct {
	mu        sync.Mutex
	runs      int
	takeovers int
	orders    map[string]string // stable id -> order id
}

func newOrderBook() *orderBook { return &orderBook{orders: map[string]string{}} }

func (b *orderBook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	info, _ := idempotency.FromContext(r.Context())
	b.mu.Lock()
	b.runs++
	if info.Takeover {
		b.takeovers++
	}
	id, ok := b.orders[info.StableID]
	if !ok {
		id = fmt.Sprintf("ord_%d", len(b.orders)+1)
		b.orders[info.StableID] = id
	}
	b.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"cart":%q}`+"\n", id, r.PathValue("cart"))
}

func (b *orderBook) counts() (runs, takeovers, orders int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs, b.takeovers, len(b.orders)
}

// withOrders starts a server that fakes the app's POST
// /carts/{cart}/orders with book, and its GET /orders/{id}.
func withOrders(t *testing.T, book *orderBook) (*fakeserver.Server, func(time.Duration)) {
	t.Helper()
	srv, clk := newServer(t, &fakeserver.Options{Endpoints: []fakeserver.Endpoint{
		{Pattern: "POST /carts/{cart}/orders", Handler: book, Validate: func(r *http.Request, body []byte) (any, *idempotency.Problem) {
			if !strings.Contains(string(body), `"items"`) {
				return nil, &idempotency.Problem{Type: "https://shop.example/problems/empty-cart", Title: "Empty cart", Status: http.StatusBadRequest}
			}
			return nil, nil
		}},
		{Pattern: "GET /orders/{id}", Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"id":%q}`+"\n", r.PathValue("id"))
		})},
	}})
	return srv, clk.Advance
}

const orderBody = `{"items":[{"sku":"tea","qty":2}]}`

func TestEndpoints(t *testing.T) {
	t.Parallel()
	order := func(key string) req { return req{Path: "/carts/c1/orders", Key: key, Body: orderBody} }

	t.Run("a retry after a lost answer replays the first answer, and the handler ran once", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/carts/c1/orders"}))
		_, err := trySend(freshClient(t), srv.URL, order("k1"))
		require.Error(t, err, "the answer is lost")

		a := send(t, srv.Client(), srv.URL, order("k1"))
		assert.Equal(t, http.StatusCreated, a.Status)
		assert.Equal(t, "true", a.Header.Get("Idempotent-Replayed"))
		assert.Equal(t, "k1", a.Header.Get("Idempotency-Key"), "marked as the server's own answer")
		assert.JSONEq(t, `{"id":"ord_1","cart":"c1"}`, string(a.Body))
		runs, _, orders := book.counts()
		assert.Equal(t, 1, runs)
		assert.Equal(t, 1, orders)
		st := srv.Stats()
		assert.Equal(t, 1, st.Executions)
		assert.Equal(t, 2, st.Requests)
		assert.Equal(t, 1, st.Records)
	})
	t.Run("a request without a key is refused and the handler does not run", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		a := send(t, srv.Client(), srv.URL, req{Path: "/carts/c1/orders", Body: orderBody, NoKey: true})
		assert.Equal(t, http.StatusBadRequest, a.Status)
		assert.Equal(t, fakeserver.ProblemBase+"idempotency-key-missing", a.problem(t).Type)
		runs, _, _ := book.counts()
		assert.Zero(t, runs)
	})
	t.Run("the key with another body, or on the payments, is a reused key", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		require.Equal(t, http.StatusCreated, send(t, srv.Client(), srv.URL, order("k1")).Status)
		other := order("k1")
		other.Body = `{"items":[{"sku":"coffee","qty":1}]}`
		a := send(t, srv.Client(), srv.URL, other)
		assert.Equal(t, http.StatusUnprocessableEntity, a.Status)
		assert.Equal(t, fakeserver.ProblemBase+"idempotency-key-reused", a.problem(t).Type)
		a = pay(t, srv, "k1", payBody)
		assert.Equal(t, http.StatusUnprocessableEntity, a.Status, "one key, one intent, whatever the path")
		runs, _, _ := book.counts()
		assert.Equal(t, 1, runs)
		assert.Zero(t, srv.Stats().ProviderCharges)
	})
	t.Run("a key is its caller's: another account's same key is another order", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		for _, auth := range []string{"Bearer test_acme_1", "Bearer test_acme_2", "Bearer test_globex_1"} {
			r := order("k1")
			r.Auth = auth
			require.Equal(t, http.StatusCreated, send(t, srv.Client(), srv.URL, r).Status)
		}
		_, _, orders := book.counts()
		assert.Equal(t, 2, orders, "acme's refreshed token replays; globex orders anew")
	})
	t.Run("Validate's problem is the answer, and nothing is stored", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		a := send(t, srv.Client(), srv.URL, req{Path: "/carts/c1/orders", Key: "k1", Body: `{}`})
		assert.Equal(t, http.StatusBadRequest, a.Status)
		assert.Equal(t, "https://shop.example/problems/empty-cart", a.problem(t).Type)
		assert.Zero(t, srv.Stats().Records)
		assert.Equal(t, http.StatusCreated, send(t, srv.Client(), srv.URL, order("k1")).Status, "the key stayed free")
	})
	t.Run("the error fault does nothing and frees the key", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := withOrders(t, book)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultError, Key: "k1"}))
		a := send(t, srv.Client(), srv.URL, order("k1"))
		assert.Equal(t, http.StatusInternalServerError, a.Status)
		runs, _, _ := book.counts()
		assert.Zero(t, runs)
		a = send(t, srv.Client(), srv.URL, order("k1"))
		assert.Equal(t, http.StatusCreated, a.Status)
		assert.Empty(t, a.Header.Get("Idempotent-Replayed"))
	})
	t.Run("after the worker dies having done the work, the takeover runs the handler again with the same stable id", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, advance := withOrders(t, book)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterProvider, Key: "k1"}))
		_, err := trySend(freshClient(t), srv.URL, order("k1"))
		require.Error(t, err, "the worker died")
		a := send(t, srv.Client(), srv.URL, order("k1"))
		assert.Equal(t, http.StatusConflict, a.Status, "its lease is alive")
		assert.Equal(t, 1, srv.Stats().InProgress)

		advance(31 * time.Second) // past the default lease
		a = send(t, srv.Client(), srv.URL, order("k1"))
		assert.Equal(t, http.StatusCreated, a.Status)
		assert.JSONEq(t, `{"id":"ord_1","cart":"c1"}`, string(a.Body), "the order the dead worker made")
		runs, takeovers, orders := book.counts()
		assert.Equal(t, 2, runs)
		assert.Equal(t, 1, takeovers)
		assert.Equal(t, 1, orders)
	})
	t.Run("after the worker dies before the work, the takeover does it", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, advance := withOrders(t, book)
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultCrashAfterInsert, Key: "k1"}))
		_, err := trySend(freshClient(t), srv.URL, order("k1"))
		require.Error(t, err)
		runs, _, _ := book.counts()
		assert.Zero(t, runs)
		advance(31 * time.Second)
		assert.Equal(t, http.StatusCreated, send(t, srv.Client(), srv.URL, order("k1")).Status)
		runs, takeovers, orders := book.counts()
		assert.Equal(t, []int{1, 1, 1}, []int{runs, takeovers, orders})
	})
	t.Run("a GET endpoint is served without a key, with the faults", func(t *testing.T) {
		t.Parallel()
		srv, _ := withOrders(t, newOrderBook())
		require.NoError(t, srv.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultStatus, Path: "/orders/ord_1", Status: http.StatusServiceUnavailable}))
		get := req{Method: http.MethodGet, Path: "/orders/ord_1", NoKey: true}
		assert.Equal(t, http.StatusServiceUnavailable, send(t, srv.Client(), srv.URL, get).Status)
		a := send(t, srv.Client(), srv.URL, get)
		assert.Equal(t, http.StatusOK, a.Status)
		assert.JSONEq(t, `{"id":"ord_1"}`, string(a.Body))
		assert.Zero(t, srv.Stats().Records)
	})
	t.Run("another method on an endpoint's path is 405, naming the methods it has", func(t *testing.T) {
		t.Parallel()
		srv, _ := withOrders(t, newOrderBook())
		a := send(t, srv.Client(), srv.URL, req{Method: http.MethodDelete, Path: "/orders/ord_1", NoKey: true})
		assert.Equal(t, http.StatusMethodNotAllowed, a.Status)
		assert.Equal(t, "GET", a.Header.Get("Allow"))
		assert.Equal(t, http.StatusMethodNotAllowed, a.problem(t).Status)
		a = send(t, srv.Client(), srv.URL, req{Method: http.MethodGet, Path: "/nothing", NoKey: true})
		assert.Equal(t, http.StatusNotFound, a.Status)
		a = send(t, srv.Client(), srv.URL, req{Method: http.MethodPut, Path: "/orders/ord_1/status", Body: `{"status":"SHIPPED"}`, NoKey: true})
		assert.Equal(t, http.StatusOK, a.Status, "the fake's own order statuses are still served")
	})
	t.Run("an endpoint's wildcard never takes the fake's own requests", func(t *testing.T) {
		t.Parallel()
		book := newOrderBook()
		srv, _ := newServer(t, &fakeserver.Options{Endpoints: []fakeserver.Endpoint{{Pattern: "POST /{anything}", Handler: book}}})
		a := pay(t, srv, "k1", payBody)
		assert.Equal(t, http.StatusCreated, a.Status)
		assert.True(t, strings.HasPrefix(a.Header.Get("Location"), "/payments/"), "a payment")
		assert.Equal(t, http.StatusCreated, send(t, srv.Client(), srv.URL, req{Path: "/orders", Key: "k2", Body: orderBody}).Status)
		runs, _, _ := book.counts()
		assert.Equal(t, 1, runs)
	})
	t.Run("an endpoint the server cannot serve panics, naming it", func(t *testing.T) {
		t.Parallel()
		h := http.NotFoundHandler()
		for _, tt := range []struct {
			eps  []fakeserver.Endpoint
			want string
		}{
			{[]fakeserver.Endpoint{{Pattern: "/orders", Handler: h}}, `"/orders" needs a method`},
			{[]fakeserver.Endpoint{{Pattern: "POST /payments", Handler: h}}, `"POST /payments" is on the fake's own API`},
			{[]fakeserver.Endpoint{{Pattern: "POST /payments/{id}/refunds", Handler: h}}, "is on the fake's own API"},
			{[]fakeserver.Endpoint{{Pattern: "GET example.com/_fake/stats", Handler: h}}, "is on the fake's own API"},
			{[]fakeserver.Endpoint{{Pattern: "POST /orders"}}, `"POST /orders" has no Handler`},
			{[]fakeserver.Endpoint{{Pattern: "POST /orders", Handler: h}, {Pattern: "POST /orders", Handler: h}}, "POST /orders"},
		} {
			func() {
				defer func() {
					v := recover()
					require.NotNil(t, v, "no panic for %v", tt.eps)
					assert.Contains(t, fmt.Sprint(v), tt.want)
				}()
				fakeserver.NewHandler(&fakeserver.Options{Endpoints: tt.eps})
			}()
		}
	})
}
