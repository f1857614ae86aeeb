package sim

import (
	"slices"
	"testing"
)

// A seed alone replays a run: the same events in the same order at the
// same times, the same keys, the same figures.
func TestSimulationReplaysFromItsSeed(t *testing.T) {
	for _, seed := range []uint64{7, 8, 9} {
		var first, second []string
		cfg := config{Seed: seed, Actions: 200, Faults: defaultFaults()}
		cfg.Trace = func(s string) { first = append(first, s) }
		a := run(cfg)
		cfg.Trace = func(s string) { second = append(second, s) }
		b := run(cfg)
		if len(first) < 100 {
			t.Fatalf("seed %d: only %d trace lines", seed, len(first))
		}
		if i := slices.Compare(first, second); i != 0 {
			for j := range min(len(first), len(second)) {
				if first[j] != second[j] {
					t.Fatalf("seed %d: runs part at line %d:\n%s\n%s", seed, j, first[j], second[j])
				}
			}
			t.Fatalf("seed %d: %d and %d trace lines", seed, len(first), len(second))
		}
		if a.Stats.Actions != b.Stats.Actions || a.Stats.Charges != b.Stats.Charges || a.Stats.Attempts != b.Stats.Attempts {
			t.Fatalf("seed %d: figures differ: %+v and %+v", seed, a.Stats, b.Stats)
		}
	}
}
