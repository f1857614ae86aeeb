package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// link is a Markdown inline link's target: [text](target).
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinks checks the documents' links.
func TestLinks(t *testing.T) {
	// Every link of the documents that is not to another site names a file
	// or directory of the repository, and a #fragment names a heading of its
	// document.
	t.Run("relative links resolve", func(t *testing.T) {
		checked := 0
		for _, doc := range documents(t) {
			text := read(t, doc)
			rel, _ := filepath.Rel(root, doc)
			for _, m := range link.FindAllStringSubmatch(outsideCode(text), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				path, fragment, _ := strings.Cut(target, "#")
				file := doc
				if path != "" {
					file = filepath.Join(filepath.Dir(doc), filepath.FromSlash(path))
					if _, err := os.Stat(file); err != nil {
						t.Errorf("%s: link %q: no such file or directory", rel, target)
						continue
					}
				}
				if fragment != "" {
					assert.Contains(t, anchors(read(t, file)), fragment, "%s: link %q: no such heading", rel, target)
				}
			}
		}
		assert.Positive(t, checked)
	})
}

// outsideCode returns text without its fenced code blocks.
func outsideCode(text string) string {
	var b strings.Builder
	in := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			in = !in
			continue
		}
		if !in {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// anchors returns the fragments GitHub gives a document's headings.
func anchors(text string) []string {
	var out []string
	for _, line := range strings.Split(outsideCode(text), "\n") {
		h, ok := strings.CutPrefix(line, "#")
		if !ok {
			continue
		}
		h = strings.TrimLeft(h, "#")
		if !strings.HasPrefix(h, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') || r > 127:
				b.WriteRune(r)
			}
		}
		out = append(out, b.String())
	}
	return out
}
