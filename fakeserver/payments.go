package fakeserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem/fakeserver/internal/fakestate"
	"github.com/idemkit/idem/idempotency"
)

// payment is a successful payment, as stored and as answered.
type payment = fakestate.Payment

// paymentRequest is the body of POST /payments.
type paymentRequest struct {
	Amount      *int64  `json:"amount"`
	Currency    *string `json:"currency"`
	Customer    *string `json:"customer"`
	Description string  `json:"description"`
}

// Limits on the strings of a payment. They bound what one payment holds
// in memory (see [Options.MaxPayments]).
const (
	maxCustomerLen    = 255
	maxDescriptionLen = 1000
	// maxStatusLen bounds the status of PUT /orders/{id}/status.
	maxStatusLen = 100
)

// parsePayment decodes and validates a POST /payments body. The problem says
// what is wrong.
func parsePayment(body []byte) (paymentRequest, *problem) {
	var req paymentRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, validationProblem("body is not a valid payment: " + jsonError(err))
	}
	if _, err := dec.Token(); err != io.EOF {
		return req, validationProblem("body has data after the JSON object")
	}
	return req, checkPayment(req)
}

// checkPayment checks a decoded POST /payments body. The problem says what
// is wrong.
func checkPayment(req paymentRequest) *problem {
	switch {
	case req.Amount == nil:
		return validationProblem(`"amount" is required: an integer in minor units, greater than 0`)
	case *req.Amount <= 0:
		return validationProblem(`"amount" must be greater than 0`)
	case req.Currency == nil:
		return validationProblem(`"currency" is required: three letters, such as "AZN"`)
	case !isCurrency(*req.Currency):
		return validationProblem(`"currency" must be three letters, such as "AZN"`)
	case req.Customer == nil || *req.Customer == "":
		return validationProblem(`"customer" is required: a non-empty string, such as "cus_1"`)
	case utf8.RuneCountInString(*req.Customer) > maxCustomerLen:
		return validationProblem(fmt.Sprintf(`"customer" must be at most %d characters`, maxCustomerLen))
	case utf8.RuneCountInString(req.Description) > maxDescriptionLen:
		return validationProblem(fmt.Sprintf(`"description" must be at most %d characters`, maxDescriptionLen))
	case strings.ContainsRune(*req.Customer, 0):
		// PostgreSQL's text cannot hold it: refused in memory too, so that
		// both ways of keeping state take the same payments.
		return validationProblem(`"customer" must not contain the character U+0000`)
	case strings.ContainsRune(req.Description, 0):
		return validationProblem(`"description" must not contain the character U+0000`)
	}
	return nil
}

func isCurrency(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := 0; i < 3; i++ {
		c := s[i] | 0x20
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// jsonError turns a decoding error into a sentence for a problem detail.
func jsonError(err error) string {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		if typeErr.Field != "" {
			return fmt.Sprintf("%q must be %s, not %s", typeErr.Field, jsonType(typeErr.Type.String()), typeErr.Value)
		}
		return "the body must be a JSON object, not " + typeErr.Value
	case errors.As(err, &syntaxErr):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syntaxErr.Offset, syntaxErr)
	case errors.Is(err, io.EOF):
		return "the body is empty; send a JSON object"
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "the JSON is cut short"
	}
	return err.Error()
}

func jsonType(goType string) string {
	switch strings.TrimPrefix(goType, "*") {
	case "int64", "int":
		return "an integer"
	case "string":
		return "a string"
	}
	return goType
}

// principalOf is the account a request acts for (see "Callers" in the
// package docs). A test token names its account. Its canonical form
// "Bearer test_<account>" stands for every token of the account. Any
// other Authorization value is an account of its own. None is the
// anonymous caller "". No other value has the canonical form of a test
// token. So the two kinds never meet.
func principalOf(r *http.Request) string { return callerOf(r.Header.Get("Authorization")) }

// callerOf is the account an Authorization value acts for.
func callerOf(authorization string) string {
	if account, ok := accountOf(authorization); ok {
		return "Bearer " + testTokenPrefix + account
	}
	return authorization
}

const testTokenPrefix = "test_"

// maxAccountLen is the longest account name a test token may carry.
const maxAccountLen = 64

