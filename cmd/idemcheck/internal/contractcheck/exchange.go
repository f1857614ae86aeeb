package contractcheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

const (
	headerKey      = "Idempotency-Key"
	headerReplayed = "Idempotent-Replayed"
)

// errBudget stops a request that would send more than [Plan] announced.
var errBudget = errors.New("contractcheck: the planned number of requests is used up")

// request is what one row sends.
type request struct {
	method string
	url    string
	// keys are the Idempotency-Key field values as sent, one header line
	// each; nil sends no field.
	keys []string
	// caller is 1 for Config.Auth, 2 for Config.Auth2, 0 for no credential.
	caller int
	body   []byte
}

// exchange is a request and its answer.
type exchange struct {
	req    request
	auth1  bool  // the request carried Config.Auth
	err    error // no answer
	status int
	header http.Header
	body   []byte
}

// send sends req and reads the answer, at most maxResponseBytes of it.
func (c *checker) send(ctx context.Context, req request) *exchange {
	ex := &exchange{req: req}
	if c.sent.Add(1) > c.budget {
		c.sent.Add(-1)
		ex.err = errBudget
		return ex
	}
	var body io.Reader
	if req.body != nil {
		body = bytes.NewReader(req.body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, req.url, body)
	if err != nil {
		ex.err = err
		return ex
	}
	if req.body != nil {
		hr.Header.Set("Content-Type", c.cfg.ContentType)
	}
	if req.keys != nil {
		hr.Header[headerKey] = req.keys
	}
	switch req.caller {
	case 1:
		if c.cfg.Auth != "" {
			hr.Header.Set("Authorization", c.cfg.Auth)
			ex.auth1 = true
		}
	case 2:
		hr.Header.Set("Authorization", c.cfg.Auth2)
	}
	resp, err := c.client.Do(hr)
	if err != nil {
		ex.err = err
		return ex
	}
	defer resp.Body.Close()
	ex.status, ex.header = resp.StatusCode, resp.Header
	if req.keys != nil {
		c.keyedMu.Lock()
		c.keyed = append(c.keyed, ex)
		c.keyedMu.Unlock()
	}
	ex.body, err = io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		ex.err = fmt.Errorf("reading the answer after %s: %w", resp.Status, err)
	}
	return ex
}

// post sends the checked method to the checked URL with the given key
// field values, as the first caller.
func (c *checker) post(ctx context.Context, body []byte, keys ...string) *exchange {
	return c.send(ctx, request{method: c.cfg.Method, url: c.cfg.URL, keys: keys, caller: 1, body: body})
}

// ok reports whether the request got a 2xx answer.
func (ex *exchange) ok() bool { return ex.err == nil && ex.status >= 200 && ex.status < 300 }

// answered reports whether a whole answer came back.
func (ex *exchange) answered() bool { return ex.err == nil }

// replayed reports whether the answer is marked as a replay.
func (ex *exchange) replayed() bool {
	return ex.err == nil && strings.EqualFold(strings.TrimSpace(ex.header.Get(headerReplayed)), "true")
}

// resource names what a 2xx answer created: its Location, else the "id" of
// a JSON body, else a hash of the body. Two answers about one resource have
// the same name.
func (ex *exchange) resource() string {
	if loc := ex.header.Get("Location"); loc != "" {
		return "Location " + loc
	}
	if id := jsonID(ex.body); id != "" {
		return "id " + id
	}
	sum := sha256.Sum256(ex.body)
	return "body sha256:" + hex.EncodeToString(sum[:6])
}

// jsonID returns the "id" member of a JSON object, or "".
func jsonID(body []byte) string {
	var v struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(body, &v) != nil || len(v.ID) == 0 || string(v.ID) == "null" {
		return ""
	}
	var s string
	if json.Unmarshal(v.ID, &s) == nil {
		return s
	}
	return string(v.ID)
}

// sameAnswer reports whether b repeats a's answer byte for byte: status,
// Location and body.
func sameAnswer(a, b *exchange) bool {
	return a.answered() && b.answered() && a.status == b.status &&
		a.header.Get("Location") == b.header.Get("Location") && bytes.Equal(a.body, b.body)
}

// problemType returns the "type" of a problem body, or "".
func (ex *exchange) problemType() string {
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(ex.body, &p)
	return p.Type
}

// wantProblem says what is wrong when ex is not a problem with the status
// and type (a name under Config.ProblemBase), or "" when it is.
func (c *checker) wantProblem(ex *exchange, status int, name string) string {
	want := c.cfg.ProblemBase + name
	switch {
	case !ex.answered():
		return fmt.Sprintf("wanted %d %s, got no answer", status, want)
	case ex.status != status:
		return fmt.Sprintf("wanted %d %s, got %d", status, want, ex.status)
	case ex.problemType() != want:
		got := ex.problemType()
		if got == "" {
			got = "no problem type"
		}
		return fmt.Sprintf("wanted problem type %s, got %s", want, got)
	}
	return ""
}

// retryAfter parses a Retry-After of whole seconds; ok is false when it is
// absent or not a whole number of at least 1.
func (ex *exchange) retryAfter() (secs int64, ok bool) {
	v := strings.TrimSpace(ex.header.Get("Retry-After"))
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 1 {
		return 0, false
	}
	return n, true
}

// evidence renders exchanges for a report.
func evidence(exs ...*exchange) []Exchange {
	out := make([]Exchange, 0, len(exs))
	for _, ex := range exs {
		if ex != nil {
			out = append(out, Exchange{Request: ex.describeRequest(), Response: ex.describeResponse()})
		}
	}
	return out
}

func (ex *exchange) describeRequest() string {
	var b strings.Builder
	b.WriteString(ex.req.method + " " + ex.req.url)
	if ex.req.keys == nil {
		b.WriteString(" (no Idempotency-Key)")
	}
	for _, k := range ex.req.keys {
		if len(k) > 60 {
			fmt.Fprintf(&b, " Idempotency-Key: %s... (%d characters)", strconv.Quote(k[:60]), len(k))
			continue
		}
		fmt.Fprintf(&b, " Idempotency-Key: %s", strconv.Quote(k))
	}
	switch {
	case ex.req.caller == 1 && ex.auth1:
		b.WriteString(" Authorization: (-auth)")
	case ex.req.caller == 2:
		b.WriteString(" Authorization: (-auth2)")
	}
	if ex.req.body != nil {
		b.WriteString(" body: " + clip(ex.req.body))
	}
	return b.String()
}

func (ex *exchange) describeResponse() string {
	if ex.err != nil {
		return "no answer: " + ex.err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", ex.status, http.StatusText(ex.status))
	for _, h := range []string{"Location", "Retry-After", headerReplayed} {
		if v := ex.header.Values(h); len(v) > 0 {
			fmt.Fprintf(&b, " %s: %s", h, strings.Join(v, ", "))
		}
	}
	b.WriteString(" body: " + clip(ex.body))
	return b.String()
}

// clip shortens a body for a report line.
func clip(body []byte) string {
	const max = 200
	s := strings.TrimSpace(string(body))
	if len(s) > max {
		s = s[:max] + fmt.Sprintf("... (%d bytes)", len(body))
	}
	return strconv.Quote(s)
}
