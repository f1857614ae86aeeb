package persisttest_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/persist"
	"github.com/idemkit/idem/persist/persisttest"
)

// recorder is a testing.TB that records failures instead of failing.
type recorder struct {
	testing.TB
	failed bool
}

func (r *recorder) Helper()               {}
func (r *recorder) Errorf(string, ...any) { r.failed = true }

func TestAssertRecord(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.FixedZone("CET", 3600))
	want := persisttest.NewRecord("k", at)

	same := want.Clone()
	same.CreatedAt = at.UTC() // another location, same instant
	same.UpdatedAt = at.UTC()
	same.Version = persist.FormatVersion
	r := &recorder{TB: t}
	if !persisttest.AssertRecord(r, want, same) || r.failed {
		t.Error("a record equal modulo encoding is reported as different")
	}

	for name, change := range map[string]func(){
		"body":  func() { same.Body = []byte("other") },
		"state": func() { same.State = "pending" },
		"time":  func() { same.CreatedAt = at.Add(time.Nanosecond) },
	} {
		same = want.Clone()
		same.Version = persist.FormatVersion
		change()
		r := &recorder{TB: t}
		if persisttest.AssertRecord(r, want, same) || !r.failed {
			t.Errorf("a record with another %s passes", name)
		}
	}
	r = &recorder{TB: t}
	if persisttest.AssertRecord(r, want, nil) || !r.failed {
		t.Error("a nil record passes")
	}
}
