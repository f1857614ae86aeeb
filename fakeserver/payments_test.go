package fakeserver

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/idemkit/idem/idempotency"
)

// validatingLayer returns the idempotency layer with check as its
// validation hook, over a handler that answers 201.
func validatingLayer(check func(r *http.Request, body []byte)) http.Handler {
	return idempotency.New(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}), idempotency.Config{
		Store:     &idempotency.MemoryStore{},
		Principal: func(*http.Request) string { return "" },
		Validate: func(r *http.Request, body []byte) (any, *idempotency.Problem) {
			check(r, body)
			return nil, nil
		},
	})
}

func postTo(h http.Handler, body string) {
	r := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
	r.Header.Set("Idempotency-Key", "k1")
	h.ServeHTTP(httptest.NewRecorder(), r)
}

// TestValidatePaymentReadsTheFingerprintsParse: behind the layer, a
// payment body is validated from the fingerprint's reading, without a
// second parse.
func TestValidatePaymentReadsTheFingerprintsParse(t *testing.T) {
	for _, body := range []string{
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`,
		` { "description" : "çay" , "customer":"cus_1", "currency":"azn","amount":-7 } `,
		`{"amount":1500,"currency":"AZN","customer":"cus_1"}`,
	} {
		ran := false
		postTo(validatingLayer(func(r *http.Request, body []byte) {
			ran = true
			rd, ok := idempotency.JSONReadingOf(r)
			if !ok {
				t.Fatalf("%s: no reading in the validation hook", body)
			}
			req, ok := paymentOf(rd)
			if !ok {
				t.Fatalf("%s: the reading is not taken as a payment", body)
			}
			want, _ := parsePayment(body)
			if !reflect.DeepEqual(req, want) {
				t.Fatalf("%s: read %+v, encoding/json decodes %+v", body, req, want)
			}
		}), body)
		if !ran {
			t.Fatalf("%s: the hook did not run", body)
		}
	}
}

// FuzzValidatePaymentAnswersAsEncodingJSON: for every body, the validation
// behind the layer (from the fingerprint's reading when it can) accepts
// what parsePayment accepts, with the same values, and refuses the rest
// with parsePayment's problem.
func FuzzValidatePaymentAnswersAsEncodingJSON(f *testing.F) {
	for _, body := range []string{
		``, `amount=1500`, `{"amount":1500`, `[1,2]`, `"s"`, `{}`, `null`,
		`{"amount":1500,"currency":"AZN","customer":"cus_1","description":"coffee"}`,
		`{"amount":0,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":-0,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":"1500","currency":"AZN","customer":"cus_1"}`,
		`{"amount":15.5,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":1e3,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":9223372036854775808,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":-9223372036854775808,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":null,"currency":"AZN","customer":"cus_1"}`,
		`{"amount":1,"currency":null,"customer":"cus_1","description":null}`,
		`{"amount":1,"currency":"AZNX","customer":"cus_1"}`,
		`{"amount":1,"currency":944,"customer":"cus_1"}`,
		`{"amount":1,"currency":"AZN","customer":""}`,
		`{"amount":1,"currency":"AZN","customer":"c\u0000"}`,
		`{"amount":1,"currency":"AZN","customer":"c\n","description":"\ud800"}`,
		"{\"amount\":1,\"currency\":\"AZN\",\"customer\":\"c\xff\"}",
		`{"amount":1,"currency":"AZN","customer":"c","tip":5}`,
		`{"Amount":1,"currency":"AZN","customer":"c"}`,
		`{"\u0061mount":1,"currency":"AZN","customer":"c"}`,
		`{"amount":1,"currency":"AZN","customer":"c"} {}`,
		`{"amount":1,"currency":"AZN","customer":{"id":"c"}}`,
		`{"amount":[1],"currency":"AZN","customer":"c"}`,
		`{"amount":true,"currency":"AZN","customer":"c"}`,
		`{"amount":1,"currency":"AZN","customer":"` + strings.Repeat("c", 256) + `"}`,
		`{"amount":1,"currency":"AZN","customer":"c","description":"` + strings.Repeat("ş", 1001) + `"}`,
	} {
		f.Add(body)
	}
	f.Fuzz(func(t *testing.T, body string) {
		postTo(validatingLayer(func(r *http.Request, b []byte) {
			if !bytes.Equal(b, []byte(body)) {
				t.Fatalf("the hook got %q, not the body %q", b, body)
			}
			got, gotP := validatePayment(r, b)
			want, wantP := parsePayment(b)
			if !reflect.DeepEqual(gotP, wantP) {
				t.Fatalf("%q: problem %+v, encoding/json's %+v", body, gotP, wantP)
			}
			if wantP == nil && !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: read %+v, encoding/json decodes %+v", body, got, want)
			}
		}), body)
	})
}
