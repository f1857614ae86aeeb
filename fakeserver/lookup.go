package fakeserver

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// lookup answers GET /payments?idempotency_key=K for the record id. It
// answers the payment made under the key's latest intent. It answers 409
// while that intent is unsettled. It answers 404 when nothing was
// charged for it. Other work under the key, an app's order say, answers
// its stored answer.
//
// The key's live record decides first. A key used again after its
// retention is a new intent, whatever the key paid before. A COMPLETED
// record answers its own payment, or none after a decline. An IN_PROGRESS
// one answers 409 while its lease is alive. Once the lease has ended, it
// is recovered as a takeover would. The provider is asked for the
// record's stable id, and what it charged is recorded and answered.
// Without a live record, the key's latest intent to charge is asked
// about (see recoverCharged).
func (h *Handler) lookup(w http.ResponseWriter, r *http.Request, id idempotency.ID) {
	ctx := r.Context()
	// A second round only if a record appeared while the first found
	// none. A request under the key began meanwhile.
	for range 2 {
		now := h.cfg.now()
		rec, live, err := h.state.Record(ctx, id, now)
		if err != nil {
			h.lookupError(w, r, err)
			return
		}
		var (
			p    *payment
			paid bool
		)
		switch {
		case live && rec.Status == idempotency.StatusCompleted:
			p, paid, err = h.state.Payment(ctx, id.Principal, rec.StableID)
			if err == nil && !paid && didOtherWork(rec.Response) {
				writeStored(w, rec.Response)
				return
			}
		case live:
			// The store's clock decides whether the lease has ended. The
			// takeover in recoverRecord is refused while it is alive.
			var settled bool
			p, settled, err = h.recoverRecord(ctx, rec, now)
			if err == nil && !settled {
				// The worker's lease is alive, another request holds the
				// record, or the provider has no charge for it yet. A
				// resend with the key settles it. The time left is
				// counted on the store's clock.
				at := now
				if !rec.ReadAt.IsZero() {
					at = rec.ReadAt
				}
				inProgress(w, secondsUntil(rec.LockedUntil, at))
				return
			}
			paid = p != nil
		default:
			p, paid, err = h.recoverCharged(ctx, id)
			if err == nil && !paid {
				if _, began, err := h.state.Record(ctx, id, h.cfg.now()); err == nil && began {
					continue
				}
			}
		}
		switch {
		case err != nil:
			h.lookupError(w, r, err)
		case paid:
			writeJSON(w, http.StatusOK, p)
		default:
			(&problem{Type: problemKeyUnused, Title: "Idempotency-Key unused", Status: http.StatusNotFound,
				Detail: "nothing was done under this key for this caller"}).Write(w)
		}
		return
	}
	inProgress(w, 1)
}

// didOtherWork reports whether a completed record without a payment
// answers other work: an app's order, say. Only a declined payment did
// nothing. The key is used, so the lookup never calls it unused.
func didOtherWork(resp *idempotency.Response) bool {
	if resp == nil {
		return false
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(resp.Body, &p)
	return resp.StatusCode != http.StatusPaymentRequired || p.Type != ProblemCardDeclined
}

// writeStored answers the record's stored answer. It is the server's
// word on what the key did.
func writeStored(w http.ResponseWriter, resp *idempotency.Response) {
	for k, v := range resp.Header {
		w.Header()[k] = append([]string(nil), v...)
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(resp.Body)
}

// lookupError answers a lookup whose store failed. The store may have
// reached a standby (idempotency.ErrUnavailable). It may have got no
// answer in time (context.DeadlineExceeded). Then it cannot say what was
// done. The answer is 503 with Retry-After, as for a POST then. So the
// client asks again. Any other failure is a 500.
func (h *Handler) lookupError(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, idempotency.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		h.internalError(w, r, err)
		return
	}
	if h.cfg.logger != nil {
		h.cfg.logger.LogAttrs(r.Context(), slog.LevelWarn, "the store cannot answer the lookup now",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	}
	w.Header().Set("Retry-After", "1")
	(&problem{Type: problemInternal, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: "the server cannot read its records from its primary database now; retry the lookup after the Retry-After delay"}).Write(w)
}

func inProgress(w http.ResponseWriter, secs int64) {
	w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	(&problem{Type: problemRequestInProgress, Title: "Request in progress", Status: http.StatusConflict,
		Detail: "a request under this key is in progress or its worker died before finishing; resend it with the same key to settle it"}).Write(w)
}

// secondsUntil is t - now in whole seconds, rounded up, at least 1.
func secondsUntil(t, now time.Time) int64 {
	secs := int64(1)
	if left := t.Sub(now); left > time.Second {
		secs = int64((left + time.Second - 1) / time.Second)
	}
	return secs
}

// recoverRecord settles the IN_PROGRESS record rec as a takeover does.
// Its worker's lease has ended at now. It takes the record over and asks
// the provider for its stable id. If the provider charged it, it records
// the payment. It completes the record with the worker's answer, so that
// a resend replays it. settled is false when another request took the
// record over first. It is false too when the provider has no charge for
// it. The record is then left as it was found, its lease ended. Only a
// resend, which may charge, settles that.
func (h *Handler) recoverRecord(ctx context.Context, rec *idempotency.Record, now time.Time) (p *payment, settled bool, err error) {
	store := h.state.Records()
	owner := rand.Text()
	until := now.Add(h.cfg.lease)
	won, err := store.TakeOver(ctx, rec.ID, rec.Owner, owner, now, until)
	if err != nil || !won {
		return nil, false, err
	}
	giveUp := func() {
		_, _ = store.TakeOver(context.WithoutCancel(ctx), rec.ID, owner, "", now, now)
	}
	ch, charged, err := h.state.LookupCharge(ctx, rec.StableID)
	if err != nil || !charged {
		giveUp()
		return nil, false, err
	}
	intent, _, err := h.state.Intent(ctx, rec.StableID)
	if err != nil {
		giveUp()
		return nil, false, err
	}
	intent.Record = rec.ID
	p = intent.Payment(rec.StableID, ch)
	body, err := json.Marshal(p)
	if err != nil {
		giveUp()
		return nil, false, err
	}
	resp := &idempotency.Response{StatusCode: http.StatusCreated, Body: append(body, '\n'), Header: http.Header{
		"Content-Type": {"application/json"}, "Location": {"/payments/" + p.ID}}}
	err = store.Complete(ctx, rec.ID, owner, resp, func(ctx context.Context) error { return h.state.AddPayment(ctx, p) })
	if errors.Is(err, idempotency.ErrNotOwner) {
		return nil, false, nil
	}
	if err != nil {
		giveUp()
		return nil, false, err
	}
	return p, true, nil
}
