// Command measure reports two figures of the module's production code
// (every .go file but tests, internal/ test tooling and examples): the
// longest functions, and the average length of a comment's sentence in
// words, beside the same average for the standard library's log/slog.
//
// Run it from the module's root: go run ./.ci/measure [-max-func N]
// [-max-ratio R]. With a limit set, it fails when the code is over it.
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"unicode"
)

func main() {
	maxFunc := flag.Int("max-func", 0, "fail when a production function is longer than this many lines (0: report only)")
	maxRatio := flag.Float64("max-ratio", 0, "fail when the comment sentence average is over this many times log/slog's (0: report only)")
	top := flag.Int("top", 10, "how many of the longest functions to list")
	byFile := flag.Bool("files", false, "list each production file's comment sentence average, longest first")
	flag.Parse()

	ours, err := measure(".", production)
	if err != nil {
		fmt.Fprintln(os.Stderr, "measure:", err)
		os.Exit(2)
	}
	slog, err := measure(filepath.Join(runtime.GOROOT(), "src", "log", "slog"), func(path string) bool {
		return !strings.Contains(path, "internal") && !strings.HasSuffix(path, "_test.go")
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "measure:", err)
		os.Exit(2)
	}

	sort.Slice(ours.funcs, func(i, j int) bool { return ours.funcs[i].lines > ours.funcs[j].lines })
	over := 0
	for _, f := range ours.funcs {
		if *maxFunc > 0 && f.lines > *maxFunc || *maxFunc == 0 && f.lines > 80 {
			over++
		}
	}
	limit := *maxFunc
	if limit == 0 {
		limit = 80
	}
	fmt.Printf("production functions: %d; over %d lines: %d\n", len(ours.funcs), limit, over)
	for i, f := range ours.funcs {
		if i == *top {
			break
		}
		fmt.Printf("  %4d  %s\n", f.lines, f.name)
	}
	ratio := ours.average() / slog.average()
	if *byFile {
		sort.Slice(ours.perFile, func(i, j int) bool {
			return ours.perFile[i].excess(slog.average()) > ours.perFile[j].excess(slog.average())
		})
		for _, f := range ours.perFile {
			fmt.Printf("  %5.1f words  %4d sentences  %s\n", float64(f.words)/float64(max(f.sentences, 1)), f.sentences, f.name)
		}
	}
	fmt.Printf("comment sentences: %.1f words on average (%d sentences); log/slog %.1f (%d); ratio %.2fx\n",
		ours.average(), ours.sentences, slog.average(), slog.sentences, ratio)
	fmt.Printf("production lines: %d in %d files\n", ours.lines, ours.files)

	failed := false
	if *maxFunc > 0 && over > 0 {
		fmt.Printf("FAIL: %d function(s) over %d lines\n", over, *maxFunc)
		failed = true
	}
	if *maxRatio > 0 && ratio > *maxRatio {
		fmt.Printf("FAIL: comment sentences %.2fx log/slog's, over %.2fx\n", ratio, *maxRatio)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

// production reports a file of the module's production code.
func production(path string) bool {
	if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
		return false
	}
	for _, part := range strings.Split(filepath.ToSlash(path), "/") {
		switch {
		case part == "internal" && !strings.Contains(path, "idempotency/internal"):
			return false
		case part == "examples", part == "testdata", strings.HasPrefix(part, "."), strings.HasSuffix(part, "test"):
			return false
		}
	}
	return true
}

type fn struct {
	name  string
	lines int
}

// fileProse is one file's comment words and sentences.
type fileProse struct {
	name             string
	words, sentences int
}

// excess is how many words the file has beyond what its sentences would
// hold at 1.2x the given average.
func (f fileProse) excess(avg float64) float64 {
	return float64(f.words) - 1.2*avg*float64(f.sentences)
}

type figures struct {
	funcs            []fn
	perFile          []fileProse
	words, sentences int
	lines, files     int
}

func (f figures) average() float64 { return float64(f.words) / float64(max(f.sentences, 1)) }

func measure(root string, keep func(string) bool) (figures, error) {
	var out figures
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		if !keep(rel) {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		out.files++
		out.lines += fset.File(file.Pos()).LineCount()
		for _, decl := range file.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			name := fd.Name.Name
			if fd.Recv != nil && len(fd.Recv.List) > 0 {
				name = recvName(fd.Recv.List[0].Type) + "." + name
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			out.funcs = append(out.funcs, fn{name: rel + ":" + name, lines: n})
		}
		prose := fileProse{name: rel}
		for _, cg := range file.Comments {
			text := cg.Text()
			if strings.HasPrefix(text, "go:") || strings.Contains(text, "Code generated") {
				continue
			}
			w, s := sentences(text)
			prose.words += w
			prose.sentences += s
		}
		out.words += prose.words
		out.sentences += prose.sentences
		out.perFile = append(out.perFile, prose)
		return nil
	})
	return out, err
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// sentences counts the words and sentences of a comment's prose. A
// sentence ends at '.', '!' or '?' followed by a space or the end, and at
// a blank line. Indented lines (code, lists of values) are not prose.
func sentences(text string) (words, count int) {
	var prose []string
	for _, para := range strings.Split(text, "\n\n") {
		var lines []string
		for _, l := range strings.Split(para, "\n") {
			if strings.HasPrefix(l, "\t") || strings.HasPrefix(l, "    ") {
				continue
			}
			lines = append(lines, l)
		}
		if len(lines) > 0 {
			prose = append(prose, strings.Join(lines, " "))
		}
	}
	for _, p := range prose {
		n := 0
		fields := strings.Fields(p)
		for i, f := range fields {
			if strings.IndexFunc(f, func(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) }) >= 0 {
				n++
			}
			end := strings.TrimRight(f, `)"'`)
			if strings.HasSuffix(end, ".") || strings.HasSuffix(end, "!") || strings.HasSuffix(end, "?") || i == len(fields)-1 {
				if n > 0 {
					words += n
					count++
				}
				n = 0
			}
		}
	}
	return words, count
}
