package fakeserver_test

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/idemkit/idem/fakeserver"
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
