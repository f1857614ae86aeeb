package doccheck

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// maxREADMEWords bounds the README, counted as wc -w counts: what a new
// user reads before the first line of code should fit a screen or two.
const maxREADMEWords = 1800

// TestREADME checks the README's length.
func TestREADME(t *testing.T) {
	t.Run("is short", func(t *testing.T) {
		words := len(strings.Fields(read(t, filepath.Join(root, "README.md"))))
		assert.LessOrEqual(t, words, maxREADMEWords, "README.md has %d words; move the detail to docs/ or the package docs", words)
	})
}
