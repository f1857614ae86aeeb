package doccheck

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// root is the repository's root, relative to this package.
const root = "../.."

// documents are the Markdown files whose snippets and links are checked.
func documents(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	docs = append(docs,
		filepath.Join(root, "README.md"),
		filepath.Join(root, "CHANGELOG.md"),
		filepath.Join(root, "mobile", "README.md"))
	for _, d := range docs {
		_, err := os.Stat(d)
		require.NoError(t, err)
	}
	return docs
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}