// accountOf returns the account a test token names, and false when
// authorization is not one. A test token is the Authorization value
// "Bearer test_<account>" or "Bearer test_<account>_<anything>". The
// scheme may be in any case. The account is 1 to [maxAccountLen]
// letters, digits, '-' or '.'. Anything after the second underscore is
// ignored: a token's serial number or expiry, say. Every token that names
// one account is the same caller. So a retry after a token refresh
// replays instead of paying again.
func accountOf(authorization string) (string, bool) {
	scheme, token, ok := strings.Cut(authorization, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token, ok = strings.CutPrefix(strings.TrimLeft(token, " "), testTokenPrefix)
	if !ok {
		return "", false
	}
	account, _, _ := strings.Cut(token, "_")
	if account == "" || len(account) > maxAccountLen {
		return "", false
	}
	for i := 0; i < len(account); i++ {
		switch c := account[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.':
		default:
			return "", false
		}
	}
	return account, true
}

// validatePayment is the middleware's validation hook. A bad body is a
// 400 before the key is looked at, and stores nothing. It reads the body
// from the middleware's reading of it, the fingerprint's parse. That
// holds when the reading is a payment as parsePayment would decode it.
// It then checks it as parsePayment does. Any other body is left to
// parsePayment, whose problem is the answer. Such a body is malformed,
// or has unknown or mistyped members, or escaped or null values.
func validatePayment(r *http.Request, body []byte) (any, *problem) {
	if rd, ok := idempotency.JSONReadingOf(r); ok {
		if req, ok := paymentOf(rd); ok {
			return req, checkPayment(req)
		}
	}
	req, p := parsePayment(body)
	return req, p
}

// paymentOf returns the payment a body's reading holds. It returns false
// unless encoding/json decodes it into a paymentRequest without error,
// to the same values. That is an object whose members are named exactly
// as the fields. Its amount is an integer. Its strings are valid UTF-8
// without escapes.
func paymentOf(rd idempotency.JSONReading) (paymentRequest, bool) {
	var req paymentRequest
	n := rd.Len()
	if n < 0 {
		return req, false
	}
	for i := range n {
		name, v := rd.Member(i)
		switch string(name) {
		case "amount":
			a, ok := jsonInt(v)
			if !ok {
				return req, false
			}
			req.Amount = &a
		case "currency", "customer", "description":
			s, ok := jsonString(v)
			if !ok {
				return req, false
			}
			switch string(name) {
			case "currency":
				req.Currency = &s
			case "customer":
				req.Customer = &s
			default:
				req.Description = s
			}
		default:
			return req, false
		}
	}
	return req, true
}

// jsonInt returns the value of a JSON number token that is an integer
// within int64, as encoding/json decodes it into an int64.
func jsonInt(tok []byte) (int64, bool) {
	digits := tok
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 {
		return 0, false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(tok), 10, 64)
	return n, err == nil
}

// jsonString returns the value of a JSON string token with nothing to
// decode: no escapes, valid UTF-8.
func jsonString(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' {
		return "", false
	}
	raw := tok[1 : len(tok)-1]
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return "", false
	}
	return string(raw), true
}

// createPayment is the business handler of POST /payments. Behind the
// idempotency middleware it runs once per intent. Mounted bare, for the
// benchmark, it validates and commits on its own.
func (h *Handler) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	info, idem := idempotency.FromContext(ctx)
	req, ok := paymentOfRequest(w, r, info)
	if !ok {
		return
	}
	f := faultsFrom(ctx)
	if f.Has(FaultCrashAfterInsert) {
		panic(http.ErrAbortHandler) // the worker dies; the IN_PROGRESS record stays
	}
	id := info.StableID
	principal := info.ID.Principal
	if !idem {
		id = h.newPaymentID()
		principal = principalOf(r)
	}

	if err := h.holdWork(ctx, h.cfg.delay+delayOf(f)); err != nil {
		idempotency.NothingDone(ctx)
		(&problem{Type: problemUnavailable, Title: "Client went away", Status: http.StatusServiceUnavailable,
			Detail: "the request was cancelled before the payment was made; nothing was charged"}).Write(w)
		return
	}
	// Counted once the worker still holds its lease: a worker that lost
	// it does no work.
	if err := h.state.Count(ctx, fakestate.Executions); err != nil {
		h.internalError(w, r, err)
		return
	}
	if f.Has(FaultError) {
		idempotency.NothingDone(ctx)
		(&problem{Type: problemInjectedFault, Title: "Injected error", Status: http.StatusInternalServerError,
			Detail: "the error fault failed this request before the effect was committed; nothing was charged"}).Write(w)
		return
	}
	if !h.reserve(w, r, id, info, req) {
		return
	}
	ch, ok := h.chargeOnce(w, r, id, info, req)
	if !ok {
		return
	}
	if f.Has(FaultCrashAfterProvider) {
		panic(http.ErrAbortHandler) // charged, but nothing recorded
	}

	p := &payment{ID: id, Amount: ch.Amount, Currency: ch.Currency, Customer: ch.Customer, Description: req.Description,
		Status: "succeeded", CreatedAt: ch.CreatedAt, Principal: principal, Key: info.ID.Key}
	out, _ := json.Marshal(p)
	if err := idempotency.OnCommit(ctx, func(ctx context.Context) error { return h.state.AddPayment(ctx, p) }); err != nil {
		h.internalError(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+id)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(append(out, '\n'))
}

