package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/contractcheck"
)

// TestREADMEDescribesEveryRow: the README's idemcheck section names every
// row, so that a new row cannot ship undocumented.
func TestREADMEDescribesEveryRow(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, section, ok := strings.Cut(string(readme), "## Certifying a server: idemcheck")
	require.True(t, ok, "README has no idemcheck section")
	section, _, _ = strings.Cut(section, "\n## ")
	for _, r := range contractcheck.Rows() {
		assert.True(t, strings.Contains(section, "`"+r.ID+"`"), "the README's row table has no %s", r.ID)
		assert.True(t, strings.Contains(section, "PASS "+r.ID), "the README's real run has no PASS %s", r.ID)
	}
}
