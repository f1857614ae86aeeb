package mobile

import (
	"testing"

	"github.com/idemkit/idem/internal/mutant"
)

// TestMutants requires the facade's tests to kill the mutants of its rules
// for kinds and outcomes. The root's table holds the facade's older rows.
func TestMutants(t *testing.T) {
	mutant.Test(t, []mutant.Mutant{
		{
			Name: "unmarked-4xx-final-on-a-first-attempt", File: "call.go",
			Note:    "Pay's first attempt answered by a WAF's 403 that replaced the server's 201 is failed: PayAnew charges twice",
			Anchor:  "\tif st.own {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
			Replace: "\tif st.own || !isSuccess(resp.StatusCode) && st.b.attempts == 1 {\n\t\treturn nil\n\t}\n\tst.stopped = &stop{reason: stopUnmarked}",
			Pkg:     "./mobile", Run: "^TestConfigMark$/^a_WAF's_403_that_replaced_the_server's_201_is_unknown$",
		},
		{
			Name: "recognizer-trusts-another-origin", File: "answer.go",
			Note:    "json-id settles an answer from another origin: a captive portal's JSON API, reached by a 307, is a payment",
			Anchor:  "\tif fromAnotherOrigin(resp) {\n\t\treturn echoes(resp.Header, key)\n\t}\n",
			Replace: "",
			Pkg:     "./mobile", Run: "^TestConfigMark$/^a_portal's_JSON_after_a_redirect_to_another_host_is_not_a_payment$",
		},
		{
			Name: "already-paid-as-succeeded", File: "mobile/result.go",
			Note:    "a changed cart of an action paid earlier is answered as its own success",
			Anchor:  "r.Outcome, r.Kind, r.FromStore, r.Detail = OutcomeAlreadyPaid, KindAlreadyPaid, true, resolved.Error()",
			Replace: "r.Outcome, r.Kind, r.FromStore, r.Detail = OutcomeSucceeded, KindSucceeded, true, resolved.Error()",
			Pkg:     "./mobile", Run: "^TestPay$/^a_changed_cart_of_a_paid_action_says_it_is_already_paid$",
		},
		{
			Name: "storage-kind-hidden", File: "mobile/result.go",
			Note:    "an outcome unknown because a write failed gives no kind storage",
			Anchor:  "\tif errors.As(err, &save) {\n\t\treturn KindStorage\n",
			Replace: "\tif errors.As(err, &save) && false {\n\t\treturn KindStorage\n",
			Pkg:     "./mobile", Run: "^TestResultKind$",
		},
		{
			Name: "key-reused-kind-hidden", File: "mobile/result.go",
			Note:    "a key the server saw with another request is of kind rejected, like any refusal",
			Anchor:  "\t\treturn KindKeyReused\n",
			Replace: "\t\treturn KindRejected\n",
			Pkg:     "./mobile", Run: "^TestResultKind$",
		},
		{
			Name: "expired-as-unknown", File: "mobile/result.go",
			Note:    "a payment too old to send again is reported unknown, as if a resend could still settle it",
			Anchor:  "\t\tr.Outcome = OutcomeExpired\n",
			Replace: "\t\tr.Outcome = OutcomeUnknown\n",
			Pkg:     "./mobile", Run: "^TestResultKind$/^a_payment_too_old_to_send_again_is_expired$",
		},
		{
			Name: "maybe-sent-device-failure-is-error", File: "mobile/result.go",
			Note:    "a device failure on an intent that may have been sent is an error, which says nothing was sent",
			Anchor:  "if s := in.State(); s == persist.StatePending || s == persist.StateExpired {",
			Replace: "if s := in.State(); false {",
			Pkg:     "./mobile", Run: "^TestResultKind$/^a_device_failure_on_an_intent_that_may_have_been_sent_is_unknown$",
		},
		{
			Name: "authorizer-kind-lost", File: "mobile/result.go",
			Note:    "a call the Authorizer ended does not say so",
			Anchor:  "\t\t\tr.Kind = KindAuthorizer\n",
			Replace: "\t\t\t_ = KindAuthorizer\n",
			Pkg:     "./mobile", Run: "^TestAuthorizer$/^a_failure_before_any_attempt_is_an_unsent_Result_of_kind_authorizer$",
		},
		{
			Name: "error-kind-from-message", File: "mobile/errors.go",
			Note:    "ErrorKind reads the kind from the error's message",
			Anchor:  "\tvar e *deviceErr\n\tif errors.As(err, &e) {\n\t\treturn e.kind\n\t}\n",
			Replace: "\tif k, _, ok := strings.Cut(strings.TrimPrefix(err.Error(), \"idem[\"), \"]\"); ok && errors.Is(err, err) {\n\t\treturn k\n\t}\n",
			Pkg:     "./mobile", Run: "^TestErrorKind$",
		},
		{
			Name: "pay-path-leaves-origin", File: "mobile/config.go",
			Note:    "a Pay path such as \"//other.example/payments\" is resolved against BaseURL and sent, with the Authorizer's token, to another host",
			Anchor:  "\tif u.Scheme != base.Scheme || !strings.EqualFold(u.Host, base.Host) || u.User.String() != base.User.String() {\n",
			Replace: "\tif false {\n",
			Pkg:     "./mobile", Run: "^TestPay$",
		},
		{
			Name: "pay-path-changes-scheme", File: "mobile/config.go",
			Note:    "a Pay path that names the API's host with another scheme is sent there: from https to http, the payment and the token leave TLS",
			Anchor:  "\tif u.Scheme != base.Scheme || !strings.EqualFold",
			Replace: "\tif false || !strings.EqualFold",
			Pkg:     "./mobile", Run: "^TestPay$",
		},
		{
			Name: "lookup-path-leaves-origin", File: "mobile/config.go",
			Note:    "Open takes a LookupPath on another origin, whose answers would settle the user's payments",
			Anchor:  "\tif _, err := resolve(base, \"LookupPath\", strings.ReplaceAll(cfg.LookupPath, \"{key}\", \"k\")); err != nil {\n",
			Replace: "\tif err := error(nil); err != nil {\n",
			Pkg:     "./mobile", Run: "^TestConfig$/^Open_refuses_a_bad_Config$",
		},
		{
			Name: "authorizer-value-unchecked", File: "mobile/authorizer.go",
			Note:    "an Authorizer value with a trailing newline goes to the call: not of kind authorizer, and SettleAll goes on with it",
			Anchor:  "\t\tif err == nil && strings.ContainsFunc(v, isCTL) {\n",
			Replace: "\t\tif err == nil && strings.ContainsFunc(v, isCTL) && false {\n",
			Pkg:     "./mobile", Run: "^TestAuthorizer$",
		},
	})
}