// paymentOfRequest returns the payment r asks for. Behind the layer it is
// the one validatePayment read, else the body parsed here. A body too
// large or not a payment is answered here, and it returns false.
func paymentOfRequest(w http.ResponseWriter, r *http.Request, info idempotency.Info) (paymentRequest, bool) {
	if req, ok := info.Validated.(paymentRequest); ok {
		return req, true
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		(&problem{Type: problemPayloadTooLarge, Title: "Payload too large", Status: http.StatusRequestEntityTooLarge,
			Detail: "the request body is over 1 MiB or could not be read"}).Write(w)
		return paymentRequest{}, false
	}
	req, prob := parsePayment(body)
	if prob != nil {
		prob.Write(w)
		return paymentRequest{}, false
	}
	return req, true
}

// reserve holds room for payment id before the provider is asked. So no
// charge is made that the ledger cannot record. A 5xx stores nothing.
// The record is released and the key stays unused. It answers a failure
// or a full ledger itself, and returns false.
func (h *Handler) reserve(w http.ResponseWriter, r *http.Request, id string, info idempotency.Info, req paymentRequest) bool {
	ctx := r.Context()
	reserved, err := h.state.Reserve(ctx, id, fakestate.Intent{Record: info.ID, Description: req.Description}, h.cfg.now())
	if err != nil {
		idempotency.NothingDone(ctx) // the provider was not asked
		h.internalError(w, r, err)
		return false
	}
	if !reserved {
		idempotency.NothingDone(ctx)
		(&problem{Type: problemStorageFull, Title: "Storage full", Status: http.StatusServiceUnavailable,
			Detail: "the server holds as many payments as it may; nothing was charged or stored under this key"}).Write(w)
		return false
	}
	return true
}

// chargeOnce charges payment id at the provider. After a dead worker
// (info.Takeover) it asks the provider first, and takes the charge it
// already made. It answers a decline or a failure itself, and returns
// false.
func (h *Handler) chargeOnce(w http.ResponseWriter, r *http.Request, id string, info idempotency.Info, req paymentRequest) (charge, bool) {
	ctx := r.Context()
	if info.Takeover {
		ch, charged, err := h.state.LookupCharge(ctx, id)
		if err != nil {
			h.internalError(w, r, err)
			return charge{}, false
		}
		if charged {
			return ch, true
		}
	}
	ch, err := h.state.Charge(ctx, charge{ID: id, Amount: *req.Amount, Currency: *req.Currency, Customer: *req.Customer,
		CreatedAt: h.cfg.now().UTC(), Record: info.ID, Description: req.Description})
	if errors.Is(err, errDeclined) {
		h.state.Declined(id)
		(&problem{Type: ProblemCardDeclined, Title: "Card declined", Status: http.StatusPaymentRequired,
			Detail: "the provider declined the card of customer " + strconv.Quote(*req.Customer)}).Write(w)
		return charge{}, false
	}
	if err != nil {
		h.internalError(w, r, err)
		return charge{}, false
	}
	return ch, true
}

// newPaymentID returns Options.NewID's id, else one that sorts by the
// injected clock's time.
func (h *Handler) newPaymentID() string {
	if h.cfg.newID != nil {
		return h.cfg.newID()
	}
	if h.instance != "" {
		return fmt.Sprintf("pay_%d_%d_%s", h.cfg.now().Unix(), h.seq.Add(1), h.instance)
	}
	return fmt.Sprintf("pay_%d_%d", h.cfg.now().Unix(), h.seq.Add(1))
}

