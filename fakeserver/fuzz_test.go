package fakeserver_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemkit/idem/clock"
	"github.com/idemkit/idem/fakeserver"
)

// fuzzTargets are the endpoints a fuzzed request goes to, picked by index.
var fuzzTargets = []struct{ method, path string }{
	{http.MethodPost, "/payments"},
	{http.MethodGet, "/payments"},
	{http.MethodGet, "/payments?idempotency_key=k1"},
	{http.MethodGet, "/payments/pay_1"},
	{http.MethodPut, "/orders/1/status"},
	{http.MethodPost, "/_fake/faults"},
	{http.MethodPatch, "/payments"},
}

// FuzzHandler sends random keys, credentials and bodies, twice, through a
// fresh handler: it must never panic and never answer 5xx, unless the
// request installed a fault that asks for one.
func FuzzHandler(f *testing.F) {
	for _, tt := range validationCases {
		f.Add(uint8(0), "k1", "", tt.body)
	}
	for _, key := range []string{"", `""`, `"k1"`, `"k1";a=1`, "a b", "\x00", `"\x7f"`, "8e03978e-40d5-43e8-bc93-6894a57f9324"} {
		f.Add(uint8(0), key, "Bearer a", payBody)
	}
	f.Add(uint8(0), "k1", "", declineBody)
	f.Add(uint8(0), "k1", "", `{"amount":1500,"AMOUNT":2000,"currency":"AZN","customer":"cus_1"}`)
	f.Add(uint8(0), "k1", "", `{"amount":1500,"currency":"AZN","customer":"cus_1","cuſtomer":"cus_2"}`)
	f.Add(uint8(0), "k1", "", `{"amount":1500,"currency":"AZN","customer":"cus_1","description":[[[[[[[[[[[[1]]]]]]]]]]]]}`)
	f.Add(uint8(4), "", "", `{"status":"SHIPPED"}`)
	f.Add(uint8(5), "", "", `{"fault":"status","status":503,"retry_after":1}`)
	f.Add(uint8(5), "", "", `{"fault":"explode"}`)
	f.Fuzz(func(t *testing.T, target uint8, key, auth, body string) {
		h := fakeserver.NewHandler(&fakeserver.Options{Clock: clock.NewManual(epoch)})
		tgt := fuzzTargets[int(target)%len(fuzzTargets)]
		for range 2 {
			r := httptest.NewRequest(tgt.method, tgt.path, bytes.NewReader([]byte(body)))
			r.Header["Idempotency-Key"] = []string{key}
			r.Header["Authorization"] = []string{auth}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code >= 500 && tgt.path != "/_fake/faults" {
				t.Fatalf("%s %s key %q body %q: %d %s", tgt.method, tgt.path, key, body, w.Code, w.Body)
			}
			if tgt.path == "/_fake/faults" {
				// The fault endpoint answers 201 or 400, and never faults
				// itself.
				if w.Code != http.StatusCreated && w.Code != http.StatusBadRequest {
					t.Fatalf("fault %q: %d %s", body, w.Code, w.Body)
				}
				return
			}
		}
	})
}
