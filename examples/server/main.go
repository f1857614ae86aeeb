// Command payments is a payment endpoint behind idem's middleware, its
// records, payments and API tokens in one PostgreSQL database.
// docs/SERVER.md shows this file whole.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dunglas/httpsfv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/server/faulthook"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	hookAddr := flag.String("fault-hook", "", "serve idemcheck's fault hook on this address (off when empty; never a public one)")
	flag.Parse()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	// Lets the store see a commit whose wait for a synchronous standby
	// was canceled (see "Durability and replication").
	pgstore.ConfigurePool(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil { // safe on every start, from every process
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, tables); err != nil {
		log.Fatal(err)
	}
	// Open refuses a database that would lose records: fsync off, a
	// standby, or asynchronous standbys (see "Durability and replication").
	store, err := pgstore.Open(ctx, pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	var hook *faulthook.Hook
	if *hookAddr != "" { // off by default: see "Certifying it with idemcheck"
		hook = faulthook.New(func(ctx context.Context) (faulthook.Stats, error) {
			var n int
			err := pool.QueryRow(ctx, "SELECT count(*) FROM payments").Scan(&n)
			return faulthook.Stats{Payments: n, ProviderCharges: n}, err // no provider: the row is the charge
		})
		go func() { log.Fatal(serve(*hookAddr, hook)) }()
	}
	go func() { // delete expired records every few minutes
		for range time.Tick(5 * time.Minute) {
			if _, err := store.Sweep(ctx, time.Now()); err != nil {
				log.Print(err)
			}
		}
	}()
	log.Printf("listening on %s", *addr)
	log.Fatal(serve(*addr, routes(pool, store, hook)))
}

// tables are the app's own. A token is kept as its SHA-256, never as
// itself; an operator adds one with INSERT INTO api_tokens
// VALUES (encode(sha256(convert_to('TOKEN', 'UTF8')), 'hex'), 'ACCOUNT').
const tables = `
	CREATE TABLE IF NOT EXISTS payments (
		id              text        PRIMARY KEY,
		account         text        NOT NULL,
		idempotency_key text        NOT NULL,
		amount          bigint      NOT NULL,
		currency        text        NOT NULL,
		created_at      timestamptz NOT NULL DEFAULT now());
	CREATE INDEX IF NOT EXISTS payments_by_key ON payments (account, idempotency_key, created_at);
	CREATE TABLE IF NOT EXISTS api_tokens (
		digest  text PRIMARY KEY,
		account text NOT NULL)`

// routes is the API, every route behind authenticate. A non-nil hook
// fails the payments it is told to (idemcheck's fault rows).
func routes(pool *pgxpool.Pool, store *pgstore.Store, hook *faulthook.Hook) http.Handler {
	work := http.Handler(http.HandlerFunc(pay))
	if hook != nil {
		work = hook.Wrap(work) // inside the middleware, which sees the work fail
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", idempotency.New(work, idempotency.Config{
		Store:          store,
		OneTransaction: true,            // the payment is a row of this database: one commit per key
		Retention:      24 * time.Hour,  // publish it
		Validate:       validatePayment, // a bad body is a 400 and leaves the key free
		Principal:      accountOf,       // required: the account, never the credential
	}))
	// The lookup by key: GET /payments?idempotency_key=K.
	mux.Handle("GET /payments", lookup(pool, store))
	return authenticate(pool, mux)
}

// serve is http.ListenAndServe with bounds on a slow client.
func serve(addr string, h http.Handler) error {
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	return srv.ListenAndServe()
}

type accountKey struct{}

