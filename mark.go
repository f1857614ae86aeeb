package idem

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/http"
	"strings"
)

// Mark is how the app's server shows that an answer is its own. idem must
// tell it from answers of whatever else is on the path. That may be a
// captive portal's login page, a CDN's fallback page, or a gateway's 401.
// Only an answer with the mark settles an intent. (See the package
// documentation, "Whose word settles an intent".) It is Server.Mark, and New
// refuses a Server without one. Pick the preset of the API the app calls. Or
// pick MarkJSONID for a plain server, or MarkRecognizer.
//
// Every Mark takes the contract's mark. That is the request's
// Idempotency-Key echoed back in the answer's header fields.
// Idempotent-Replayed: true alone is no mark. A cache may serve another
// intent's replay. Some servers leave some answers without the echo. A Mark
// for such a server adds a test of those answers.
type Mark struct {
	// name is how New's errors and the docs spell the Mark.
	name string
	// own recognises the server's answers that carry neither of the
	// contract's marks. Nil trusts those marks alone. It sees the answer and
	// the intent's key. The answer's body is nil when over
	// Server.MaxResponseBytes.
	own func(resp *Response, key string) bool
	// namesKey says that own recognises only an answer whose body names the
	// key (MarkIncrease). A lookup's 2xx it recognises is then this
	// intent's, even when a cache kept it.
	namesKey bool
	// invalid says why New refuses the Mark ("" when it does not).
	invalid string
}

// The presets. Each is a Mark for a server that marks its answers as its
// named API does.
var (
	// MarkEcho is a server that echoes the request's Idempotency-Key in
	// every answer. The first answer echoes it too, as the contract asks
	// (docs/CONTRACT.md). idem's own middleware (package idempotency) and
	// fakeserver do so.
	MarkEcho = Mark{name: "idem.MarkEcho"}
	// MarkStripe is Stripe's API, which echoes the Idempotency-Key in its
	// answers.
	MarkStripe = Mark{name: "idem.MarkStripe"}
	// MarkAdyen is Adyen's API, which echoes the Idempotency-Key in its
	// answers.
	MarkAdyen = Mark{name: "idem.MarkAdyen"}
	// MarkIncrease is Increase's API. It marks only its replays
	// (Idempotent-Replayed: true). Its first answer is recognised by its
	// body. That body is a 2xx JSON object with an id and an idempotency_key
	// field. The field must hold the intent's key. The objects Increase
	// creates under a key carry it, such as an ACH transfer. Its replay is
	// recognised the same way, never by Idempotent-Replayed alone. A cache
	// that kept intent X's replay may serve it to intent Y. An answer
	// without that field stays unknown, and so does a 4xx.
	//
	// A list whose data holds such an object is recognised too. Increase's
	// list endpoints filter by idempotency_key. That makes a lookup:
	// Server.LookupQuery "idempotency_key". An empty list settles nothing,
	// for it is not the contract's typed miss.
	MarkIncrease = Mark{name: "idem.MarkIncrease", own: increaseAnswer, namesKey: true}
)

// MarkJSONID is a plain server that does not echo the key. Its answer that
// created a resource is recognised by its body. Such an answer is a 2xx
// whose Content-Type is JSON. (That is application/json, or a type ending in
// +json.) Its body is a JSON object with the resource's id at path. The id
// is a non-empty string or a number. path names a top-level field ("id"), or
// a nested one with dots ("data.id"). New refuses an empty path, and one
// with an empty segment.
//
// These answers never settle an intent:
//
//   - An answer recognised by its status alone.
//   - A 4xx, for a gateway's 401 or a WAF's 403 may carry JSON too.
//   - A page that is not JSON: a captive portal's page, a CDN's fallback
//     index.html, a login page.
//   - An answer from another origin, reached by a followed redirect. A
//     portal's JSON API is JSON too.
//   - An answer a cache served (an Age above 0). A cache that keeps POST
//     answers may serve another intent's.
//
// A cache may keep POST answers and say no Age. It may say Age: 0 within its
// first second. Such a cache cannot be told from the server. Behind one, use
// a Mark that reads the key.
//
// The lookup's 2xx is read the same way. So the server's lookup answers the
// resource itself, not a list. The id names no key. So the lookup's 2xx
// settles only when it echoes the lookup's nonce. (That is
// Idempotency-Lookup-Nonce, docs/CONTRACT.md.) A cache that ignores the
// query string may serve another key's lookup. The lookup's miss voids an
// intent only as the contract's typed miss.
func MarkJSONID(path string) Mark {
	m := Mark{name: fmt.Sprintf("idem.MarkJSONID(%q)", path)}
	segments := strings.Split(path, ".")
	for _, s := range segments {
		if s == "" {
			m.invalid = "the id's path is empty or has an empty segment: give a field name such as \"id\", or a dotted path such as \"data.id\""
			return m
		}
	}
	m.own = func(resp *Response, _ string) bool { return jsonID(resp, segments) }
	return m
}

