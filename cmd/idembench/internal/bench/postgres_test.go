package bench

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestRunPostgresTiny(t *testing.T) {
	cfg := PGConfig{Requests: 20, Concurrencies: []int{1, 4}, Batch: 5, StormRequests: 30, StormDelay: 50 * time.Millisecond}
	rep, err := RunPostgres(context.Background(), pgtest.DSN(t), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Concurrencies {
		rs := rep.ByConcurrency[c]
		if len(rs) != 5 {
			t.Fatalf("concurrency %d: %d variants, want 5", c, len(rs))
		}
		for _, r := range rs {
			if r.Requests != cfg.Requests || r.P50 <= 0 {
				t.Errorf("concurrency %d, %s: %d requests, p50 %v", c, r.Name, r.Requests, r.P50)
			}
		}
	}
	s := rep.Storm
	if s.Executions != 1 || s.Created != 1 || s.Created+s.Replayed+s.InProgress != cfg.StormRequests {
		t.Errorf("storm: %+v; want one execution, one fresh 201, the rest replays or 409s", s)
	}
	var out bytes.Buffer
	rep.Print(&out)
	if o := rep.OtherKeys; o == nil || o.Calm <= 0 || o.Storm <= 0 {
		t.Errorf("other keys: %+v; want a p50 calm and during the storm", o)
	}
	if !strings.Contains(out.String(), "one transaction, fresh key") || !strings.Contains(out.String(), "executions 1 (must be 1)") ||
		!regexp.MustCompile(`(?m)^ratio pg-fresh-1tx/bare: \d+\.\d\d$`).MatchString(out.String()) {
		t.Errorf("report:\n%s", out.String())
	}
}
