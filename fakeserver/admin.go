package fakeserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// adminPrefix is the path prefix of the admin endpoints. Requests under it
// need no key, are not scoped, counted or faulted.
const adminPrefix = "/_fake/"

// faultRequest is the body of POST /_fake/faults.
type faultRequest struct {
	Fault      *string         `json:"fault"`
	Key        string          `json:"key"`
	Caller     string          `json:"caller"`
	Path       string          `json:"path"`
	Count      int             `json:"count"`
	DelayMS    int64           `json:"delay_ms"`
	Status     int             `json:"status"`
	RetryAfter json.RawMessage `json:"retry_after"`
}

// faultJSON is how an injected fault is echoed back.
type faultJSON struct {
	Fault      FaultKind `json:"fault"`
	Key        string    `json:"key,omitempty"`
	Caller     string    `json:"caller,omitempty"`
	Path       string    `json:"path,omitempty"`
	Count      int       `json:"count"`
	DelayMS    int64     `json:"delay_ms,omitempty"`
	Status     int       `json:"status,omitempty"`
	RetryAfter string    `json:"retry_after,omitempty"`
}

// maxDelayMS bounds delay_ms, so that the conversion cannot overflow.
const maxDelayMS = int64(24 * time.Hour / time.Millisecond)

func (h *Handler) serveAdmin(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimPrefix(r.URL.Path, adminPrefix) {
	case "stats":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET, HEAD")
			return
		}
		st, err := h.stats(r.Context())
		if err != nil {
			h.internalError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, st)
	case "faults":
		switch r.Method {
		case http.MethodPost:
			h.postFault(w, r)
		case http.MethodDelete:
			h.ClearFaults()
			w.WriteHeader(http.StatusNoContent)
		default:
			methodNotAllowed(w, "POST, DELETE")
		}
	case "sweep":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST")
			return
		}
		writeJSON(w, http.StatusOK, map[string]int{"deleted": h.Sweep()})
	case "reset":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST")
			return
		}
		if err := h.reset(r.Context()); err != nil {
			h.internalError(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		notFound("admin endpoints: GET /_fake/stats, POST and DELETE /_fake/faults, POST /_fake/sweep, POST /_fake/reset").Write(w)
	}
}

func (h *Handler) postFault(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		(&problem{Type: problemPayloadTooLarge, Title: "Payload too large", Status: http.StatusRequestEntityTooLarge,
			Detail: "the request body is over 1 MiB or could not be read"}).Write(w)
		return
	}
	f, err := decodeFault(body)
	if err != nil {
		validationProblem(err.Error()).Write(w)
		return
	}
	if f, err = h.prepare(f); err != nil {
		validationProblem(strings.TrimPrefix(err.Error(), "fakeserver: ")).Write(w)
		return
	}
	if err := h.addRule(f.rule()); err != nil {
		(&problem{Type: problemStorageFull, Title: "Too many faults", Status: http.StatusServiceUnavailable,
			Detail: fmt.Sprintf("%d faults are pending; DELETE /_fake/faults clears them", maxFaults)}).Write(w)
		return
	}
	writeJSON(w, http.StatusCreated, faultJSON{Fault: f.Kind, Key: f.Key, Caller: shownCaller(f.Caller), Path: f.Path, Count: f.Count,
		DelayMS: f.Delay.Milliseconds(), Status: f.Status, RetryAfter: f.RetryAfter})
}

// shownCaller is how the echo names a fault's caller. A test token's
// account is shown. Any other value may be a credential, and is not.
func shownCaller(caller string) string {
	if caller == "" {
		return ""
	}
	if _, ok := accountOf(caller); ok {
		return callerOf(caller)
	}
	return "(an Authorization value, not shown)"
}

// decodeFault reads a POST /_fake/faults body into a Fault.
func decodeFault(body []byte) (Fault, error) {
	var req faultRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Fault{}, errors.New("body is not a valid fault: " + jsonError(err) +
			`; send {"fault": NAME, "key": K?, "caller": AUTHORIZATION?, "path": P?, "count": N?, "delay_ms": D?, "status": S?, "retry_after": R?}`)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Fault{}, errors.New("body has data after the JSON object")
	}
	if req.Fault == nil {
		return Fault{}, errors.New(`"fault" is required; valid faults: ` + validFaultNames())
	}
	if req.DelayMS < 0 || req.DelayMS > maxDelayMS {
		return Fault{}, errors.New(`"delay_ms" must be from 0 to 86400000`)
	}
	f := Fault{Kind: FaultKind(*req.Fault), Key: req.Key, Caller: req.Caller, Path: req.Path, Count: req.Count,
		Delay: time.Duration(req.DelayMS) * time.Millisecond, Status: req.Status}
	if ra := bytes.TrimSpace(req.RetryAfter); len(ra) > 0 && string(ra) != "null" {
		switch ra[0] {
		case '"':
			if err := json.Unmarshal(ra, &f.RetryAfter); err != nil {
				return Fault{}, errors.New(`"retry_after" is not a valid string`)
			}
		default:
			n, err := strconv.ParseInt(string(ra), 10, 64)
			if err != nil || n < 0 {
				return Fault{}, errors.New(`"retry_after" must be a string or a whole number of seconds >= 0`)
			}
			f.RetryAfter = strconv.FormatInt(n, 10)
		}
	}
	return f, nil
}