// MarkRecognizer is a server that the app recognises itself. own sees each
// answer that lacks the contract's marks, body included. That is each final
// answer of a send, and each answer of the lookup. The body is nil when over
// Server.MaxResponseBytes. own reports whether the answer is the server's
// own. It may check a header field or a body only the server sends. Never
// recognise an answer by its status alone. own must not keep resp, and New
// refuses a nil own.
//
// A recognised answer is the server's word. A 2xx or a 4xx from a send
// settles the intent. A lookup's answer counts only if it echoes the
// lookup's nonce. (That is Idempotency-Lookup-Nonce, docs/CONTRACT.md.) Then
// a lookup's 2xx makes the intent succeeded, and its 404 makes it void. The
// nonce matters, for a cache may have kept the answer. A 404 a cache kept
// may be older than the payment. A 2xx without an Age field may be another
// key's lookup a cache kept.
func MarkRecognizer(own func(resp *Response) bool) Mark {
	m := Mark{name: "idem.MarkRecognizer(...)"}
	if own == nil {
		m.invalid = "its recognizer is nil: give a function that recognises the server's answers"
		return m
	}
	m.own = func(resp *Response, _ string) bool { return own(resp) }
	return m
}

// String returns the Mark as Go spells it, such as idem.MarkEcho.
func (m Mark) String() string {
	if m.name == "" {
		return "no mark"
	}
	return m.name
}

// marks lists the choices of New's error.
const marks = "idem.MarkEcho (the server echoes the Idempotency-Key: idem's middleware and fakeserver), " +
	"idem.MarkStripe, idem.MarkAdyen, idem.MarkIncrease, " +
	"idem.MarkJSONID(\"id\") (a plain server whose 2xx answers are JSON carrying the resource's id), " +
	"or idem.MarkRecognizer(func) (the app's own test of an answer)"

// jsonMedia reports a JSON Content-Type. That is application/json, or a type
// ending in +json. (Examples are application/vnd.api+json and
// application/hal+json.)
func jsonMedia(h http.Header) bool {
	ct, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && (ct == "application/json" || strings.HasPrefix(ct, "application/") && strings.HasSuffix(ct, "+json"))
}

// jsonID reports a 2xx JSON answer whose body holds an id at path. (See
// MarkJSONID.)
func jsonID(resp *Response, path []string) bool {
	if !isSuccess(resp.StatusCode) || !jsonMedia(resp.Header) {
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(resp.Body))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return false
	}
	for _, field := range path {
		obj, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = obj[field]; !ok {
			return false
		}
	}
	switch id := v.(type) {
	case string:
		return strings.TrimSpace(id) != ""
	case json.Number:
		return true
	}
	return false
}

// increaseObject is what increaseAnswer reads of an Increase object.
type increaseObject struct {
	ID             string `json:"id"`
	IdempotencyKey string `json:"idempotency_key"`
}

// increaseAnswer recognises Increase's first answer to an intent. (See
// MarkIncrease.) That is a 2xx JSON object created under key, or a list
// holding one.
func increaseAnswer(resp *Response, key string) bool {
	if !isSuccess(resp.StatusCode) || !jsonMedia(resp.Header) || key == "" {
		return false
	}
	var body struct {
		increaseObject
		Data []increaseObject `json:"data"`
	}
	if json.Unmarshal(resp.Body, &body) != nil {
		return false
	}
	created := func(o increaseObject) bool { return o.ID != "" && o.IdempotencyKey == key }
	if created(body.increaseObject) {
		return true
	}
	for _, o := range body.Data {
		if created(o) {
			return true
		}
	}
	return false
}