// authenticate admits a request whose bearer token is in api_tokens, and
// puts the token's account in its context; any other gets 401. Every
// route is behind it.
func authenticate(pool *pgxpool.Pool, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		var account string
		if ok && token != "" && len(token) <= 512 {
			sum := sha256.Sum256([]byte(token))
			err := pool.QueryRow(r.Context(), "SELECT account FROM api_tokens WHERE digest = $1",
				hex.EncodeToString(sum[:])).Scan(&account)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				log.Printf("authenticate: %v", err)
				http.Error(w, "service unavailable", http.StatusServiceUnavailable)
				return
			}
		}
		if account == "" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="payments"`)
			http.Error(w, "a valid bearer token is required", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// accountOf returns the account the request acts for, as authenticate
// found it: never the token, which a refresh changes. Every token of one
// account is one caller, so a retry after a refresh replays.
func accountOf(r *http.Request) string {
	account, _ := r.Context().Value(accountKey{}).(string)
	return account
}

type payment struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
}

// validatePayment runs before the key is looked at: its problem is answered
// and nothing is stored.
func validatePayment(r *http.Request, body []byte) (any, *idempotency.Problem) {
	var p payment
	if err := json.Unmarshal(body, &p); err != nil || p.Amount <= 0 || len(p.Currency) != 3 {
		return nil, &idempotency.Problem{Type: "https://example.com/problems/invalid-payment",
			Title: "Invalid payment", Status: http.StatusBadRequest,
			Detail: "amount must be a positive integer and currency three letters"}
	}
	return p, nil
}

func pay(w http.ResponseWriter, r *http.Request) {
	info, _ := idempotency.FromContext(r.Context())
	p := info.Validated.(payment)
	// The payment row commits with the COMPLETED record, or neither does.
	err := idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
		tx, ok := pgstore.Tx(ctx)
		if !ok {
			return errors.New("pay: not inside pgstore's transaction")
		}
		_, err := tx.Exec(ctx, `INSERT INTO payments (id, account, idempotency_key, amount, currency)
			VALUES ($1, $2, $3, $4, $5)`, info.StableID, info.ID.Principal, info.ID.Key, p.Amount, p.Currency)
		return err
	})
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+info.StableID)
	w.WriteHeader(http.StatusCreated) // stored with the record, replayed to retries
	_ = json.NewEncoder(w).Encode(map[string]any{"id": info.StableID, "amount": p.Amount, "currency": p.Currency})
}

// lookup answers GET /payments?idempotency_key=K: the payment the
// caller made under K (200), 409 while K's request runs, and 404 of type
// idempotency-key-unused only when nothing was done under K. A client
// whose outcome is unknown settles it there without paying again.
func lookup(pool *pgxpool.Pool, store *pgstore.Store) http.Handler {
	problem := func(w http.ResponseWriter, status int, kind, detail string) {
		(&idempotency.Problem{Type: "https://idem.dev/problems/" + kind, Title: http.StatusText(status),
			Status: status, Detail: detail}).Write(w)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("idempotency_key") {
			problem(w, http.StatusBadRequest, "bad-request", "give ?idempotency_key=K")
			return
		}
		raw := q.Get("idempotency_key")
		idempotency.MarkLookup(w, r, raw) // the server's mark; no cache keeps it
		key, ok := parseKey(raw)
		if !ok {
			problem(w, http.StatusBadRequest, "idempotency-key-invalid", "a key is 1 to 255 visible ASCII characters")
			return
		}
		ctx, account := r.Context(), accountOf(r)
		rec, found, err := store.Get(ctx, idempotency.ID{Principal: account, Key: key}, time.Now())
		var id string
		switch {
		case errors.Is(err, idempotency.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded):
			w.Header().Set("Retry-After", "1") // a standby, or no connection in time: ask again
			problem(w, http.StatusServiceUnavailable, "internal-error", "the records cannot be read now")
			return
		case err != nil:
			log.Printf("lookup: %v", err)
			problem(w, http.StatusInternalServerError, "internal-error", "internal error")
			return
		case found && rec.Status != idempotency.StatusCompleted:
			w.Header().Set("Retry-After", "1")
			problem(w, http.StatusConflict, "request-in-progress", "a request under this key is running; ask again")
			return
		case found:
			id = rec.StableID
		}
		// Without a live record (its retention ended), the payment
		// remembers its key.
		var out struct {
			ID       string `json:"id"`
			Amount   int64  `json:"amount"`
			Currency string `json:"currency"`
		}
		query, args := "SELECT id, amount, currency FROM payments WHERE id = $1", []any{id}
		if id == "" {
			query, args = `SELECT id, amount, currency FROM payments
				WHERE account = $1 AND idempotency_key = $2 ORDER BY created_at DESC LIMIT 1`, []any{account, key}
		}
		switch err := pool.QueryRow(ctx, query, args...).Scan(&out.ID, &out.Amount, &out.Currency); {
		case errors.Is(err, pgx.ErrNoRows):
			problem(w, http.StatusNotFound, "idempotency-key-unused", "nothing was done under this key")
		case err != nil:
			log.Printf("lookup: %v", err)
			problem(w, http.StatusInternalServerError, "internal-error", "internal error")
		default:
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(out)
		}
	})
}

// parseKey reads a key as the middleware does: bare (K) or as an RFC 8941
// string ("K"), 1 to 255 visible ASCII characters.
func parseKey(raw string) (string, bool) {
	key := raw
	if strings.HasPrefix(raw, `"`) {
		item, err := httpsfv.UnmarshalItem([]string{raw})
		if key, _ = item.Value.(string); err != nil {
			return "", false
		}
	}
	if key == "" || len(key) > 255 {
		return "", false
	}
	for i := range len(key) {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", false
		}
	}
	return key, true
}