func (h *Handler) getPayment(w http.ResponseWriter, r *http.Request, id string) {
	p, ok, err := h.state.Payment(r.Context(), principalOf(r), id)
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	if !ok {
		notFound("no payment " + strconv.Quote(id) + " for this caller").Write(w)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// listPayments serves GET /payments and, with ?idempotency_key=K, the
// reconcile lookup.
func (h *Handler) listPayments(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if q.Has("idempotency_key") {
		key, err := idempotency.ParseKey(q.Get("idempotency_key"))
		if err != nil {
			(&problem{Type: problemKeyInvalid, Title: "Idempotency-Key invalid", Status: http.StatusBadRequest, Detail: err.Error()}).Write(w)
			return
		}
		// The key is looked up in the form the middleware compares it in.
		h.lookup(w, r, idempotency.ID{Principal: principalOf(r), Key: idempotency.CanonicalKey(key, h.cfg.uuid)})
		return
	}
	list, err := h.state.Payments(r.Context(), principalOf(r))
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Data []*payment `json:"data"`
	}{list})
}

// putOrderStatus serves PUT /orders/{id}/status: naturally idempotent, so
// an Idempotency-Key is ignored.
func (h *Handler) putOrderStatus(w http.ResponseWriter, r *http.Request, id string) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		(&problem{Type: problemPayloadTooLarge, Title: "Payload too large", Status: http.StatusRequestEntityTooLarge,
			Detail: "the request body is over 1 MiB or could not be read"}).Write(w)
		return
	}
	var req struct {
		Status *string `json:"status"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		validationProblem("body is not a valid status change: " + jsonError(err)).Write(w)
		return
	}
	if req.Status == nil || *req.Status == "" {
		validationProblem(`"status" is required, such as "SHIPPED"`).Write(w)
		return
	}
	if utf8.RuneCountInString(*req.Status) > maxStatusLen {
		validationProblem(fmt.Sprintf(`"status" must be at most %d characters`, maxStatusLen)).Write(w)
		return
	}
	// PostgreSQL's text cannot hold U+0000: refused in memory too.
	if strings.ContainsRune(*req.Status, 0) {
		validationProblem(`"status" must not contain the character U+0000`).Write(w)
		return
	}
	if strings.ContainsRune(id, 0) {
		validationProblem("the order id must not contain the character U+0000").Write(w)
		return
	}
	f := faultsFrom(r.Context())
	if f.Has(FaultCrashAfterInsert) {
		panic(http.ErrAbortHandler) // the worker dies before the change
	}
	if err := h.wait(r.Context(), delayOf(f)); err != nil {
		return
	}
	if f.Has(FaultError) {
		(&problem{Type: problemInjectedFault, Title: "Injected error", Status: http.StatusInternalServerError,
			Detail: "the error fault failed this request; nothing changed"}).Write(w)
		return
	}
	stored, err := h.state.SetOrderStatus(r.Context(), principalOf(r), id, *req.Status)
	if err == nil && stored && f.Has(FaultCrashAfterProvider) {
		panic(http.ErrAbortHandler) // the change is made, and the worker dies before answering
	}
	if err != nil {
		h.internalError(w, r, err)
		return
	}
	if !stored {
		(&problem{Type: problemStorageFull, Title: "Storage full", Status: http.StatusServiceUnavailable,
			Detail: "the server holds as many orders as it may; nothing was changed"}).Write(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"id": id, "status": *req.Status})
}

// internalError answers 500 for a failure of the server's own state. The
// error goes to Options.Logger. The answer says nothing internal. A
// database's message names tables, indexes and settings.
func (h *Handler) internalError(w http.ResponseWriter, r *http.Request, err error) {
	if h.cfg.logger != nil {
		h.cfg.logger.LogAttrs(r.Context(), slog.LevelError, "internal error",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	(&problem{Type: problemInternal, Title: "Internal server error", Status: http.StatusInternalServerError,
		Detail: "the server failed; retry later"}).Write(w)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	out, err := json.Marshal(v)
	if err != nil { // cannot happen: the values are payments, stats and maps of strings
		(&problem{Type: problemInternal, Title: "Internal server error", Status: http.StatusInternalServerError}).Write(w)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(append(out, '\n'))
}

// wait waits d with Options.Sleep, or until ctx is done.
func (h *Handler) wait(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	return h.cfg.sleep(ctx, d)
}

// sleep waits d in real time, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
