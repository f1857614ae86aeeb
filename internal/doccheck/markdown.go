package doccheck

import (
	"bufio"
	"strings"
)

// Block is a fenced code block of a Markdown document.
type Block struct {
	Lang   string // the fence's info string, "go" for Go
	Marker string // the doccheck comment on the line before the fence, without "<!-- doccheck:" and "-->"
	Line   int    // the line of the opening fence, from 1
	Text   string // the lines inside the fence, each ending in a newline
}

// Blocks returns the fenced code blocks of doc, in order.
func Blocks(doc string) []Block {
	var out []Block
	var cur *Block
	var prev string
	sc := bufio.NewScanner(strings.NewReader(doc))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &Block{Lang: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), Line: n}
			if m, ok := strings.CutPrefix(strings.TrimSpace(prev), "<!-- doccheck:"); ok {
				cur.Marker = strings.TrimSpace(strings.TrimSuffix(m, "-->"))
			}
		case cur != nil && trimmed == "```":
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.Text += line + "\n"
		}
		prev = line
	}
	return out
}
