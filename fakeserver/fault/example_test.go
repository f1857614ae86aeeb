package fault_test

import (
	"fmt"
	"net/http/httptest"

	"github.com/idemkit/idem/fakeserver/fault"
)

// A list of rules decides the faults of each request. Here the first POST
// of key order-1 loses its answer, and the retry passes.
func Example() {
	var faults fault.List
	_ = faults.Add(&fault.Rule{
		When:   fault.And(fault.Method("POST"), fault.Key("order-1")),
		Effect: fault.Effect{Kind: fault.LoseAnswer},
		Times:  1,
	})
	req := httptest.NewRequest("POST", "/payments", nil)
	req.Header.Set("Idempotency-Key", "order-1")
	fmt.Println(faults.Inject(fault.OpOf(req)).Has(fault.LoseAnswer))
	fmt.Println(faults.Inject(fault.OpOf(req)).Has(fault.LoseAnswer))
	// Output:
	// true
	// false
}

// A seeded chance fails a tenth of the requests. The seed replays the run.
func ExampleChance() {
	flaky := &fault.Rule{
		When:   fault.And(fault.Path("/payments"), fault.Chance(0.1, fault.Seeded(42))),
		Effect: fault.Effect{Kind: fault.Status, Status: 503, RetryAfter: "1"},
	}
	failed := 0
	for range 1000 {
		if len(flaky.Inject(fault.Op{Path: "/payments"})) > 0 {
			failed++
		}
	}
	fmt.Println(failed > 50 && failed < 150)
	// Output: true
}
