package fakeserver_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/idemkit/idem/fakeserver"
	"github.com/idemkit/idem/fakeserver/fault"
)

func ExampleNewServer() {
	s := fakeserver.NewServer(nil)
	defer s.Close()

	// The response to the first attempt is lost; the retry is answered
	// from the record.
	_ = s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Key: "order-1"})
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/payments",
			strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
		req.Header.Set("Idempotency-Key", "order-1")
		// A fresh connection per attempt, so that the lost response is an
		// error here rather than retried by the Transport.
		req.Close = true
		resp, err := s.Client().Do(req)
		if err != nil {
			fmt.Println("lost response")
			continue
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, "replayed:", resp.Header.Get("Idempotent-Replayed"))
	}
	st := s.Stats()
	fmt.Println("payments:", st.Payments, "charges:", st.ProviderCharges)
	// Output:
	// lost response
	// 201 replayed: true
	// payments: 1 charges: 1
}

// The app's own POST /orders, faked with the handler its server runs,
// behind the fake's idempotency layer and faults: the first answer is
// lost, the client's retry with the same key gets the stored answer, and
// the order is made once.
func ExampleEndpoint() {
	var mu sync.Mutex
	orders := 0
	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		orders++
		n := orders
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"ord_%d"}`+"\n", n)
	})
	s := fakeserver.NewServer(&fakeserver.Options{
		Endpoints: []fakeserver.Endpoint{{Pattern: "POST /orders", Handler: createOrder}},
	})
	defer s.Close()

	_ = s.InjectFault(fakeserver.Fault{Kind: fakeserver.FaultDropResponse, Path: "/orders"})
	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/orders", strings.NewReader(`{"items":["tea"]}`))
		req.Header.Set("Idempotency-Key", "cart-7")
		req.Close = true // a fresh connection, so the lost answer is seen
		resp, err := s.Client().Do(req)
		if err != nil {
			fmt.Println("lost answer")
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d replayed:%s %s", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Println("orders made:", orders, "executions:", s.Stats().Executions)
	// Output:
	// lost answer
	// 201 replayed:true {"id":"ord_1"}
	// orders made: 1 executions: 1
}

// A rule of package fault picks requests by what a Fault cannot say: here
// every third POST is answered 503 by a proxy in front.
func ExampleHandler_InjectRule() {
	s := fakeserver.NewServer(nil)
	defer s.Close()

	_ = s.InjectRule(&fault.Rule{
		When:   fault.And(fault.Method(http.MethodPost), func(op fault.Op) bool { return op.Attempt%3 == 0 }),
		Effect: fault.Effect{Kind: fakeserver.FaultStatus, Status: http.StatusServiceUnavailable, RetryAfter: "1"},
	})
	for i := range 4 {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/payments",
			strings.NewReader(`{"amount":1500,"currency":"AZN","customer":"cus_1"}`))
		req.Header.Set("Idempotency-Key", fmt.Sprintf("order-%d", i))
		resp, err := s.Client().Do(req)
		if err != nil {
			fmt.Println(err)
			continue
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode)
	}
	// Output:
	// 201
	// 201
	// 503
	// 201
}
