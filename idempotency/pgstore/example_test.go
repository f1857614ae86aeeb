package pgstore_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idempotency/pgstore"
)

// A payment endpoint behind the middleware, on PostgreSQL. The payment row
// is written through the transaction that marks the record COMPLETED.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgstore.Migrate(ctx, pool); err != nil { // safe on every start
		log.Fatal(err)
	}
	store := pgstore.New(pool, nil)

	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		info, _ := idempotency.FromContext(r.Context())
		// info.StableID is the same on every attempt: give it to an external
		// provider as its idempotency key.
		err := idempotency.OnCommit(r.Context(), func(ctx context.Context) error {
			tx, ok := pgstore.Tx(ctx)
			if !ok {
				return errors.New("not inside pgstore's Complete")
			}
			_, err := tx.Exec(ctx, "INSERT INTO payments (id, amount) VALUES ($1, $2)", info.StableID, 1500)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"` + info.StableID + `"}`))
	})

	mux := http.NewServeMux()
	mux.Handle("POST /payments", authenticate(idempotency.New(pay, idempotency.Config{
		Store: store,
		// The account the request acts for, as the authentication in front
		// of the middleware found it: a refreshed token is the same caller.
		Principal: func(r *http.Request) string { return accountOf(r.Context()) },
		Retention: 24 * time.Hour,
		Lease:     30 * time.Second,
	})))

	// Delete expired records every few minutes.
	go func() {
		for range time.Tick(5 * time.Minute) {
			if _, err := store.Sweep(ctx, time.Now()); err != nil {
				log.Print(err)
			}
		}
	}()
	log.Fatal(http.ListenAndServe(":8080", mux))
}

type accountKey struct{}

// authenticate stands for the server's own authentication: it finds the
// account a request's credential belongs to and puts it in the context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := lookUpAccount(r.Header.Get("Authorization"))
		if !ok {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

func accountOf(ctx context.Context) string { s, _ := ctx.Value(accountKey{}).(string); return s }

// lookUpAccount stands for the server's token check.
func lookUpAccount(authorization string) (string, bool) { return "acct_1", authorization != "" }
