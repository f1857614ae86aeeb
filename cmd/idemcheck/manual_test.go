package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/cmd/idemcheck/internal/contractcheck"
)

// TestManual checks idemcheck's manual, docs/IDEMCHECK.md.
func TestManual(t *testing.T) {
	// Idemcheck's manual, docs/IDEMCHECK.md, names every row in its table
	// and in its real run, so that a new row cannot ship undocumented.
	t.Run("describes every row", func(t *testing.T) {
		manual, err := os.ReadFile("../../docs/IDEMCHECK.md")
		require.NoError(t, err)
		doc := string(manual)
		for _, r := range contractcheck.Rows() {
			assert.True(t, strings.Contains(doc, "| `"+r.ID+"`") || strings.Contains(doc, ", `"+r.ID+"`"),
				"the manual's row table has no %s", r.ID)
			assert.True(t, strings.Contains(doc, "PASS "+r.ID), "the manual's real run has no PASS %s", r.ID)
		}
	})
}
