package persist_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idemkit/idem/persist"
)

// An app opens its store at start, resumes the intents whose outcome is
// unknown, and prunes the old resolved ones.
func ExampleOpenDir() {
	tmp, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)

	ctx := context.Background()
	s, err := persist.OpenDir(filepath.Join(tmp, "intents"), &persist.Options{DiscardResponseBodies: true})
	if err != nil {
		log.Fatal(err) // for example persist.ErrLocked: another instance runs
	}
	defer s.Close()

	created := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	rec := &persist.Record{
		Key: "550e8400-e29b-41d4-a716-446655440000", Name: "checkout:cart-42", Seq: 1,
		Method: "POST", URL: "https://api.example.com/v1/payments", Body: []byte(`{"amount":1999}`),
		CreatedAt: created, UpdatedAt: created, State: persist.StateNew,
		Rev: persist.NewRev(),
	}
	// Written before the first attempt is sent, as the action's latest
	// intent (no old version): if this fails, send nothing.
	if err := s.Write(ctx, rec, nil); err != nil {
		log.Fatal(err)
	}

	unresolved, err := s.List(ctx, persist.Filter{Unresolved: true})
	if err != nil {
		log.Print(err) // unreadable records; the readable ones are listed
	}
	for _, r := range unresolved {
		fmt.Println("resume", r.Name, r.Key)
	}

	// The outcome replaces the version written above, only if it is
	// still the stored one.
	done := rec.Clone()
	done.Rev = persist.NewRev()
	done.State, done.UpdatedAt = persist.StateSucceeded, created.Add(time.Second)
	done.Response = &persist.Response{StatusCode: 201, Body: []byte(`{"id":"pay_1"}`)}
	if err := s.Write(ctx, done, rec); err != nil {
		log.Fatal(err)
	}
	// Thirty days later, delete the resolved intents last updated before then.
	cutoff := created.Add(30 * 24 * time.Hour)
	n, err := persist.PruneFunc(ctx, s, func(r *persist.Record) bool { return r.UpdatedAt.Before(cutoff) })
	fmt.Println("pruned", n, err)
	// Output:
	// resume checkout:cart-42 550e8400-e29b-41d4-a716-446655440000
	// pruned 1 <nil>
}

// An app that finds damaged intent files at start lists them all, has them
// looked at, and moves them aside; the readable intents go on meanwhile.
func ExampleFileStore_Quarantine() {
	tmp, err := os.MkdirTemp("", "idem-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "intents")
	ctx := context.Background()

	// A store with two intents, one of whose files is then damaged.
	s, err := persist.OpenDir(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	for _, key := range []string{"key-1", "key-2"} {
		r := &persist.Record{Key: key, Name: "checkout:" + key, Method: "POST", URL: "https://api.example.com/v1/payments",
			State: persist.StatePending, CreatedAt: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Rev: persist.NewRev()}
		if err := s.Write(ctx, r, nil); err != nil {
			log.Fatal(err)
		}
	}
	s.Close()
	damaged, _ := filepath.Glob(filepath.Join(dir, "k-*.json"))
	if err := os.WriteFile(damaged[0], []byte("{"), 0o600); err != nil {
		log.Fatal(err)
	}

	s, err = persist.OpenDir(dir, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close()
	recs, err := s.List(ctx, persist.Filter{Unresolved: true})
	for _, r := range recs {
		fmt.Println("resume", r.Key)
	}
	for _, ce := range persist.CorruptErrors(err) {
		// Log ce (it names the file and the key), have the payment it may
		// hold checked, then move the file aside.
		fmt.Println("damaged", ce.Key)
		if _, err := s.Quarantine(ctx, ce.Path); err != nil {
			log.Fatal(err)
		}
	}
	_, err = s.List(ctx, persist.Filter{})
	fmt.Println("damaged files left:", len(persist.CorruptErrors(err)))
	// Output:
	// resume key-2
	// damaged key-1
	// damaged files left: 0
}
